"""TRL's GRPOTrainer with what an exact resume needs: an epoch-seeded sampler and the prompts each step consumed."""

from __future__ import annotations

from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler


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


class RecordingGRPOTrainer(GRPOTrainer):
    """GRPOTrainer with the epoch-seeded sampler and a record of the prompts each step consumed."""

    consumed_prompts: list  # set by run(); StoreCallback moves it into metrics.jsonl

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
                self.consumed_prompts.append(info.get("index", info.get("uid")))
        return super()._generate_and_score_completions(inputs)
