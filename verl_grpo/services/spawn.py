"""Starting local service processes: a free 127.0.0.1 port, a log file, a health wait that names the log.

Shared by the local job group (local_group.py) and the CPU rollout fleet (rollout_fleet.py).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn

import httpx

from verl_grpo.errors import ConfigError, InfraError
from verl_grpo.procs import pid_alive
from verl_grpo.retry import Backoff

PORT_RETRIES = 3


class PortTaken(Exception):
    """Another process took the port between probing and binding; a start on a fresh port cures it."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_on_free_port(task: str, command_for: Callable[[int], list[str]], env: Mapping[str, str], cwd: Path,
                       log_path: Path) -> tuple[int, subprocess.Popen, list[str]]:
    """Start `command_for(port)` on a port free a moment ago, in its own session, output appended to `log_path`.

    A start that lost its port to a race is retried on a fresh one (PORT_RETRIES tries, then InfraError).
    """
    policy = Backoff(attempts=PORT_RETRIES, backoff_s=0, retry_on=lambda e: isinstance(e, PortTaken),
                     give_up=lambda _: _no_free_port(task))
    return policy.call(_spawn_once, command_for, env, cwd, log_path)


def _spawn_once(command_for: Callable[[int], list[str]], env: Mapping[str, str], cwd: Path,
                log_path: Path) -> tuple[int, subprocess.Popen, list[str]]:
    port = free_port()
    cmd = command_for(port)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, env=dict(env), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=cwd, start_new_session=True)
    time.sleep(0.05)
    if proc.poll() is not None and b"address already in use" in log_path.read_bytes()[-2000:].lower():
        raise PortTaken(port)
    return port, proc, cmd


def _no_free_port(task: str) -> NoReturn:
    raise InfraError(f"{task} could not bind a free port on 127.0.0.1 after {PORT_RETRIES} tries")


def wait_healthy(endpoints: Mapping[str, str], pids: Mapping[str, int], logs: Mapping[str, str], timeout_s: float,
                 fix: str, ready: Callable[[httpx.Response], bool] = lambda r: r.status_code == 200) -> None:
    """Poll each task's `{url}/health` until `ready`; InfraError naming the logs after `timeout_s` (`fix` says what
    to raise), ConfigError (exit code 2) or InfraError with the log tail when a process exits first."""
    deadline = time.monotonic() + timeout_s
    pending = dict(endpoints)
    with httpx.Client(timeout=2.0) as http:
        while pending:
            for task, url in list(pending.items()):
                code = exit_code(pids[task])
                if code is not None:
                    error = ConfigError if code == 2 else InfraError
                    raise error(f"{task} exited with code {code} during start-up; log {logs[task]}:\n"
                                f"{tail(Path(logs[task]))}")
                try:
                    if ready(http.get(f"{url}/health")):
                        del pending[task]
                except httpx.TransportError:
                    pass
            if pending and time.monotonic() > deadline:
                raise InfraError(f"{', '.join(pending)} not healthy after {timeout_s:.0f}s; see "
                                 f"{', '.join(logs[t] for t in pending)} ({fix})")
            if pending:
                time.sleep(0.25)


def exit_code(pid: int) -> int | None:
    """The exit code of our child `pid` once it ended (reaping it), None while it runs; -1 if not our child."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None if pid_alive(pid) else -1
    if done == 0:
        return None
    return os.waitstatus_to_exitcode(status)


def write_token(path: Path) -> Path:
    """A fresh random bearer token in `path`, readable by this user only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32))
    os.chmod(path, 0o600)
    return path


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
