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


def run_entry(entry: str, body: Callable[[], None]) -> int:
    """Run a cluster entry point's body; one of our errors ends it with one line on stderr and the exit code that
    says who fixes it (the provider maps the code to a retry or a failure)."""
    try:
        body()
    except VerlGrpoError as e:
        print(f"{entry}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return exit_code(e)
    return 0
