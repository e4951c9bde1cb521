"""The TRL training process: `python -m verl_grpo.trainers.trl.worker <workdir>/train_spec.json`.

Runs one attempt (`training.run`) and turns its outcome into the worker protocol: exit codes 0 done;
2 ConfigError/DataError (user fix, incl. disk full / permission denied on the work dir); 75 InfraError
(retry resumes); 143 SIGTERM; 1 anything else. Failures also leave `<workdir>/error.json`
({type, message, retryable}) when the work dir is writable.
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

from transformers.utils import logging as hf_logging

from verl_grpo.trainers.trl.training import run
from verl_grpo.trainers.worker.errors import worker_main
from verl_grpo.trainers.worker.spec import load_spec
from verl_grpo.trainers.worker.termination import Termination


def main(argv: list[str] | None = None) -> int:
    hf_logging.disable_progress_bar()
    termination = Termination()
    termination.install()
    return worker_main("verl_grpo.trainers.trl.worker", argv, lambda spec_path: run(load_spec(spec_path), termination))


if __name__ == "__main__":
    sys.exit(main())
