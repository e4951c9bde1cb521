"""The rollout_group shape's overrides composed against the installed verl's own fully-async Hydra config
(`fully_async_ppo_trainer`) and checked as verl's fully-async trainer checks them; its entry's checkpoint seam."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from run_configs import VERL_ROLLOUT_GROUP, build_config

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.errors import ConfigError
from verl_grpo.store import Store
from verl_grpo.trainers.verl.backend import VerlTrainer
from verl_grpo.trainers.verl.callback import CALLBACK_CLASS
from verl_grpo.trainers.verl.fully_async import (
    CONFIG_NAME,
    fully_async_overrides,
    validate_fully_async_overrides,
    verl_config_dir,
)
from verl_grpo.trainers.verl.overrides import run_paths
from verl_grpo.trainers.verl.settings import checkpoint_env
from verl_grpo.trainers.verl.validation import compose_verl_config

FILES = {"train": "/w/train.parquet", "val": "/w/val.parquet"}


_cfg = partial(build_config, "dataset.name=gsm8k", *VERL_ROLLOUT_GROUP)


def _overrides(*extra: str) -> list[str]:
    cfg = _cfg(*extra)
    return fully_async_overrides(cfg, FILES, run_paths(cfg, "/w/ckpt"), "r1", env={})


def test_overrides_compose_with_verls_fully_async_config_and_pass_its_checks():
    overrides = _overrides("skypilot.rollout_nodes=2", "async_training.staleness_threshold=0.3",
                           "async_training.trigger_parameter_sync_step=2", "algorithm.save_freq=4")
    result = validate_fully_async_overrides(overrides)
    assert result.checks[0] == f"verl Hydra compose of {CONFIG_NAME} with all overrides"
    assert any("fully-async asserts" in c for c in result.checks)
    assert any("validate_config" in c for c in result.checks)
    assert any("pkg://verl_grpo.services.reward_client:compute_score loads" in c for c in result.checks)
    assert any(CALLBACK_CLASS in c for c in result.checks)
    config = compose_verl_config(overrides, verl_config_dir(), CONFIG_NAME)
    assert config.async_training.staleness_threshold == 0.3 and config.async_training.trigger_parameter_sync_step == 2
    assert config.rollout.nnodes == 2 and config.rollout.n_gpus_per_node == 8 and config.trainer.nnodes == 1
    # verl's own fully-async defaults survive our overrides: rollout log-probs, bypass-mode rollout correction, NCCL
    assert config.actor_rollout_ref.rollout.calculate_log_probs and config.actor_rollout_ref.actor.use_rollout_log_probs
    assert config.algorithm.rollout_correction.bypass_mode is True
    assert config.actor_rollout_ref.rollout.checkpoint_engine.backend == "nccl"
    assert config.trainer.resume_mode == "auto" and config.trainer.default_local_dir == "/w/ckpt"
    # the rollout nodes' GPUs train nothing: vLLM takes more of them than the colocated trainer GPUs' share
    rollout = config.actor_rollout_ref.rollout
    assert rollout.standalone_gpu_memory_utilization > rollout.gpu_memory_utilization


def test_misspelled_async_key_fails_with_hydras_message():
    with pytest.raises(ConfigError, match=r"async_training\.stalenes_threshold"):
        validate_fully_async_overrides(_overrides("verl.extra_overrides=[async_training.stalenes_threshold=1]"))


def test_settings_verls_fully_async_trainer_asserts_against_fail_offline():
    with pytest.raises(ConfigError, match=r"hybrid_engine must be False"):
        validate_fully_async_overrides(_overrides("verl.extra_overrides=[actor_rollout_ref.hybrid_engine=True]"))
    with pytest.raises(ConfigError, match=r"calculate_log_probs must be True"):
        validate_fully_async_overrides(
            _overrides("verl.extra_overrides=[actor_rollout_ref.rollout.calculate_log_probs=False]"))


def test_a_trainer_step_that_does_not_split_over_the_trainer_gpus_fails_with_verls_message():
    # one trainer step: 3 prompts x 3 rollouts = 9 sequences cannot be split across 8 trainer GPUs.
    with pytest.raises(ConfigError, match=r"real_train_batch_size \(9\) must be divisible"):
        validate_fully_async_overrides(_overrides("algorithm.train_batch_size=3", "algorithm.rollouts=3"))


def test_the_verl_backend_checks_the_rollout_group_against_the_fully_async_entry():
    line = VerlTrainer().check(_cfg())
    assert line.startswith("verl fully_async_entry:") and "fully_async_ppo_trainer" in line


def test_entry_commits_each_saved_version_through_the_store_callback(tmp_path, monkeypatch):
    """verl's fully-async trainer calls no checkpoint callback; the entry's trainer subclass does, after verl's save.
    verl's save itself (worker-group RPCs to GPU actors) is replaced here by writing what it writes."""
    import torch
    from verl.experimental.fully_async_policy import fully_async_main as verl_main

    from verl_grpo.trainers.verl import fully_async_entry as entry

    ckpt = tmp_path / "ckpt"
    for key, value in checkpoint_env(f"file://{tmp_path / 'store'}", None, "r1", str(ckpt), 2).items():
        monkeypatch.setenv(key, value)

    def verl_save(self):
        step_dir = Path(self.config.trainer.default_local_dir) / f"global_step_{self.current_param_version}"
        (step_dir / "actor").mkdir(parents=True)
        (step_dir / "actor" / "model.bin").write_bytes(b"w" * 64)
        torch.save({"_num_yielded": 7}, step_dir / "data.pt")  # the rollouter's dataloader state
        (ckpt / "latest_checkpointed_iteration.txt").write_text(str(self.current_param_version))

    monkeypatch.setattr(verl_main.FullyAsyncTrainer.__ray_actor_class__, "_save_checkpoint", verl_save)
    trainer = entry.StoreCommittingTrainer.__new__(entry.StoreCommittingTrainer)
    trainer.config = OmegaConf.create({
        "trainer": {"default_local_dir": str(ckpt), "checkpoint_callback_class": CALLBACK_CLASS,
                    "total_training_steps": 2},
        "data": {"train_batch_size": 0},
        "actor_rollout_ref": {"actor": {"checkpoint": {"async_save": False}, "ppo_mini_batch_size": 4}},
        "async_training": {"require_batches": 2, "trigger_parameter_sync_step": 3},
    })
    for version in (1, 2):
        trainer.current_param_version = version
        trainer._save_checkpoint()
    checkpoints = CheckpointStore(Store(f"file://{tmp_path / 'store'}"))
    ref = checkpoints.latest_complete("r1")
    assert ref is not None and ref.step == 2
    state = checkpoints.manifest("r1", 2)["state"]
    assert state["dataloader_batches_yielded"] == 7
    assert state["prompts_consumed"] == 2 * 4 * 2 * 3, "one weight sync's prompts a saved version (data.train_batch_size is 0)"


