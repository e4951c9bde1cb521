"""How a cluster-side entry or worker process reports its end: exit codes a provider maps to error types without
reading messages (0 done, 2 the user must fix something, 75 a retry resumes from the last checkpoint, 1 any other
failure), and a local worker's `result.json` / `error.json` in its work dir. Imports nothing heavy."""

from __future__ import annotations

import sys
from collections.abc import Callable

from verl_grpo.errors import ConfigError, DataError, InfraError, VerlGrpoError

EXIT_OK, EXIT_FAILED, EXIT_USER_ERROR, EXIT_RETRYABLE = 0, 1, 2, 75
RESULT_FILE = "result.json"
"""A local worker's TrainResult in its work dir: proof of success when the exit code of a reattached process is lost."""
ERROR_FILE = "error.json"
"""A failed local worker's `{type, message, retryable}` in its work dir."""


def exit_code(exc: BaseException) -> int:
    """The exit code a worker reports an error with: 2 user fix, 75 retryable, 1 failure."""
    if isinstance(exc, (ConfigError, DataError)):
        return EXIT_USER_ERROR
    if isinstance(exc, InfraError):
        return EXIT_RETRYABLE
    return EXIT_FAILED


TRANSIENT_ERROR_NAMES = frozenset((
    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
    "ProxyConnectionError", "ClientConnectionError", "ServerDisconnectedError", "ServerTimeoutError"))
"""botocore's / aiohttp's network errors, by class name (neither is imported here): a retry may cure them."""
TRANSIENT_S3_CODES = frozenset(("SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError",
                                "ServiceUnavailable"))


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` or an error it was raised from is network or server-side trouble a retry may cure: a
    connection or timeout error, botocore's network errors, an S3 5xx or throttling reply. Never a bug, a bad input,
    a denied access or a missing file."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return True
        if any(cls.__name__ in TRANSIENT_ERROR_NAMES for cls in type(exc).__mro__):
            return True
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            if status >= 500 or response.get("Error", {}).get("Code") in TRANSIENT_S3_CODES:
                return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


def run_entry(entry: str, body: Callable[[], None]) -> int:
    """Run a cluster entry point's body; one of our errors ends it with one line on stderr and the exit code that
    says who fixes it (SkyPilot recovers EXIT_RETRYABLE without counting it: templates.RECOVER_ON_EXIT_CODES). Any
    other error that is transient (`is_transient`) ends it the same way with EXIT_RETRYABLE; the rest propagate
    (a traceback, exit 1: a bug is not restarted)."""
    try:
        body()
    except VerlGrpoError as e:
        print(f"{entry}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return exit_code(e)
    except Exception as e:
        if not is_transient(e):
            raise
        print(f"{entry}: transient {type(e).__name__}: {e} (exit {EXIT_RETRYABLE}: SkyPilot recovers the task)",
              file=sys.stderr, flush=True)
        return EXIT_RETRYABLE
    return 0
