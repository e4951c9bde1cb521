"""TRL's GRPOTrainer with what an exact resume needs (an epoch-seeded sampler and the prompts each step consumed) and
what a reader wants to see (a few of each step's rollouts)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler

from verl_grpo.trainers.worker.samples import Sample


class EpochRepeatSampler(RepeatSampler):
    """TRL's RepeatSampler, except that epoch e's order depends only on (seed, e).

    TRL's sampler draws every epoch's permutation from one generator seeded once, so a process resumed in
    epoch e > 0 would replay epoch 0's order. HF Trainer calls set_epoch before each epoch's iteration.
    """

    epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if self.shuffle:
            self.generator.manual_seed((self.seed or 0) + self.epoch)
        return super().__iter__()


@dataclass
class StepRecord:
    """What the trainer notes during a step, for StoreCallback to log with the step and clear."""

    prompts: list = field(default_factory=list)
    """The indices of the prompts the step consumed (into metrics.jsonl: an exact resume skips them)."""
    samples: list[Sample] = field(default_factory=list)
    """The first rollouts of the step's generation batch (into samples.jsonl on sampled steps)."""


class RecordingGRPOTrainer(GRPOTrainer):
    """GRPOTrainer with the epoch-seeded sampler, and a StepRecord of each step: the prompts it consumed and its
    first `samples_per_step` rollouts."""

    step_record: StepRecord  # set by run(), shared with StoreCallback
    samples_per_step: int = 0

    def _get_train_sampler(self, dataset=None):
        return EpochRepeatSampler(
            data_source=dataset if dataset is not None else self.train_dataset,
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.shuffle_dataset,
            seed=self.args.seed,
        )

    def _generate_and_score_completions(self, inputs):
        if self.model.training:
            # Rows come as `num_generations` consecutive copies of each prompt (RepeatSampler order).
            for row in inputs[:: self.num_generations]:
                info = row.get("extra_info") or {}
                self.step_record.prompts.append(info.get("index", info.get("uid")))
        output = super()._generate_and_score_completions(inputs)
        if self.model.training and self.samples_per_step and not self.step_record.samples:
            self.step_record.samples.extend(self._samples(len(inputs), output))
        return output

    def _samples(self, n: int, output: dict[str, Any]) -> list[Sample]:
        """The first samples_per_step rows of the batch just scored (whole groups: rows come group by group), read
        from what TRL keeps for its own `log_completions` (the latest batch's prompts, completions, per-function
        rewards and advantages)."""
        logs = self._logs
        prompts, completions = list(logs["prompt"])[-n:], list(logs["completion"])[-n:]
        advantages = list(logs["advantages"])[-n:]
        per_function = {name: list(values)[-n:] for name, values in logs["rewards"].items()}
        weights = dict(zip(self.reward_func_names, self.reward_weights.tolist()))
        eos = self.processing_class.eos_token_id
        samples = []
        for i in range(min(self.samples_per_step, n)):
            components = {name: float(values[i]) for name, values in per_function.items()
                          if not math.isnan(values[i])}
            samples.append(Sample(
                prompt=_text(prompts[i], last_user=True), response=_text(completions[i]),
                reward=sum(weights.get(name, 1.0) * value for name, value in components.items()),
                advantage=float(advantages[i]), components=components,
                truncated=eos not in output["completion_ids"][i].tolist()))
        return samples


def _text(content: Any, last_user: bool = False) -> str:
    """A prompt or completion as TRL holds it (text, or chat messages) as plain text: a prompt's last user turn; a
    completion's turns joined (tool calls and results included)."""
    if isinstance(content, str):
        return content
    messages = [m for m in content if isinstance(m, dict)]
    if last_user:
        users = [m for m in messages if m.get("role") == "user"]
        return str((users or messages)[-1].get("content", "")) if messages else ""
    if len(messages) == 1:
        return str(messages[0].get("content", ""))
    return "\n".join(f"[{m.get('role')}] {m.get('content') or m.get('tool_calls') or ''}" for m in messages)
