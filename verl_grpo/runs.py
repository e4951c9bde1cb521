"""Run identity and bookkeeping in the store: `runs/{run_id}/run.json` and the resolved `config.yaml`.

Passing the same run_id again resumes that run, and only that run: a run id the store has no record of fails
(RunNotFound) instead of starting over. Without one, an unfinished run with the same resolved config is resumed
(so re-running a killed `verl-grpo run` continues it); otherwise a new id is made. `fresh` starts a new run.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timezone
from typing import Any, Literal

from verl_grpo.config import RunConfig
from verl_grpo.errors import ConfigError, RunNotFound
from verl_grpo.models import model_short_name
from verl_grpo.store import Store
from verl_grpo.store_layout import RUNS, run_config, run_record

RunStatus = Literal["running", "completed", "failed"]
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def run_name(cfg: RunConfig, when: datetime | None = None) -> str:
    """`{task}-{model-short}-{yyyymmdd-HHMM}` (UTC), e.g. gsm8k-smollm2-135m-20261122-0200 (the task: dataset.task,
    else the dataset's name)."""
    when = when or datetime.now(timezone.utc)
    return f"{cfg.task}-{model_short_name(cfg.model.name)}-{when:%Y%m%d-%H%M}"


def new_run_id(cfg: RunConfig, store: Store) -> str:
    base = run_name(cfg)
    candidate, n = base, 1
    while store.exists(run_record(candidate)):
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def validate_run_id(run_id: str) -> str:
    if not _RUN_ID.match(run_id):
        raise ConfigError(f"run_id {run_id!r} must be 1-128 chars of letters, digits, '.', '_' or '-'")
    return run_id


def read_run(store: Store, run_id: str) -> dict[str, Any] | None:
    try:
        return json.loads(store.read_text(run_record(run_id)))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def find_resumable(store: Store, cfg: RunConfig) -> str | None:
    """The newest unfinished run whose resolved config equals cfg's."""
    digest = cfg.digest()
    candidates = []
    for run_id in store.listdir(RUNS):
        record = read_run(store, run_id)
        if record and record.get("config_digest") == digest and record.get("status") != "completed":
            candidates.append((record.get("created_at", 0), run_id))
    return max(candidates)[1] if candidates else None


def begin_run(store: Store, cfg: RunConfig, run_id: str | None, *, fresh: bool = False) -> tuple[str, bool]:
    """Pick the run id, store the resolved config and mark the run running. Returns (run_id, resumed).

    - run_id given: resume that run; its record must be in `store` (a resume never silently starts over);
    - run_id and fresh: start a new run under that id, which must not exist yet;
    - neither: resume the newest unfinished run with the same config, else start a new one;
    - fresh alone: start a new run.
    """
    if run_id:
        resumed = checked_run_id(store, cfg, run_id, fresh=fresh) is not None
    else:
        run_id = None if fresh else find_resumable(store, cfg)
        resumed = run_id is not None
        run_id = run_id or new_run_id(cfg, store)
    record = read_run(store, run_id) or {"run_id": run_id, "config_digest": cfg.digest(), "created_at": time.time()}
    store.write_text(cfg.to_yaml(), run_config(run_id))
    mark_run(store, run_id, "running", record)
    return run_id, resumed


def checked_run_id(store: Store, cfg: RunConfig, run_id: str, *, fresh: bool = False) -> dict[str, Any] | None:
    """The record of the run `run_id` names, checked for what begin_run is asked to do with it (None: a new run);
    one ConfigError when the id is malformed, unknown (RunNotFound) without fresh, taken with fresh, or a run
    of another config."""
    validate_run_id(run_id)
    existing = read_run(store, run_id)
    if fresh and existing is not None:
        raise ConfigError(f"run_id {run_id!r} already exists in {store.url(run_record(run_id))}; resume it "
                          "without fresh (--fresh), or pick a new run_id")
    if not fresh and existing is None:
        where = store.url(run_record(run_id))
        if store.exists(run_record(run_id)):
            raise ConfigError(f"run_id {run_id!r}: its record {where} is unreadable; repair or remove it, or start "
                              "a new run (no run_id, or fresh / --fresh)")
        raise RunNotFound(f"run_id {run_id!r}: no such run in the store {store.uri} (no {where}); check the run "
                          "id, or point storage.uri / VERL_GRPO_HOME at the store the run lives in, or start a new "
                          "run (no run_id, or fresh / --fresh)")
    if existing and existing.get("config_digest") != cfg.digest():
        raise ConfigError(
            f"run_id {run_id!r} exists with a different config (digest {existing.get('config_digest')} vs "
            f"{cfg.digest()}); resume it with its own config ({run_config(run_id)}) or pick a new run_id"
        )
    return existing


def mark_run(store: Store, run_id: str, status: RunStatus, record: dict[str, Any] | None = None, **extra: Any) -> None:
    record = dict(record or read_run(store, run_id) or {"run_id": run_id})
    record.update(extra, status=status, updated_at=time.time())
    store.write_text(json.dumps(record, indent=1), run_record(run_id))


def mark_training_started(store: Store, run_id: str) -> None:
    """Record when training of `run_id` first started; a resumed or retried training keeps the first time."""
    record = read_run(store, run_id) or {"run_id": run_id}
    if "training_started_at" not in record:
        record["training_started_at"] = time.time()
        store.write_text(json.dumps(record, indent=1), run_record(run_id))


def training_started_at(store: Store, run_id: str) -> float | None:
    """Unix time training of `run_id` first started; a run record without it gives its creation time."""
    record = read_run(store, run_id) or {}
    return record.get("training_started_at", record.get("created_at"))
