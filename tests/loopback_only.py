"""Record every attempt to reach beyond this machine (Python's socket audit events: a connect or send outside
127.0.0.0/8 and ::1, a lookup of a non-local name), in this process and in every Python subprocess, so a test can
assert that nothing left the host. One recorder: `egress_hook/sitecustomize.py`, which subprocesses load from their
PYTHONPATH; this process uses the same address rules."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

HOOK_DIR = Path(__file__).resolve().parent / "egress_hook"
LOG_ENV = "VERL_GRPO_EGRESS_LOG"


def _load_recorder():
    """The recorder module under its own name (it installs no hook here: LOG_ENV is not set for this import)."""
    spec = importlib.util.spec_from_file_location("egress_recorder", HOOK_DIR / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    saved = os.environ.pop(LOG_ENV, None)
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is not None:
            os.environ[LOG_ENV] = saved
    return module


_recorder = _load_recorder()
_outside: list[str] | None = None
_installed = False


def _hook(event: str, args: tuple) -> None:
    if _outside is None or event not in _recorder._WATCHED:
        return
    target = _recorder._outward(event, args)
    if target is not None:
        _outside.append(f"{event} {target!r}")


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
    """`env` with the recorder first on PYTHONPATH; the JSON-lines log it writes (absent: nothing went out)."""
    log = tmp_path / "egress.jsonl"
    path = os.pathsep.join(p for p in (str(HOOK_DIR), env.get("PYTHONPATH", "")) if p)
    return {**env, "PYTHONPATH": path, LOG_ENV: str(log)}, log
