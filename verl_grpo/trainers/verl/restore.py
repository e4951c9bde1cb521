"""`python -m verl_grpo.trainers.verl.restore`: run by the verl task on every node before main_ppo.

Restores the store's latest complete checkpoint of the run into trainer.default_local_dir and writes verl's
resume tracker (`restore_latest`), so `resume_mode=auto` resumes exactly the checkpoint the store verified;
local `global_step_*` dirs the store did not vouch for are removed, never chosen. With
`--dataset-uri/--dataset-dir`, also fetches the prepared dataset when it is not mounted (`sky exec` does not
sync file mounts). Settings come from the env vars of settings.checkpoint_env. Exit codes: 2 user fix,
75 retryable, 1 failure.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.errors import DataError
from verl_grpo.store import Store
from verl_grpo.store_layout import METRICS_FILE, SAMPLES_FILE
from verl_grpo.trainers import local_checkpoints
from verl_grpo.trainers.atomic_files import write_jsonl_atomic
from verl_grpo.trainers.exits import run_entry
from verl_grpo.trainers.verl import reward_metrics
from verl_grpo.trainers.verl.metrics import read_records
from verl_grpo.trainers.verl.samples import dump_steps
from verl_grpo.trainers.verl.settings import STAGING_DIR, TRACKER_FILE, StoreSettings, write_tracker
from verl_grpo.trainers.worker.metrics import read_metrics

RESTORED_LINE = re.compile(r"^restored checkpoint step (\d+) of run ")
"""The log line of a restore (`restore_latest`), read back by the rehearsal's report."""


def restore_latest(settings: StoreSettings, checkpoints: CheckpointStore | None = None,
                   node_rank: int = 0) -> int | None:
    """Make default_local_dir hold exactly the store's latest complete checkpoint; returns its step (None: fresh start).

    Local `global_step_*` dirs other than the restored one are deleted and the tracker is rewritten (or removed),
    so verl's resume_mode=auto can only pick a checkpoint whose every file matched the manifest's sha256.
    On a multi-node run (settings.mount: every node's checkpoint sync uploads to the store) every node restores into
    its own disk, where its ranks read their shards; the head first deletes from the store every step newer than the
    latest committed one, which an attempt that died before committing it left torn.
    """
    checkpoints = checkpoints or CheckpointStore(settings.store())
    if settings.mount and node_rank == 0:
        ref = checkpoints.latest_complete(settings.run_id)
        for step in checkpoints.steps(settings.run_id):
            if step > (ref.step if ref else 0):
                checkpoints.discard(settings.run_id, step)
                print(f"removed uncommitted checkpoint step {step} of run {settings.run_id} from the store", flush=True)
    local = settings.checkpoint_dir
    local.mkdir(parents=True, exist_ok=True)
    # Remove the tracker first: a crash below must leave "start fresh", never a pointer to a half-restored dir.
    (local / TRACKER_FILE).unlink(missing_ok=True)
    shutil.rmtree(local / STAGING_DIR, ignore_errors=True)
    restored = local_checkpoints.restore_latest(checkpoints, settings.run_id, settings.local_checkpoints)
    for step, dump in dump_steps(settings.rollout_dir).items():  # rollouts of steps the restored run has not done
        if restored is None or step > restored[0].step:
            dump.unlink()
    reward_metrics.keep_upto(settings.metrics_dir, restored[0].step if restored else None)
    if restored is None:
        write_jsonl_atomic(settings.history_path, [])
        write_jsonl_atomic(settings.samples_history_path, [])
        print(f"no committed checkpoint of run {settings.run_id}; verl starts from scratch", flush=True)
        return None
    ref, step_dir = restored
    write_jsonl_atomic(settings.history_path, read_records(step_dir / METRICS_FILE))
    write_jsonl_atomic(settings.samples_history_path, read_metrics(step_dir / SAMPLES_FILE))
    write_tracker(local, ref.step)
    print(f"restored checkpoint step {ref.step} of run {settings.run_id} from {ref.uri}", flush=True)
    return ref.step


def fetch_dataset(store_uri: str, endpoint_url: str | None, dataset_uri: str, local_dir: Path,
                  present: str = "*.parquet") -> bool:
    """Download the prepared dataset (or a shipped model) into local_dir unless files matching `present` are there
    (a mount); True if fetched.

    `sky exec` on an existing cluster does not sync file mounts, so the task fetches the data itself.
    """
    local_dir = Path(local_dir)
    if any(local_dir.glob(present)):
        return False
    store = Store(store_uri, endpoint_url)
    if not dataset_uri.startswith(store.uri + "/"):
        raise DataError(f"dataset {dataset_uri} is not under the store {store.uri}; re-run data preparation "
                        "with this storage.uri")
    rel = dataset_uri[len(store.uri) + 1:]
    if not store.exists(rel):
        raise DataError(f"dataset {dataset_uri} is missing from the store and not mounted at {local_dir}; "
                        "re-run data preparation")
    store.get_dir(local_dir, rel)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_grpo.trainers.verl.restore", description=__doc__)
    parser.add_argument("--dataset-uri", help="store URI of the prepared dataset directory")
    parser.add_argument("--dataset-dir", help="where main_ppo reads the dataset's parquet files")
    parser.add_argument("--model-uri", help="store URI of a model shipped with the run (one only on the launcher)")
    parser.add_argument("--model-dir", help="where main_ppo loads that model from")
    args = parser.parse_args(argv)
    if bool(args.dataset_uri) != bool(args.dataset_dir) or bool(args.model_uri) != bool(args.model_dir):
        parser.error("--dataset-uri and --dataset-dir go together, as do --model-uri and --model-dir")

    def restore() -> None:
        settings = StoreSettings.from_env()
        if args.dataset_uri:
            if fetch_dataset(settings.uri, settings.endpoint_url, args.dataset_uri, Path(args.dataset_dir)):
                print(f"fetched dataset {args.dataset_uri} into {args.dataset_dir}", flush=True)
        if args.model_uri:
            if fetch_dataset(settings.uri, settings.endpoint_url, args.model_uri, Path(args.model_dir), "config.json"):
                print(f"fetched model {args.model_uri} into {args.model_dir}", flush=True)
        restore_latest(settings, node_rank=int(os.environ.get("SKYPILOT_NODE_RANK") or 0))

    return run_entry("verl_restore", restore)


if __name__ == "__main__":
    sys.exit(main())
