"""How a worker process turns a failure into the worker protocol (shared by the trl and loop workers): disk-full /
permission trouble becomes a ConfigError naming the path, and every failure leaves one line (or a traceback) on
stderr and `error.json` ({type, message, retryable}) in the work dir."""

from __future__ import annotations

import os
import shutil
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from verl_grpo.checkpoints import permanent_error
from verl_grpo.errors import ConfigError, DataError, InfraError, TrainingError, VerlGrpoError
from verl_grpo.trainers.atomic_files import write_json_atomic
from verl_grpo.trainers.exits import ERROR_FILE, EXIT_USER_ERROR, RESULT_FILE, exit_code


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


def check_workdir(workdir: Path) -> None:
    """Fail at once, naming the path and the fix, when the work dir cannot be written (not at the first save)."""
    probe = workdir / f".write-probe-{os.getpid()}"
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise permanent_error(f"work dir {workdir}", str(workdir), e) or InfraError(
            f"work dir {workdir} is not usable ({e}); check the disk it lives on") from e


def worker_main(module: str, argv: list[str] | None, attempt: Callable[[Path], object]) -> int:
    """A worker process's `main`: `python -m <module> <workdir>/train_spec.json` runs `attempt(spec_path)` and turns
    its outcome into the worker protocol (exit code, `error.json`); a previous attempt's result/error files are
    removed first, so they never describe this one."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"usage: python -m {module} <workdir>/train_spec.json", file=sys.stderr)
        return EXIT_USER_ERROR
    spec_path = Path(argv[0])
    try:
        for stale in (ERROR_FILE, RESULT_FILE):
            (spec_path.parent / stale).unlink(missing_ok=True)
        attempt(spec_path)
        return 0
    except Exception as exc:  # noqa: BLE001 - the process boundary: every failure becomes error.json + exit code
        exc = classify(exc, spec_path.parent)
        report(exc, spec_path.parent / ERROR_FILE)
        return exit_code(exc)
