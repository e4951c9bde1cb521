"""`python -m verl_grpo.trainers.verl.finalize --backend fsdp`: run by the verl task on the head after main_ppo.

Commits the final checkpoint if its background upload did not finish, merges the final actor to an HF model
with `verl.model_merger`, uploads it to `runs/{run_id}/model`, and writes `runs/{run_id}/metrics.jsonl` and
`runs/{run_id}/train_result.json` (`finalize`). Exit codes: 2 user fix, 75 retryable, 1 failure.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.contracts import TrainResult
from verl_grpo.errors import TrainingError
from verl_grpo.store_layout import (
    METRICS_FILE,
    SAMPLES_FILE,
    model_dir,
    run_metrics,
    run_samples,
    step_dir_name,
    train_result,
)
from verl_grpo.trainers.atomic_files import write_jsonl_atomic
from verl_grpo.trainers.exits import run_entry
from verl_grpo.trainers.run_summary import summarize
from verl_grpo.trainers.verl.commit import commit_now
from verl_grpo.trainers.verl.merge import MERGE_BACKENDS, merge_actor
from verl_grpo.trainers.verl.metrics import SUMMARY, merged_metrics
from verl_grpo.trainers.verl.settings import TRACKER_FILE, StoreSettings, read_tracker


def finalize(settings: StoreSettings, backend: str = "fsdp", train_batch_size: int | None = None,
             checkpoints: CheckpointStore | None = None,
             run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> TrainResult:
    """Commit the final step if needed, merge and upload the model, write metrics.jsonl and train_result.json."""
    store = settings.store()
    checkpoints = checkpoints or CheckpointStore(store)
    final_step = read_tracker(settings.checkpoint_dir)
    if final_step is None:
        raise TrainingError(f"verl left no {TRACKER_FILE} in {settings.checkpoint_dir}; it saved no checkpoint "
                            "(trainer.save_freq must be > 0) or did not finish")
    ref = checkpoints.latest_complete(settings.run_id)
    if ref is None or ref.step < final_step:
        ref = commit_now(settings, final_step, train_batch_size, checkpoints)
    step_dir = settings.checkpoint_dir / step_dir_name(final_step)
    if settings.mount:
        # Each node's ranks saved their shards on that node's own disk; only the store holds them all (the nodes'
        # checkpoint syncs uploaded them, the commit checked). verl's merger reads every rank's model shard from one
        # dir, so the head fetches those it lacks; optimizer and RNG shards are not merged and stay in the store.
        checkpoints.restore(ref, step_dir, only=merger_input)
    merged = merge_actor(step_dir / "actor", settings.checkpoint_dir.parent / f"{settings.checkpoint_dir.name}-model",
                         backend, run)
    store.rm(model_dir(settings.run_id))
    model_uri = store.put_dir(merged, model_dir(settings.run_id))
    records = merged_metrics(settings)
    local_metrics = write_jsonl_atomic(settings.metrics_dir / METRICS_FILE, records)
    metrics_uri = store.put_file(local_metrics, run_metrics(settings.run_id))
    if samples := settings.merged_samples():
        store.put_file(write_jsonl_atomic(settings.metrics_dir / SAMPLES_FILE, samples), run_samples(settings.run_id))
    result = TrainResult(run_id=settings.run_id, final_step=final_step, checkpoint=ref, model_uri=model_uri,
                         metrics_uri=metrics_uri, summary=summarize(records, SUMMARY))
    store.write_text(result.model_dump_json(indent=1), train_result(settings.run_id))
    print(f"training done: step {final_step}, model at {model_uri}", flush=True)
    return result


def merger_input(path: str) -> bool:
    """Whether verl's model merger reads this file of a step dir: the actor's model shards of every rank, its
    fsdp_config.json (world size) and huggingface/ (config, tokenizer); verl/model_merger/fsdp_model_merger.py."""
    name = path.rsplit("/", 1)[-1]
    return path.startswith("actor/") and (name.startswith("model_world_size_") or name == "fsdp_config.json"
                                          or path.startswith("actor/huggingface/"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_grpo.trainers.verl.finalize", description=__doc__)
    parser.add_argument("--backend", choices=sorted(MERGE_BACKENDS), default="fsdp",
                        help="verl.strategy of the run (selects the model_merger backend)")
    parser.add_argument("--train-batch-size", type=int, default=None,
                        help="prompts per step, recorded as the data position of a checkpoint committed here")
    args = parser.parse_args(argv)
    return run_entry("verl_finalize", lambda: finalize(StoreSettings.from_env(), backend=args.backend,
                                                       train_batch_size=args.train_batch_size))


if __name__ == "__main__":
    sys.exit(main())
