"""Record every attempt to reach a non-loopback address (Python's socket audit events), in this process and in
subprocesses (through a sitecustomize put first on their PYTHONPATH), so a test can assert that nothing left the host."""

from __future__ import annotations

import ipaddress
import os
import sys
from pathlib import Path

EVENTS = ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.sendto")

_SITECUSTOMIZE = '''
import ipaddress, os, sys

def _loopback(host):
    if isinstance(host, bytes):
        host = host.decode()
    if host is None or host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False

def _hook(event, args, _log=os.environ["LOOPBACK_ONLY_LOG"]):
    if event in ("socket.getaddrinfo", "socket.gethostbyname"):
        host = args[0]
    elif event in ("socket.connect", "socket.sendto"):
        address = args[-1]
        if not isinstance(address, tuple):
            return  # a unix socket path
        host = address[0]
    else:
        return
    if not _loopback(host):
        with open(_log, "a") as f:
            f.write(f"{event} {host!r}\\n")

sys.addaudithook(_hook)
'''

_outside: list[str] | None = None


def is_loopback(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode()
    if host is None or host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def _hook(event: str, args: tuple) -> None:
    if _outside is None or event not in EVENTS:
        return
    if event in ("socket.getaddrinfo", "socket.gethostbyname"):
        host = args[0]
    else:
        address = args[-1]
        if not isinstance(address, tuple):
            return
        host = address[0]
    if not is_loopback(host):
        _outside.append(f"{event} {host!r}")


_installed = False


def watch() -> list[str]:
    """Start recording in this process (audit hooks cannot be removed: `stop()` ends the recording)."""
    global _outside, _installed
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True
    _outside = []
    return _outside


def stop() -> None:
    global _outside
    _outside = None


def subprocess_env(tmp_path: Path, env: dict[str, str]) -> tuple[dict[str, str], Path]:
    """`env` with the recording sitecustomize first on PYTHONPATH; the log file it writes to (absent: nothing)."""
    site = tmp_path / "loopback-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    log = tmp_path / "non-loopback.log"
    path = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return {**env, "PYTHONPATH": path, "LOOPBACK_ONLY_LOG": str(log)}, log
