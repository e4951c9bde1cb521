"""The TRL training process: `python -m verl_grpo.trainers.trl.worker <workdir>/train_spec.json`.

Runs one attempt (`training.run`) and turns its outcome into the worker protocol: exit codes 0 done;
2 ConfigError/DataError (user fix, incl. disk full / permission denied on the work dir); 75 InfraError
(retry resumes); 143 SIGTERM; 1 anything else. Failures also leave `<workdir>/error.json`
({type, message, retryable}) when the work dir is writable.
"""

from __future__ import annotations

import os
import shutil
import sys
import traceback
from pathlib import Path

from verl_grpo.privacy import apply_quiet_env

apply_quiet_env()
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from transformers.utils import logging as hf_logging

from verl_grpo.checkpoints import permanent_error
from verl_grpo.errors import ConfigError, DataError, TrainingError, VerlGrpoError
from verl_grpo.trainers.protocol import ERROR_FILE, EXIT_USER_ERROR, RESULT_FILE, exit_code, write_json_atomic
from verl_grpo.trainers.trl.callbacks import Termination
from verl_grpo.trainers.trl.spec import load_spec
from verl_grpo.trainers.trl.training import run


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


def _report(exc: Exception, error_file: Path) -> None:
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m verl_grpo.trainers.trl.worker <workdir>/train_spec.json", file=sys.stderr)
        return EXIT_USER_ERROR
    hf_logging.disable_progress_bar()
    termination = Termination()
    termination.install()
    spec_path = Path(argv[0])
    try:
        for stale in (ERROR_FILE, RESULT_FILE):  # a previous attempt's outcome must not describe this one
            (spec_path.parent / stale).unlink(missing_ok=True)
        spec = load_spec(spec_path)
        run(spec, termination)
        return 0
    except Exception as exc:  # noqa: BLE001 - the process boundary: every failure becomes error.json + exit code
        exc = classify(exc, spec_path.parent)
        _report(exc, spec_path.parent / ERROR_FILE)
        return exit_code(exc)


if __name__ == "__main__":
    sys.exit(main())
