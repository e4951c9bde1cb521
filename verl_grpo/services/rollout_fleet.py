"""A local rollout fleet: N CPU rollout servers and the router in front of them, as subprocesses on 127.0.0.1.

Each process runs `python -m verl_grpo.services.<module> serve ... --exit-with-parent` on a free port, logs
to `{workdir}/rollout/{name}.log`, and authenticates with the bearer token in `token_file` (a fresh one in
`{workdir}/rollout/token` when none is given; the token never appears on a command line). The servers are up
(model loaded) before the router starts, and the router is up once it has seen every server healthy.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from verl_grpo.privacy import quiet_env
from verl_grpo.procs import stop_process_groups
from verl_grpo.services import DEFAULT_TOKEN_ENV, token_file_env
from verl_grpo.services.spawn import spawn_on_free_port, wait_healthy, write_token

logger = logging.getLogger(__name__)

FLEET_DIR = "rollout"
ROUTER = "rollout-router"
STOP_GRACE_S = 15.0
DEFAULT_STARTUP_TIMEOUT_S = 180.0


@dataclass
class RolloutFleet:
    """Running rollout servers and their router; `stop()` (or leaving the `with` block) ends them all."""

    router_url: str
    worker_urls: list[str]
    pids: dict[str, int]
    """Process name (`rollout-0`, …, `rollout-router`) → pid (each leads its own process group)."""
    logs: dict[str, str]
    token_file: str
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)

    def stop(self) -> None:
        by_pid = {p.pid: p for p in self._procs.values() if p.poll() is None}
        stop_process_groups(list(by_pid), STOP_GRACE_S, lambda pid: by_pid[pid].poll() is None)
        for proc in by_pid.values():
            proc.wait(timeout=5)
        self._procs.clear()

    def __enter__(self) -> "RolloutFleet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def server_command(model_path: str | Path, port: int, token_file: str, threads: int, policy_version: int) -> list[str]:
    return [sys.executable, "-m", "verl_grpo.services.rollout_server", "serve", "--host", "127.0.0.1",
            "--port", str(port), "--token-file", token_file, "--exit-with-parent", "--model", str(model_path),
            "--policy-version", str(policy_version), "--threads", str(threads), "--log-level", "warning"]


def router_command(worker_urls: list[str], port: int, token_file: str) -> list[str]:
    return [sys.executable, "-m", "verl_grpo.services.rollout_router", "serve", "--host", "127.0.0.1",
            "--port", str(port), "--token-file", token_file, "--exit-with-parent", "--workers", ",".join(worker_urls),
            "--log-level", "warning"]


def start_rollout_fleet(model_path: str | Path, n_servers: int, workdir: str | Path, *, threads_per_server: int = 1,
                        token_file: str | Path | None = None, policy_version: int = 0,
                        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S) -> RolloutFleet:
    """Start `n_servers` rollout servers serving `model_path` at `policy_version` and a router in front.

    Raises InfraError naming the log when a process is not healthy within startup_timeout_s (ConfigError when
    one exits with a configuration error); whatever was started is stopped first.
    """
    if n_servers < 1:
        raise ValueError(f"n_servers must be at least 1, not {n_servers}")
    fdir = Path(workdir) / FLEET_DIR
    fdir.mkdir(parents=True, exist_ok=True)
    token = str(token_file) if token_file else str(write_token(fdir / "token"))
    env = {**quiet_env(), **os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": str(threads_per_server), "MKL_NUM_THREADS": str(threads_per_server)}
    env.pop(DEFAULT_TOKEN_ENV, None)
    env.pop(token_file_env(DEFAULT_TOKEN_ENV), None)
    fleet = RolloutFleet(router_url="", worker_urls=[], pids={}, logs={}, token_file=token)
    try:
        servers: dict[str, str] = {}
        for i in range(n_servers):
            name = f"rollout-{i}"
            servers[name] = _start(fleet, name, fdir, env, lambda port: server_command(
                model_path, port, token, threads_per_server, policy_version))
        fleet.worker_urls = list(servers.values())
        wait_healthy(servers, fleet.pids, fleet.logs, startup_timeout_s, "raise startup_timeout_s")
        fleet.router_url = _start(fleet, ROUTER, fdir, env, lambda port: router_command(fleet.worker_urls, port, token))
        wait_healthy({ROUTER: fleet.router_url}, fleet.pids, fleet.logs, startup_timeout_s,
                     "raise startup_timeout_s", ready=_router_ready)
    except BaseException:
        fleet.stop()
        raise
    logger.info("rollout fleet up: router %s, workers %s (logs in %s)", fleet.router_url, fleet.worker_urls, fdir)
    return fleet


def _router_ready(response) -> bool:
    """The router answers and has seen every server healthy."""
    try:
        return response.status_code == 200 and response.json().get("status") == "ok"
    except ValueError:
        return False


def _start(fleet: RolloutFleet, name: str, fdir: Path, env: dict[str, str], command_for) -> str:
    log_path = fdir / f"{name}.log"
    port, proc, _ = spawn_on_free_port(name, command_for, env, fdir, log_path)
    fleet._procs[name] = proc
    fleet.pids[name] = proc.pid
    fleet.logs[name] = str(log_path)
    return f"http://127.0.0.1:{port}"
