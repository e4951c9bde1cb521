"""How a local worker (trl, loop) cuts one optimizer step's completions into forward/backward passes: one check of
trainer.micro_batch_size for both."""

from __future__ import annotations

from dataclasses import dataclass

from verl_grpo.config import RunConfig
from verl_grpo.errors import ConfigError


@dataclass(frozen=True)
class BatchLayout:
    """How one optimizer step's completions are cut into forward/backward passes."""

    prompts_per_step: int
    completions_per_step: int
    per_device_batch: int
    """Completions per forward/backward pass (TRL per_device_train_batch_size)."""
    grad_accum_steps: int
    """Forward/backward passes per optimizer step (also TRL steps_per_generation)."""


def batch_layout(cfg: RunConfig) -> BatchLayout:
    """Per-device batch and accumulation so one step = train_batch_size × rollouts completions."""
    alg = cfg.algorithm
    total = alg.train_batch_size * alg.rollouts
    micro = cfg.trainer.micro_batch_size or total
    if micro < 1 or total % micro != 0:
        divisors = [d for d in range(1, total + 1) if total % d == 0]
        raise ConfigError(
            f"trainer.micro_batch_size ({micro}) must divide algorithm.train_batch_size × algorithm.rollouts "
            f"({alg.train_batch_size} × {alg.rollouts} = {total}); use one of {divisors} or leave it unset"
        )
    return BatchLayout(prompts_per_step=alg.train_batch_size, completions_per_step=total, per_device_batch=micro,
                       grad_accum_steps=total // micro)
