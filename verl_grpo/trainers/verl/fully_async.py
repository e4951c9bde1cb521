"""RunConfig → the Hydra overrides of verl's fully-async trainer (skypilot.shape=rollout_group) and their check.

verl.experimental.fully_async_policy trains on infra.nodes × GPUs while standalone rollout replicas generate on
skypilot.rollout_nodes × GPUs of the same Ray cluster; a message queue bounded by async_training.staleness_threshold
sits between them and the trainer pushes weights to every replica (NCCL) each trigger_parameter_sync_step steps.
Everything else is main_ppo's mapping (`overrides.verl_overrides`): the prepared parquet of the dataset version,
the reward function (the reward-server's client when `reward` is enabled), trainer.default_local_dir and the store
checkpoint callback, resume_mode=auto.

How our step maps onto verl's: verl's rollouter takes prompts one at a time (data.train_batch_size=0), a trainer step
takes ppo_mini_batch_size × require_batches prompts = algorithm.train_batch_size, and verl numbers checkpoints
(`global_step_N`), save_freq and its step count by parameter version, one per trigger_parameter_sync_step steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from verl_grpo.config import RunConfig
from verl_grpo.errors import ConfigError
from verl_grpo.trainers.loop.batch import replay_count
from verl_grpo.trainers.verl.overrides import (
    VerlPaths,
    gpus_per_node,
    ppo_mini_batch_size,
    uses_fully_async,
    verl_overrides,
)
from verl_grpo.trainers.verl.replay import SETTING_KEYS as REPLAY_KEYS

ENTRY_MODULE = "verl_grpo.trainers.verl.fully_async_entry"
"""What the rollout group's head runs: verl's fully_async_main with the checkpoint-callback seam (see there)."""
VERL_MAIN_MODULE = "verl.experimental.fully_async_policy.fully_async_main"
CONFIG_PACKAGE = "verl.experimental.fully_async_policy"
CONFIG_NAME = "fully_async_ppo_trainer"
"""verl's own Hydra config of the fully-async trainer (`<CONFIG_PACKAGE>/config/<CONFIG_NAME>.yaml`)."""
REPLACED_KEYS = ("data.train_batch_size", "trainer.total_training_steps", "trainer.save_freq")
"""main_ppo overrides whose value means something else on the fully-async trainer (set again below)."""


STANDALONE_GPU_MEMORY_UTILIZATION = 0.85
"""vLLM's memory share on the rollout nodes' GPUs, which train nothing: verl's fully-async config falls back to the
colocated `gpu_memory_utilization` (0.6, shared with FSDP on the trainer's GPUs) unless this is set, leaving ~40% of
each rollout GPU unused; 0.85 is the value its own comment suggests (fully_async_rollouter.py)."""


