"""`python -m verl_grpo_rehearsal.fully_async_cpu <fully-async overrides>`: the rollout group's verl fully-async entry
(`verl_grpo.trainers.verl.fully_async_entry`) stood in on a CPU.

A rehearsal of skypilot.shape=rollout_group runs this instead of the entry, with the very same Hydra overrides. Real:
verl's `fully_async_ppo_trainer` config and the checks its trainer and rollouter make (`validate_fully_async`), and
everything main_ppo_cpu keeps real (dataset + StatefulDataLoader, the reward function via verl's loader — the
reward-server's client —, advantage, policy loss, FSDP2 checkpoint manager, the store checkpoint callback, resume).
Checkpoints are numbered by parameter version as verl's fully-async trainer numbers them: one stand-in step takes
one weight-sync period's prompts (ppo_mini_batch_size × require_batches × trigger_parameter_sync_step) and updates in
as many mini-batches as verl does in that period. Not real: the standalone rollout replicas, the message queue and
NCCL weight sync (samples are generated with the current weights, staleness 0), Ray, GPUs.
"""

from __future__ import annotations

import sys
from typing import Any

from verl_grpo_rehearsal.main_ppo_cpu import rehearsal_line, run


def load_config(overrides: list[str]) -> Any:
    """verl's fully-async config with these overrides, checked as the dry run checks it, seen per weight sync."""
    from omegaconf import OmegaConf, open_dict

    from verl_grpo.trainers.verl.fully_async import CONFIG_NAME, validate_fully_async_overrides, verl_config_dir
    from verl_grpo.trainers.verl.validation import compose_verl_config

    validate_fully_async_overrides(overrides)
    config = compose_verl_config(overrides, verl_config_dir(), CONFIG_NAME)
    OmegaConf.resolve(config)
    at = config.async_training
    with open_dict(config):
        config.data.train_batch_size = (int(config.actor_rollout_ref.actor.ppo_mini_batch_size)
                                        * int(at.require_batches) * int(at.trigger_parameter_sync_step))
    return config


def describe(config: Any, loggers: list[str]) -> str:
    at = config.async_training
    return (rehearsal_line(config, loggers).replace(
        "verl.trainer.main_ppo stood in by verl_grpo_rehearsal.main_ppo_cpu",
        "verl's fully-async trainer (verl_grpo.trainers.verl.fully_async_entry) stood in by "
        "verl_grpo_rehearsal.fully_async_cpu")
        + f"; fully-async: verl's fully_async_ppo_trainer config + its asserts real, one step per weight sync "
          f"(trigger_parameter_sync_step={at.trigger_parameter_sync_step}, {config.data.train_batch_size} prompts); "
          f"not real: {config.rollout.nnodes} standalone rollout node(s), message queue "
          f"(staleness_threshold={at.staleness_threshold}; samples here are on-policy), NCCL weight sync")


def main(argv: list[str] | None = None) -> int:
    return run(list(sys.argv[1:] if argv is None else argv), load_config, describe)


if __name__ == "__main__":
    sys.exit(main())
