"""`python -m verl_grpo.trainers.verl.restore`: run by the verl task on every node before main_ppo.

Restores the store's latest complete checkpoint of the run into trainer.default_local_dir and writes verl's
resume tracker (see checkpoints.restore_latest); with `--dataset-uri/--dataset-dir`, also fetches the
prepared dataset when it is not mounted (`sky exec` does not sync file mounts). Settings come from the env
vars of checkpoints.checkpoint_env. Exit codes: 2 user fix, 75 retryable, 1 failure.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from verl_grpo.errors import VerlGrpoError
from verl_grpo.trainers.protocol import exit_code
from verl_grpo.trainers.verl.checkpoints import StoreSettings, fetch_dataset, restore_latest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_grpo.trainers.verl.restore", description=__doc__)
    parser.add_argument("--dataset-uri", help="store URI of the prepared dataset directory")
    parser.add_argument("--dataset-dir", help="where main_ppo reads the dataset's parquet files")
    args = parser.parse_args(argv)
    if bool(args.dataset_uri) != bool(args.dataset_dir):
        parser.error("--dataset-uri and --dataset-dir go together")
    try:
        settings = StoreSettings.from_env()
        if args.dataset_uri:
            if fetch_dataset(settings.uri, settings.endpoint_url, args.dataset_uri, Path(args.dataset_dir)):
                print(f"fetched dataset {args.dataset_uri} into {args.dataset_dir}", flush=True)
        restore_latest(settings)
    except VerlGrpoError as e:
        print(f"verl_restore: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return exit_code(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
