"""How a worker process turns a failure into the worker protocol (shared by the trl and loop workers): disk-full /
permission trouble becomes a ConfigError naming the path, and every failure leaves one line (or a traceback) on
stderr and `error.json` ({type, message, retryable}) in the work dir."""

from __future__ import annotations

import shutil
import sys
import traceback
from pathlib import Path

from verl_grpo.checkpoints import permanent_error
from verl_grpo.errors import ConfigError, DataError, TrainingError, VerlGrpoError
from verl_grpo.trainers.protocol import write_json_atomic


def classify(exc: Exception, workdir: Path) -> Exception:
    """Disk-full / permission trouble anywhere in the cause chain → a ConfigError naming the path and the fix.

    torch.save reports a full disk as a RuntimeError without errno, so a full work dir disk is checked too.
    """
    if isinstance(exc, VerlGrpoError):
        return exc
    seen: BaseException | None = exc
    while seen is not None:
        found = permanent_error("training", str(workdir), seen) if isinstance(seen, OSError) else None
        if found is not None:
            return found
        seen = seen.__cause__ or seen.__context__
    try:
        free = shutil.disk_usage(workdir).free
    except OSError:
        return exc
    if free < _DISK_FULL_BYTES:
        return ConfigError(
            f"training: the disk holding work dir {workdir} is full ({free} bytes free) — {type(exc).__name__}: "
            f"{exc}; free space there or point the provider's work dir at a bigger disk"
        )
    return exc


_DISK_FULL_BYTES = 1 << 20


def report(exc: Exception, error_file: Path) -> None:
    """A user error, or a TrainingError this package raised on purpose (non-finite loss, no learning signal), is one
    clear line; anything else keeps its traceback. error.json if the dir allows it."""
    if isinstance(exc, (ConfigError, DataError, TrainingError)):
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    else:
        traceback.print_exception(exc, file=sys.stderr)
    error = {"type": type(exc).__name__, "message": str(exc),
             "retryable": isinstance(exc, VerlGrpoError) and exc.retryable}
    try:
        write_json_atomic(error_file, error)
    except OSError as e:
        print(f"(could not write {error_file}: {e.strerror or e})", file=sys.stderr, flush=True)
