"""The local job group: the enabled services as subprocesses on 127.0.0.1 beside a local training run.

`start_local_services` starts each enabled service (`python -m <module> serve` on a free port, logs in
`{workdir}/services/{task}.log`), waits until each answers /health, and returns the endpoints and the env
the trainer needs — the same `VERL_GRPO_<TASK>_URL` variables the SkyPilot job group exports, plus
`<token_env>_FILE` naming a fresh per-run token file (mode 0600; the token never appears on a command line).
`stop_local_services` stops them `termination_delay_s` later. A second start for the same work dir reuses
live, healthy services (a retried provision step does not start duplicates).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from verl_grpo.config import RunConfig
from verl_grpo.privacy import quiet_env
from verl_grpo.procs import runs_command, stop_process_groups
from verl_grpo.services import SERVICES, token_env_exports, token_file_env
from verl_grpo.services.commands import service_settings_args
from verl_grpo.services.spawn import exit_code, spawn_on_free_port, wait_healthy, write_token
from verl_grpo.services.state import STORE_ENDPOINT_ENV, STORE_URI_ENV

logger = logging.getLogger(__name__)

SERVICES_DIR = "services"
RECORD_FILE = "services.json"
TOKEN_FILE = "token"
STOP_GRACE_S = 15.0


@dataclass
class ServiceGroup:
    """Running local services: task → URL, the env for the trainer, and what is needed to stop them."""

    endpoints: dict[str, str]
    env: dict[str, str]
    pids: dict[str, int]
    commands: dict[str, list[str]]
    logs: dict[str, str]
    termination_delay_s: float
    token_file: str
    extra: dict[str, str] = field(default_factory=dict)


def service_command(name: str, cfg: RunConfig, port: int, run_id: str, dataset_uri: str | None = None) -> list[str]:
    """The `serve` command of service `name` with the run's settings (no secrets on it)."""
    return [sys.executable, "-m", SERVICES[name].module, "serve", "--host", "127.0.0.1", "--port", str(port),
            "--exit-with-parent", *service_settings_args(name, cfg, run_id, dataset_uri)]


def start_local_services(cfg: RunConfig, run_id: str, workdir: str | Path,
                         dataset_uri: str | None = None) -> ServiceGroup | None:
    """Start (or reuse) the services the run starts (cfg.services.started: the enabled ones, less a retriever already
    serving at services.retrieval.url); None when there are none.

    Raises InfraError (retryable) when a service does not become healthy within startup_timeout_s, and
    ConfigError when one exits with a configuration error; whatever was started is stopped first.
    """
    started = cfg.services.started
    if not started:
        return None
    sdir = Path(workdir) / SERVICES_DIR
    sdir.mkdir(parents=True, exist_ok=True)
    existing = _read_record(Path(workdir))
    if existing is not None and set(existing.endpoints) == {SERVICES[n].task for n in started} \
            and _all_alive(existing) and _all_healthy(existing):
        logger.info("reusing running services %s", existing.endpoints)
        return existing
    if existing is not None:
        _terminate(existing)
    token_file = write_token(sdir / TOKEN_FILE)
    env = {**quiet_env(), **os.environ, token_file_env(cfg.services.token_env): str(token_file),
           "HF_HUB_OFFLINE": "1", STORE_URI_ENV: cfg.storage.uri, "PYTHONUNBUFFERED": "1"}
    env.pop(cfg.services.token_env, None)
    if cfg.storage.endpoint_url:
        env[STORE_ENDPOINT_ENV] = cfg.storage.endpoint_url
    group = ServiceGroup(endpoints={}, env={token_file_env(cfg.services.token_env): str(token_file),
                                            **token_env_exports(cfg.services.token_env)}, pids={},
                         commands={}, logs={}, termination_delay_s=cfg.services.termination_delay_s,
                         token_file=str(token_file))
    try:
        for name in started:
            _start_one(name, cfg, run_id, sdir, env, group, dataset_uri)
        _write_record(Path(workdir), group)
        _wait_ready(group, cfg.services.startup_timeout_s)
    except BaseException:
        _terminate(group)
        _remove_record(Path(workdir))
        raise
    logger.info("services up: %s (logs in %s)", group.endpoints, sdir)
    return group


def stop_local_services(workdir: str | Path, delay_s: float | None = None) -> None:
    """Stop the work dir's services after `delay_s` (default: the group's termination_delay_s)."""
    group = _read_record(Path(workdir))
    if group is None:
        return
    delay = group.termination_delay_s if delay_s is None else delay_s
    if delay > 0 and _all_alive(group):
        logger.info("stopping services in %.0fs", delay)
        time.sleep(delay)
    _terminate(group)
    _remove_record(Path(workdir))


def services_env(workdir: str | Path) -> dict[str, str]:
    """The env of the running services of a work dir (URLs + token file), empty when none run."""
    group = _read_record(Path(workdir))
    return dict(group.env) if group else {}


def _start_one(name: str, cfg: RunConfig, run_id: str, sdir: Path, env: dict[str, str], group: ServiceGroup,
               dataset_uri: str | None) -> None:
    spec = SERVICES[name]
    log_path = sdir / f"{spec.task}.log"
    port, proc, cmd = spawn_on_free_port(spec.task, lambda p: service_command(name, cfg, p, run_id, dataset_uri),
                                         env, sdir, log_path)
    url = f"http://127.0.0.1:{port}"
    group.endpoints[spec.task] = url
    group.env[spec.url_env] = url
    group.pids[spec.task] = proc.pid
    group.commands[spec.task] = cmd
    group.logs[spec.task] = str(log_path)


def _wait_ready(group: ServiceGroup, timeout_s: float) -> None:
    wait_healthy(group.endpoints, group.pids, group.logs, timeout_s, "raise services.startup_timeout_s")


def _terminate(group: ServiceGroup) -> None:
    live = [pid for task, pid in group.pids.items() if runs_command(pid, group.commands.get(task))]
    for pid in stop_process_groups(live, STOP_GRACE_S, lambda pid: exit_code(pid) is None):
        exit_code(pid)


def _all_alive(group: ServiceGroup) -> bool:
    return all(runs_command(pid, group.commands.get(task)) for task, pid in group.pids.items())


def _all_healthy(group: ServiceGroup) -> bool:
    try:
        with httpx.Client(timeout=2.0) as http:
            return all(http.get(f"{url}/health").status_code == 200 for url in group.endpoints.values())
    except httpx.TransportError:
        return False


def _record_path(workdir: Path) -> Path:
    return workdir / SERVICES_DIR / RECORD_FILE


def _write_record(workdir: Path, group: ServiceGroup) -> None:
    _record_path(workdir).write_text(json.dumps(asdict(group), indent=2))


def _read_record(workdir: Path) -> ServiceGroup | None:
    try:
        return ServiceGroup(**json.loads(_record_path(workdir).read_text()))
    except (OSError, json.JSONDecodeError, TypeError):
        return None


def _remove_record(workdir: Path) -> None:
    _record_path(workdir).unlink(missing_ok=True)
