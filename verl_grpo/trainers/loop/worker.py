"""The loop training process: `python -m verl_grpo.trainers.loop.worker <workdir>/train_spec.json`.

Runs one attempt (`training.run`) and keeps the worker protocol of the TRL worker: exit codes 0 done, 2 user fix,
75 retryable, 1 anything else; `error.json` on failure, `result.json` on success.
"""

from __future__ import annotations

import os
import sys

from verl_grpo.privacy import apply_quiet_env
from verl_grpo.trainers.lean_imports import skip_unused_integrations
from verl_grpo.trainers.worker.quiet import no_progress_bars

apply_quiet_env()
no_progress_bars()
skip_unused_integrations()
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from verl_grpo.trainers.worker.errors import worker_main  # noqa: E402
from verl_grpo.trainers.worker.spec import load_spec  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from transformers.utils import logging as hf_logging

    from verl_grpo.trainers.loop.training import run

    hf_logging.disable_progress_bar()
    return worker_main("verl_grpo.trainers.loop.worker", argv, lambda spec_path: run(load_spec(spec_path)))


if __name__ == "__main__":
    sys.exit(main())
