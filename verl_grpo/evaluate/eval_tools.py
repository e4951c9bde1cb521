"""The tools of an evaluation on this machine: the run's own tools, offered to every model the run evaluates.

With `retrieval` in services.enabled the model trained with the `search` tool, so it is evaluated with it too (and
the base and warm-start models with it, so the comparison is like for like). The run's retrieval-server stops with
its training; the evaluation starts one of its own from the same settings (the index comes back from the store,
`retrieval/<index>/`), once per process and index, shared by every model evaluated in the process. It runs with
`--exit-with-parent`, so it ends with the process; `stop_eval_services` ends it sooner. A run whose tool asks a
retriever already serving (services.retrieval.url) is evaluated against that retriever: nothing is started.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import threading
from collections.abc import Callable
from pathlib import Path

from verl_grpo.config import RunConfig
from verl_grpo.config.search import uses_search
from verl_grpo.local_paths import state_dir
from verl_grpo.trainers.trl.tools import tool_functions

EVAL_SERVICES_DIR = "eval-services"
"""Under the state dir's work/: one directory per retrieval setting, holding the eval's retrieval-server."""

_lock = threading.Lock()
_running: dict[str, tuple[Path, str, str]] = {}
"""Settings key → (work dir, URL, token) of the retrieval-servers this process started."""


def tool_names(cfg: RunConfig) -> list[str]:
    """What the eval offers the model (part of the eval settings key: results with and without tools differ)."""
    return ["search"] if uses_search(cfg) else []


def eval_tools(cfg: RunConfig) -> list[Callable[..., str]]:
    """The run's tools, answered by services of this process's own (started on first use), or by the retriever at
    services.retrieval.url, which outlives the run, as in training; [] without retrieval."""
    if not uses_search(cfg):
        return []
    if cfg.services.retrieval.url:
        return tool_functions(cfg)
    from verl_grpo.services.search import bound_search

    url, token = _retrieval_server(cfg)
    return [bound_search(cfg.services.retrieval.max_result_chars, url, token)]


def stop_eval_services() -> None:
    """Stop every retrieval-server this process started for evaluations (none started: nothing is imported, so an
    eval node without the services' packages can call it)."""
    with _lock:
        if not _running:
            return
        from verl_grpo.services.local_group import stop_local_services

        for workdir, _, _ in _running.values():
            stop_local_services(workdir, delay_s=0)
        _running.clear()


def _retrieval_server(cfg: RunConfig) -> tuple[str, str]:
    from verl_grpo.services import SERVICES
    from verl_grpo.services.local_group import start_local_services

    settings = cfg.services.retrieval.model_dump(mode="json")
    key = json.dumps({"retrieval": settings, "store": cfg.storage.uri}, sort_keys=True)
    with _lock:
        if key not in _running:
            workdir = state_dir() / "work" / EVAL_SERVICES_DIR / hashlib.sha256(key.encode()).hexdigest()[:12]
            only = cfg.model_copy(deep=True)
            only.services.enabled = ["retrieval"]
            group = start_local_services(only, "eval", workdir)
            if not _running:
                atexit.register(stop_eval_services)
            _running[key] = (workdir, group.endpoints[SERVICES["retrieval"].task],
                             Path(group.token_file).read_text().strip())
        _, url, token = _running[key]
    return url, token
