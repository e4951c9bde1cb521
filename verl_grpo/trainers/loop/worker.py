"""The loop training process: `python -m verl_grpo.trainers.loop.worker <workdir>/train_spec.json`.

Runs one attempt (`training.run`) and keeps the worker protocol of the TRL worker: exit codes 0 done, 2 user fix,
75 retryable, 1 anything else; `error.json` on failure, `result.json` on success.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from verl_grpo.privacy import apply_quiet_env

apply_quiet_env()
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from verl_grpo.trainers.protocol import ERROR_FILE, EXIT_USER_ERROR, RESULT_FILE, exit_code  # noqa: E402
from verl_grpo.trainers.trl.spec import load_spec  # noqa: E402
from verl_grpo.trainers.worker_errors import classify, report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m verl_grpo.trainers.loop.worker <workdir>/train_spec.json", file=sys.stderr)
        return EXIT_USER_ERROR
    from transformers.utils import logging as hf_logging

    from verl_grpo.trainers.loop.training import run

    hf_logging.disable_progress_bar()
    spec_path = Path(argv[0])
    try:
        for stale in (ERROR_FILE, RESULT_FILE):
            (spec_path.parent / stale).unlink(missing_ok=True)
        run(load_spec(spec_path))
        return 0
    except Exception as exc:  # noqa: BLE001 - the process boundary: every failure becomes error.json + exit code
        exc = classify(exc, spec_path.parent)
        report(exc, spec_path.parent / ERROR_FILE)
        return exit_code(exc)


if __name__ == "__main__":
    sys.exit(main())
