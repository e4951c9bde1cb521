"""What the TRL worker does around HF Trainer events: metrics.jsonl and samples.jsonl, progress lines, the
learning-signal watch, checkpoint commits, SIGTERM.

Checkpoints are committed by a BackgroundSaver: `on_save` snapshots HF's checkpoint dir and returns while
the upload runs, so the next steps train during the upload.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from verl_grpo.checkpoints import BackgroundSaver, CheckpointStore
from verl_grpo.contracts import CheckpointRef
from verl_grpo.errors import TrainingError
from verl_grpo.trainers.signal import ALL_TIED, TIED_GROUP_SHARE, NoSignalWatch, all_tied
from verl_grpo.trainers.trl.grpo_trainer import StepRecord
from verl_grpo.trainers.worker.batch_layout import batch_layout
from verl_grpo.trainers.worker.metrics import WorkerLogs
from verl_grpo.trainers.worker.progress import progress_line
from verl_grpo.trainers.worker.samples import sampled_step
from verl_grpo.trainers.worker.spec import WorkerSpec
from verl_grpo.trainers.worker.termination import Termination


def signal_figures(logs: dict[str, Any]) -> dict[str, float]:
    """TRL's logs in the shared signal vocabulary (verl_grpo.trainers.signal).

    TRL already names the clipped ratio, mean length and component means as the vocabulary does; its
    `frac_reward_zero_std` (share of completions whose group's reward std is 0, i.e. of tied groups, as
    scale_rewards="group") is the tied share.
    """
    tied = logs.get("frac_reward_zero_std")
    out: dict[str, float] = {}
    if isinstance(tied, (int, float)):
        out[TIED_GROUP_SHARE] = float(tied)
    flag = all_tied(tied, all_equal=logs.get("reward") == 0 and logs.get("reward_std") == 0)
    if flag is not None:
        out[ALL_TIED] = flag
    return out


class StoreCallback(TrainerCallback):
    """Per log: a metrics line (and on sampled steps a samples line) + a progress line, then the no-signal watch.
    Per save: hand the checkpoint (with both logs) to the saver."""

    def __init__(self, spec: WorkerSpec, *, total_steps: int, logs: WorkerLogs, checkpoints: CheckpointStore,
                 step_record: StepRecord, termination: Termination, staging_dir: Path):
        """`step_record`: what the trainer notes during each step (its prompt indices go into the step's metrics
        line, its samples into samples.jsonl); `staging_dir`: where a checkpoint waits for its upload."""
        self.run_id = spec.run_id
        self.no_signal = NoSignalWatch.from_config(spec.cfg)
        self.total_steps = total_steps
        self.logs = logs
        self.samples_every = spec.cfg.trainer.log_samples_every
        self.checkpoints = checkpoints
        self.keep_last = spec.cfg.storage.keep_last
        self.step_record = step_record
        self.termination = termination
        self.prompts_per_step = batch_layout(spec.cfg).prompts_per_step
        self.last_ref: CheckpointRef | None = None
        self.final_logs: dict[str, float] = {}
        self.saver = BackgroundSaver(checkpoints, on_committed=self.committed, staging_dir=staging_dir)

    def committed(self, ref: CheckpointRef) -> None:
        """Runs on the upload thread once a checkpoint's manifest is written: retention, then the log line."""
        self.last_ref = ref
        self.checkpoints.prune(self.run_id, self.keep_last)
        say(f"checkpoint step {ref.step} committed to {ref.uri}")

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "reward" not in logs:  # the end-of-training summary (train_runtime, train_loss, ...)
            self.final_logs.update({k: v for k, v in logs.items() if isinstance(v, (int, float))})
            return
        loss = logs.get("loss")
        if loss is not None and not math.isfinite(loss):
            raise TrainingError(
                f"run {self.run_id}: training loss is {loss} at step {state.global_step}; lower algorithm.lr "
                "or check the reward functions for non-finite values"
            )
        record: dict[str, Any] = {"step": state.global_step}
        record.update({k: v for k, v in logs.items() if isinstance(v, (int, float)) or v is None})
        record.update(signal_figures(record))
        record["prompt_indices"] = list(self.step_record.prompts)
        self.step_record.prompts.clear()
        self.logs.metrics.append(record)
        if sampled_step(state.global_step, self.samples_every) and self.step_record.samples:
            self.logs.samples.append({"step": state.global_step,
                                      "samples": [s.record() for s in self.step_record.samples]})
        self.step_record.samples.clear()
        say(progress_line(record, self.total_steps))
        if self.no_signal is not None:
            # A record averages logging_steps steps; with stop_on_no_signal this raises TrainingError.
            if warning := self.no_signal.observe(record, span=args.logging_steps):
                say(warning)

    def on_save(self, args, state, control, **kwargs):
        step = state.global_step
        ckpt_dir = Path(args.output_dir) / f"checkpoint-{step}"
        self.logs.copy_into(ckpt_dir)
        data_state = {
            "backend": "trl",
            "global_step": step,
            "epoch": state.epoch,
            "prompts_consumed": step * self.prompts_per_step,
        }
        # Returns once the previous upload is done (bounded memory and disk) and this one is queued.
        with self.termination.upload():
            self.saver.submit(self.run_id, step, ckpt_dir, data_state)


def say(line: str) -> None:
    """One whole line to stdout: the upload thread and the training thread both report progress."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
