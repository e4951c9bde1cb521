"""`python -m verl_grpo.trainers.verl.finalize --backend fsdp`: run by the verl task on the head after main_ppo.

Commits the final checkpoint if its background upload did not finish, merges the final actor to an HF model
with `verl.model_merger`, uploads it to `runs/{run_id}/model`, and writes `runs/{run_id}/metrics.jsonl` and
`runs/{run_id}/train_result.json` (see checkpoints.finalize). Exit codes: 2 user fix, 75 retryable, 1 failure.
"""

from __future__ import annotations

import argparse
import sys

from verl_grpo.errors import VerlGrpoError
from verl_grpo.trainers.protocol import exit_code
from verl_grpo.trainers.verl.checkpoints import MERGE_BACKENDS, StoreSettings, finalize


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_grpo.trainers.verl.finalize", description=__doc__)
    parser.add_argument("--backend", choices=sorted(MERGE_BACKENDS), default="fsdp",
                        help="verl.strategy of the run (selects the model_merger backend)")
    parser.add_argument("--train-batch-size", type=int, default=None,
                        help="prompts per step, recorded as the data position of a checkpoint committed here")
    args = parser.parse_args(argv)
    try:
        finalize(StoreSettings.from_env(), backend=args.backend, train_batch_size=args.train_batch_size)
    except VerlGrpoError as e:
        print(f"verl_finalize: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return exit_code(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