def test_entry_task_runner_creates_the_committing_trainer(monkeypatch):
    from verl.experimental.fully_async_policy import fully_async_main as verl_main

    from verl_grpo.trainers.verl import fully_async_entry as entry

    seen = []
    monkeypatch.setattr(verl_main.FullyAsyncTaskRunner.__ray_actor_class__, "_create_trainer",
                        lambda self, config: seen.append(verl_main.FullyAsyncTrainer))
    runner = entry.StoreCommittingTaskRunner.__new__(entry.StoreCommittingTaskRunner)
    runner._create_trainer(None)
    assert seen[0].__ray_actor_class__ is entry.StoreCommittingTrainer
    assert verl_main.FullyAsyncTrainer.__ray_actor_class__ is not entry.StoreCommittingTrainer  # restored after


def test_the_entry_composes_verls_config_through_hydras_own_command_line():
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "verl_grpo.trainers.verl.fully_async_entry", "--cfg", "job",
                           "--package", "async_training", "async_training.staleness_threshold=0.3"],
                          env=env, cwd=repo, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "staleness_threshold: 0.3" in done.stdout and "trigger_parameter_sync_step: 4" in done.stdout


def test_replay_settings_reach_verls_async_training_section_and_pass_its_checks():
    from verl_grpo.trainers.verl.replay import ReplaySettings

    overrides = _overrides("async_training.replay_share=0.25", "async_training.max_replays=2",
                           "async_training.max_staleness=3")
    assert "+async_training.replay_share=0.25" in overrides
    validate_fully_async_overrides(overrides)
    config = compose_verl_config(overrides, verl_config_dir(), CONFIG_NAME)
    assert ReplaySettings.from_async_training(config.async_training) == ReplaySettings(0.25, 2, 3)
    assert not any("replay" in o for o in _overrides())  # replay off: verl's config untouched
    without_plus = [o.lstrip("+") if o.startswith("+async_training.replay") else o for o in overrides]
    with pytest.raises(ConfigError, match=r"replay_share"):  # verl's struct config knows no such key
        validate_fully_async_overrides(without_plus)


def test_replay_without_the_replay_buffer_or_with_a_share_that_rounds_to_nothing_fails():
    with pytest.raises(ConfigError, match=r"services.enabled does not include"):
        _overrides("async_training.replay_share=0.5", "services.enabled=[data,reward]")
    with pytest.raises(ConfigError, match=r"rounds to no replayed group"):
        _overrides("async_training.replay_share=0.01")
