"""One attempt of a TRL run: resume from the store, train, publish the model, metrics and TrainResult.

1. Restores the newest committed checkpoint of the run from the store (if any) and resumes from it:
   model, optimizer, scheduler, RNG and data position, so the run continues with the next unseen prompts.
2. Trains with TRL's GRPOTrainer on the prepared train split, committing a checkpoint to the store every
   `save_freq` steps (and at the end), with metrics.jsonl and samples.jsonl inside it. Uploads run in the
   background; the final checkpoint is committed before the run reports success. A checkpoint a crashed attempt
   staged but did not upload (`<workdir>/pending_uploads`) is committed by the next attempt before it resumes.
3. Saves the final HF model to `runs/{run_id}/model`, metrics and samples to `runs/{run_id}/metrics.jsonl` and
   `samples.jsonl`, and the TrainResult to `<workdir>/result.json` and `runs/{run_id}/train_result.json`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from transformers import PrinterCallback

from verl_grpo.checkpoints import BackgroundSaver, CheckpointStore
from verl_grpo.contracts import CheckpointRef, TrainResult
from verl_grpo.errors import DataError
from verl_grpo.store import Store
from verl_grpo.store_layout import model_dir, train_result
from verl_grpo.trainers.atomic_files import write_json_atomic
from verl_grpo.trainers.exits import RESULT_FILE
from verl_grpo.trainers.local_checkpoints import LocalCheckpoints, restore_latest
from verl_grpo.trainers.run_summary import SummaryNames, summarize
from verl_grpo.trainers.trl.backend import grpo_args
from verl_grpo.trainers.trl.callbacks import StoreCallback, say
from verl_grpo.trainers.trl.grpo_trainer import RecordingGRPOTrainer, StepRecord
from verl_grpo.trainers.trl.tools import tool_functions, with_tool_template
from verl_grpo.trainers.trl.warm_start import committed_result, summary_of, warm_started_model
from verl_grpo.trainers.worker.errors import check_workdir
from verl_grpo.trainers.worker.metrics import WorkerLogs
from verl_grpo.trainers.worker.spec import WorkerSpec
from verl_grpo.trainers.worker.termination import Termination

TRAIN_COLUMNS = ("prompt", "data_source", "reward_model", "extra_info")
CHECKPOINT_PREFIX = "checkpoint-"
STAGING_DIR = "pending_uploads"
SUMMARY = SummaryNames(
    final={key: f"final_{key}" for key in ("reward", "reward_std", "kl", "entropy", "completions/mean_length", "loss")},
    reward="reward",
    final_prefixes={"rewards/": "final_rewards/"},
    totals=("train_runtime", "train_loss", "train_steps_per_second"),
)


def load_train_dataset(spec: WorkerSpec, store: Store):
    """The prepared train split as a `datasets.Dataset` with the columns TRL and the reward functions use."""
    from datasets import Dataset

    from verl_grpo.data.prepare import load_split

    frame = load_split(spec.dataset, "train", store)
    missing = [c for c in TRAIN_COLUMNS if c not in frame.columns]
    if missing:
        raise DataError(
            f"train split {spec.dataset.splits['train']} lacks columns {missing}; prepare the dataset again"
        )
    needed = spec.cfg.algorithm.train_batch_size
    if len(frame) < needed:
        raise DataError(
            f"train split of {spec.dataset.name}/{spec.dataset.hash} has {len(frame)} rows, fewer than "
            f"algorithm.train_batch_size ({needed}); lower the batch size or use more data"
        )
    return Dataset.from_list(frame[list(TRAIN_COLUMNS)].to_dict("records"))


def restore_for_resume(spec: WorkerSpec, checkpoints: CheckpointStore, output_dir: Path,
                       logs: WorkerLogs) -> tuple[Path | None, CheckpointRef | None]:
    """Bring the newest committed checkpoint into output_dir (local leftovers are never trusted)."""
    restored = restore_latest(checkpoints, spec.run_id, LocalCheckpoints(output_dir, CHECKPOINT_PREFIX),
                              keep_undeletable=True)
    if restored is None:
        logs.reset()
        return None, None
    ref, local = restored
    logs.reset(local, upto_step=ref.step)
    print(f"resuming run {spec.run_id} from checkpoint step {ref.step} ({ref.uri})", flush=True)
    return local, ref


def base_model_path(spec: WorkerSpec) -> Path | str:
    from verl_grpo.models import resolve_model

    return spec.model_path if spec.model_path and Path(spec.model_path).is_dir() else resolve_model(spec.model_name)


def _reward_functions(cfg, data_source: str):
    """In-process scorers, or the run's reward-server (same functions and weights) when `services` enables it; a run
    with its own function (reward.path) has one reward function, `score`, that calls it (there or here)."""
    if cfg.reward.path:
        from verl_grpo.rewards.trl_adapter import user_reward_functions

        results = None
        if "reward" in cfg.services.enabled:
            from verl_grpo.services.reward_client import remote_results

            results = remote_results()
        say(f"rewards: scored by {cfg.reward.name} in {cfg.reward.path}" + (" on the reward-server" if results else ""))
        return user_reward_functions(cfg, results)
    if "reward" in cfg.services.enabled:
        from verl_grpo.services.reward_client import remote_trl_reward_functions

        print("rewards: scored by the reward-server", flush=True)
        return remote_trl_reward_functions(data_source)
    from verl_grpo.rewards.trl_adapter import trl_reward_functions

    return trl_reward_functions(data_source)


def run(spec: WorkerSpec, termination: Termination) -> TrainResult:
    """Train (resuming if the store has a checkpoint), publish the final model, return the TrainResult."""
    import torch

    cfg = spec.cfg
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    check_workdir(spec.workdir)
    store = spec.store
    checkpoints = CheckpointStore.from_config(store, cfg.storage)
    logs = WorkerLogs(spec.workdir)
    final_dir = spec.workdir / "final_model"
    if final_dir.exists():
        shutil.rmtree(final_dir)

    # A checkpoint the previous attempt staged but did not upload is work not to lose.
    BackgroundSaver(checkpoints, staging_dir=spec.workdir / STAGING_DIR).commit_pending(spec.run_id)
    resume_dir, resumed_ref = restore_for_resume(spec, checkpoints, spec.workdir / "checkpoints", logs)
    final_logs: dict[str, float] = {}
    upload_wait_s = 0.0
    warm = committed_result(spec) if spec.cfg.warm_start.enabled and resume_dir else None
    warm_summary = summary_of(warm) if warm else {}
    if resumed_ref is not None and resumed_ref.step >= spec.planned_steps:
        # HF Trainer would run one more step past max_steps; the run is done, only its publishing was cut short.
        print(f"run {spec.run_id} already reached step {resumed_ref.step}; publishing that checkpoint", flush=True)
        export_model(resume_dir, final_dir)
        final_step, last_ref = resumed_ref.step, resumed_ref
    else:
        start_model: Path | str = base_model_path(spec)
        if resume_dir is None:  # a resumed run's weights come from its checkpoint
            warm_model, warm_summary = warm_started_model(spec, start_model, termination)
            start_model = warm_model or start_model
        final_step, last_ref, final_logs, upload_wait_s = _train(spec, termination, checkpoints, logs, resume_dir,
                                                                 final_dir, start_model)
        last_ref = last_ref or resumed_ref

    with termination.upload():
        retrying = checkpoints.retrying  # the final publish rides out store outages like checkpoints do
        retrying("remove the previous model", lambda: store.rm(model_dir(spec.run_id)))
        model_uri = retrying("upload the final model", lambda: store.put_dir(final_dir, model_dir(spec.run_id)))
        metrics_uri = logs.publish(store, spec.run_id, retrying)
        summary = summarize(logs.metrics.records(), SUMMARY, final_logs)
        summary["checkpoint_wait_s"] = upload_wait_s
        summary.update(warm_summary)
        result = TrainResult(
            run_id=spec.run_id, final_step=final_step, checkpoint=last_ref or checkpoints.latest_complete(spec.run_id),
            model_uri=model_uri, metrics_uri=metrics_uri, summary=summary,
        )
        retrying("write train_result.json", lambda: store.write_text(result.model_dump_json(indent=1),
                                                                    train_result(spec.run_id)))
    write_json_atomic(spec.workdir / RESULT_FILE, json.loads(result.model_dump_json()))
    print(f"training done: step {final_step}, model at {model_uri}", flush=True)
    return result


def _train(spec: WorkerSpec, termination: Termination, checkpoints: CheckpointStore, logs: WorkerLogs,
           resume_dir: Path | None, final_dir: Path,
           start_model: Path | str) -> tuple[int, CheckpointRef | None, dict[str, float], float]:
    """Run GRPOTrainer to total_steps and save the final model into final_dir.

    Returns the final step, its committed checkpoint, HF's end-of-training logs and the seconds training
    waited for checkpoint uploads. The last upload is committed before this returns.
    """
    cfg = spec.cfg
    train_dataset = load_train_dataset(spec, spec.store)
    reward_funcs, reward_weights = _reward_functions(cfg, cfg.dataset.name)
    from verl_grpo.models import load_model_and_tokenizer
    from verl_grpo.trainers.precision import precision_line

    model, tokenizer = load_model_and_tokenizer(start_model, cfg.model.dtype)
    tools = tool_functions(cfg)
    if tools:
        tokenizer = with_tool_template(tokenizer, cfg.model.name)
        say(f"tools: {', '.join(t.__name__ for t in tools)} (multi-turn rollouts; each call asks the retrieval-server)")
    total_steps = spec.planned_steps
    args = grpo_args(cfg, spec.workdir / "checkpoints", reward_weights=list(reward_weights), total_steps=total_steps)
    say(precision_line(cfg.trainer.precision, args.use_cpu))
    step_record = StepRecord()
    callback = StoreCallback(spec, total_steps=total_steps, logs=logs, checkpoints=checkpoints,
                             step_record=step_record, termination=termination,
                             staging_dir=spec.workdir / STAGING_DIR)
    trainer = RecordingGRPOTrainer(model=model, reward_funcs=list(reward_funcs), args=args,
                                   train_dataset=train_dataset, processing_class=tokenizer, callbacks=[callback],
                                   tools=tools or None)
    trainer.step_record = step_record
    trainer.samples_per_step = cfg.trainer.samples_per_step if cfg.trainer.log_samples_every else 0
    trainer.remove_callback(PrinterCallback)  # our progress line replaces HF's dict dump
    try:
        trainer.train(resume_from_checkpoint=str(resume_dir) if resume_dir else None)
        trainer.save_model(str(final_dir))  # overlaps with the last checkpoint's upload
    except BaseException:
        with termination.upload():  # a checkpoint in flight is valid: let it commit, then fail
            callback.saver.abandon()
        raise
    with termination.upload():
        callback.saver.close()
    say(f"training waited {callback.saver.waited_s:.2f}s for checkpoint uploads")
    return trainer.state.global_step, callback.last_ref, callback.final_logs, callback.saver.waited_s



def export_model(checkpoint_dir: Path, final_dir: Path) -> None:
    """The HF model + tokenizer of a trainer checkpoint, without optimizer/RNG/trainer state."""
    from verl_grpo.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(checkpoint_dir)
    model.save_pretrained(final_dir, safe_serialization=True)
    tokenizer.save_pretrained(final_dir)
