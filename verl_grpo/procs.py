"""Process helpers shared by everything that starts local processes (training jobs, services)."""

from __future__ import annotations

import ctypes
import os
import signal

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