def fully_async_overrides(
    cfg: RunConfig,
    data_files: Mapping[str, str],
    paths: VerlPaths,
    run_id: str,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """The Hydra overrides of verl's fully_async_main for this run; user extra_overrides come last."""
    a, sync = cfg.algorithm, cfg.async_training.trigger_parameter_sync_step
    mini = ppo_mini_batch_size(cfg)
    if a.train_batch_size % mini:
        raise ConfigError(f"algorithm.train_batch_size ({a.train_batch_size}) is not a multiple of "
                          f"verl.ppo_mini_batch_size ({mini}); verl's fully-async trainer takes whole mini-batches "
                          "(async_training.require_batches); make it one")
    for field, value in (("algorithm.total_steps", a.total_steps), ("algorithm.save_freq", a.save_freq)):
        if value % sync:
            raise ConfigError(f"{field} ({value}) is not a multiple of async_training.trigger_parameter_sync_step "
                              f"({sync}); verl's fully-async trainer counts steps and saves by weight sync; make "
                              "it one")
    replay = replay_overrides(cfg)
    base = verl_overrides(cfg, data_files, paths, run_id, env)
    extras = len(cfg.verl.extra_overrides)
    head, tail = base[:len(base) - extras], base[len(base) - extras:]
    head = [o for o in head if o.partition("=")[0] not in REPLACED_KEYS]
    at = cfg.async_training
    return [
        *head,
        "data.train_batch_size=0",
        "data.gen_batch_size=1",
        "actor_rollout_ref.hybrid_engine=False",
        f"async_training.require_batches={a.train_batch_size // mini}",
        f"async_training.staleness_threshold={at.staleness_threshold}",
        f"async_training.trigger_parameter_sync_step={sync}",
        f"async_training.partial_rollout={at.partial_rollout}",
        f"actor_rollout_ref.rollout.standalone_gpu_memory_utilization={STANDALONE_GPU_MEMORY_UTILIZATION}",
        f"rollout.nnodes={cfg.skypilot.rollout_nodes}",
        f"rollout.n_gpus_per_node={gpus_per_node(cfg)}",
        f"rollout.total_rollout_steps={a.total_steps * a.train_batch_size}",
        f"trainer.total_training_steps={a.total_steps // sync}",
        f"trainer.save_freq={a.save_freq // sync}",
        *replay,
        *tail,
    ]


def replay_overrides(cfg: RunConfig) -> list[str]:
    """Our replay settings as new keys of verl's async_training (Hydra `+`), read by the entry's trainer
    (`replay.ReplaySettings`); none when async_training.replay_share is 0."""
    at, tbs = cfg.async_training, cfg.algorithm.train_batch_size
    if at.replay_share <= 0:
        return []
    if "replay" not in cfg.services.enabled:
        raise ConfigError(f"async_training.replay_share={at.replay_share} draws groups from the replay buffer, which "
                          "services.enabled does not include; add replay (e.g. -o 'services.enabled=[data,reward,"
                          "replay]') or set async_training.replay_share=0")
    if replay_count(tbs, at.replay_share) == 0:
        raise ConfigError(f"async_training.replay_share={at.replay_share} of algorithm.train_batch_size={tbs} rounds "
                          "to no replayed group per step (and one group stays fresh); raise the share or the batch "
                          "size")
    return [f"+async_training.{key}={getattr(at, key)}" for key in REPLAY_KEYS]


LITERAL_KNOB_KEYS = ("data.train_batch_size",)
"""Knob-mapped main_ppo keys the fully-async run sets to a fixed value (data.train_batch_size=0)."""


def knob_expressions(cfg: RunConfig) -> dict[str, str]:
    """Override key → shell arithmetic over the env knobs, so `--env TOTAL_STEPS=…`/`TRAIN_BATCH_SIZE=…` at launch
    resize the fully-async run as they resize main_ppo's (see `knobs.knob_task`)."""
    sync = cfg.async_training.trigger_parameter_sync_step
    mini = cfg.verl.ppo_mini_batch_size
    out = {
        "rollout.total_rollout_steps": "TOTAL_STEPS * TRAIN_BATCH_SIZE",
        "trainer.total_training_steps": f"TOTAL_STEPS / {sync}",
    }
    if mini is not None:  # else the mini-batch is TRAIN_BATCH_SIZE / require_batches (knobs.knob_task)
        out["async_training.require_batches"] = f"TRAIN_BATCH_SIZE / {mini}"
    return out


def knob_defaults(cfg: RunConfig) -> dict[str, str]:
    """The knobs' defaults that no fully-async override carries as a plain value (data.train_batch_size is 0)."""
    return {"TRAIN_BATCH_SIZE": str(cfg.algorithm.train_batch_size), "TOTAL_STEPS": str(cfg.algorithm.total_steps)}


def prompts_per_checkpoint_step(cfg: RunConfig) -> str:
    """Shell expression of the prompts one checkpoint step (one weight sync) consumes, for the finalize entry."""
    return f'"$((TRAIN_BATCH_SIZE * {cfg.async_training.trigger_parameter_sync_step}))"'


def verl_config_dir() -> str:
    """The installed verl's fully-async Hydra config directory (the one fully_async_main itself uses)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec(CONFIG_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"{CONFIG_PACKAGE} is not in the installed verl; skypilot.shape=rollout_group needs "
                          "verl>=0.9.1 (its fully-async trainer)")
    return str(Path(next(iter(spec.submodule_search_locations))) / "config")


def validate_fully_async_overrides(overrides: Sequence[str], check_reward: bool = True):
    """Compose the overrides with verl's `fully_async_ppo_trainer` config and run the checks verl makes before it
    places a GPU (see `validation.validate_fully_async`); ConfigError with verl's message on any failure."""
    from verl_grpo.trainers.verl.validation import validate_fully_async

    return validate_fully_async(overrides, verl_config_dir(), CONFIG_NAME, check_reward=check_reward)


def planned_checkpoint_steps(cfg: RunConfig, train_rows: int | None) -> int:
    """The steps verl counts (and logs and checkpoints by) for this run: algorithm.planned_steps on main_ppo, one per
    weight sync (trigger_parameter_sync_step steps) on the fully-async trainer."""
    planned = cfg.algorithm.planned_steps(train_rows)
    if not uses_fully_async(cfg):
        return planned
    return max(1, planned // cfg.async_training.trigger_parameter_sync_step)
