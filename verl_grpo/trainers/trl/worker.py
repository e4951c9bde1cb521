"""The TRL training process: `python -m verl_grpo.trainers.trl.worker <workdir>/train_spec.json`.

Runs one attempt (`training.run`) and turns its outcome into the worker protocol: exit codes 0 done;
2 ConfigError/DataError (user fix, incl. disk full / permission denied on the work dir); 75 InfraError
(retry resumes); 143 SIGTERM; 1 anything else. Failures also leave `<workdir>/error.json`
({type, message, retryable}) when the work dir is writable.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from verl_grpo.privacy import apply_quiet_env

apply_quiet_env()
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from transformers.utils import logging as hf_logging

from verl_grpo.trainers.protocol import ERROR_FILE, EXIT_USER_ERROR, RESULT_FILE, exit_code
from verl_grpo.trainers.trl.callbacks import Termination
from verl_grpo.trainers.trl.spec import load_spec
from verl_grpo.trainers.trl.training import run
from verl_grpo.trainers.worker_errors import classify, report


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
        report(exc, spec_path.parent / ERROR_FILE)
        return exit_code(exc)


if __name__ == "__main__":
    sys.exit(main())
