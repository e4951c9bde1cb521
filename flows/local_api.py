"""Prefect for a run started from this machine's command line: its home under the state dir, telemetry off
(verl_grpo.privacy, applied when the flows package is imported), and, when no server is named (PREFECT_API_URL
unset), the ephemeral API started up front so that a failure is one line naming the database and the log, not a
wall of tracebacks from every retry of its start-up.

Call `use_local_prefect()` before anything imports Prefect: Prefect reads these settings at import time.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from verl_grpo.errors import InfraError
from verl_grpo.local_paths import ensure_dir, ensure_state_dir, prefect_home

EPHEMERAL_LOG = "ephemeral-api.log"
EPHEMERAL_START_TIMEOUT_S = "60"



def use_local_prefect() -> None:
    """Prepare Prefect's home and settings; start the ephemeral API unless PREFECT_API_URL names a server."""
    ensure_state_dir()
    home = ensure_dir(prefect_home(), "PREFECT_HOME")
    os.environ["PREFECT_HOME"] = str(home)  # absolute: Prefect and its ephemeral API read it
    # Prefect waits 20 s for its ephemeral API; a machine busy with other work (a test run beside) can need longer.
    # A server that died is reported after this too, so it stays bounded.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", EPHEMERAL_START_TIMEOUT_S)
    if not os.environ.get("PREFECT_API_URL"):
        start_ephemeral_api(home / EPHEMERAL_LOG)


def start_ephemeral_api(log_path: Path) -> None:
    """Start Prefect's ephemeral API server now, its output (and any start-up trace) going to `log_path`.

    Prefect keeps one ephemeral server per process, so the flow's clients reuse this one.
    """
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL

    server = SubprocessASGIServer()
    try:
        with _output_to(log_path):
            server.start()
    except Exception as e:  # Prefect raises RuntimeError on a timeout, httpx errors on a bad health answer
        database = PREFECT_API_DATABASE_CONNECTION_URL.value() or f"sqlite in {log_path.parent}"
        raise InfraError(f"Prefect's ephemeral API did not start ({_last_error(log_path) or type(e).__name__}); "
                         f"database {database}, full log {log_path}. Fix: check that PREFECT_HOME "
                         f"({os.environ.get('PREFECT_HOME')}) is writable and not on a network disk, or point "
                         "PREFECT_API_URL at a running server (`make serve`)") from None


@contextlib.contextmanager
def _output_to(log_path: Path) -> Iterator[None]:
    """Point this process's stdout/stderr file descriptors at `log_path` while a child is spawned: the child
    keeps writing there for its whole life; ours are restored afterwards."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def _last_error(log_path: Path) -> str:
    """The last line of the log that names an error, shortened: the cause, without the trace around it."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line.strip() for line in lines if "Error" in line and not line.startswith(" ")]
    return errors[-1][:300] if errors else ""
