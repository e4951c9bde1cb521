"""Process helpers shared by everything that starts local processes (training jobs, services)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: the child is killed when the process that started it dies (no orphans racing a re-run)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie (exited, not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def runs_command(pid: int, command: list[str] | None) -> bool:
    """Alive and still running `command` (a recycled pid belongs to someone else)."""
    if not command or not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[: len(command)] == [c.encode() for c in command]
    except OSError:
        return False


def signal_group(pid: int, sig: int) -> None:
    """Signal the process group led by `pid`; a group already gone is fine."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_process_groups(pids: Iterable[int], grace_s: float, is_running: Callable[[int], bool] = pid_alive,
                        poll_s: float = 0.1) -> list[int]:
    """SIGTERM each process group led by `pids`, wait up to `grace_s` for all of them to end, SIGKILL the rest.

    SIGTERM first lets a trainer finish its checkpoint upload and a server drain its requests; the SIGKILL
    bounds how long a stop can take. One grace period covers all the groups, so stopping n of them takes
    grace_s at most, not n × grace_s. `is_running` decides whether a leader still runs (a caller that
    started the process passes one that also reaps it). Returns the pids that had to be SIGKILLed.
    """
    pids = list(pids)
    for pid in pids:
        signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(is_running(pid) for pid in pids):
        time.sleep(poll_s)
    killed = [pid for pid in pids if is_running(pid)]
    for pid in killed:
        signal_group(pid, signal.SIGKILL)
    return killed


def stop_process_group(pid: int, grace_s: float, is_running: Callable[[int], bool] = pid_alive,
                       poll_s: float = 0.1) -> bool:
    """`stop_process_groups` for one group; True when it had to be SIGKILLed."""
    return bool(stop_process_groups([pid], grace_s, is_running, poll_s))


def kill_piped_worker(proc: subprocess.Popen) -> None:
    """SIGKILL a worker started in its own session with stdin/stdout pipes, reap it and close its pipes (a worker
    past its deadline: what it was doing is abandoned)."""
    signal_group(proc.pid, signal.SIGKILL)
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass
