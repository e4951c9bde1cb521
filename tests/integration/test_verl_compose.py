"""verl overrides composed against the installed verl's own Hydra config and checked by verl's validate_config."""

from __future__ import annotations

import pytest

from verl_grpo.config import load_config
from verl_grpo.errors import ConfigError
from verl_grpo.trainers.verl.overrides import VerlPaths, verl_overrides
from verl_grpo.trainers.verl.validation import compose_verl_config, validate_verl_overrides

FILES = {"train": "/w/train.parquet", "val": "/w/val.parquet"}


def _overrides(*cfg_overrides: str) -> list[str]:
    cfg = load_config([], ["dataset.name=gsm8k", "trainer.backend=verl", "infra.provider=skypilot",
                           "infra.accelerators=H100:8", *cfg_overrides])
    return verl_overrides(cfg, FILES, VerlPaths("/w/ckpt"), "r1", env={})


def test_gsm8k_overrides_compose_and_validate():
    result = validate_verl_overrides(_overrides(), check_reward=False)
    assert any("validate_config" in c for c in result.checks)
    config = compose_verl_config(_overrides())
    assert config.algorithm.adv_estimator == "grpo"
    assert config.actor_rollout_ref.rollout.n == 4
    assert config.actor_rollout_ref.actor.clip_ratio_high == 0.28
    # vLLM's context is what a rollout can reach, not the model's 32k default (sized CUDA graphs, scheduler)
    assert config.actor_rollout_ref.rollout.max_model_len == config.data.max_prompt_length + config.data.max_response_length
    assert list(config.trainer.logger) == ["console", "file"]  # metrics reach MLflow via metrics.jsonl
    assert config.trainer.checkpoint_callback_class == "verl_grpo.trainers.verl.callback.StoreCheckpointCallback"
    assert any("checkpoint callback" in c for c in result.checks)


def test_warmup_and_epochs_compose_into_verls_own_keys():
    config = compose_verl_config(_overrides("algorithm.warmup_steps=20", "algorithm.total_epochs=3"))
    assert config.actor_rollout_ref.actor.optim.lr_warmup_steps == 20 and config.trainer.total_epochs == 3
    validate_verl_overrides(_overrides("algorithm.warmup_steps=20", "algorithm.total_epochs=3"), check_reward=False)


@pytest.mark.parametrize("extra", [
    ["verl.adv_estimator=rloo", "verl.strategy=megatron"],
    ["verl.adv_estimator=reinforce_plus_plus", "verl.rollout_engine=sglang", "algorithm.kl_coef=0.001"],
    ["verl.adv_estimator=gae", "verl.lora_rank=8"],
])
def test_other_estimators_strategies_and_lora_validate(extra):
    result = validate_verl_overrides(_overrides(*extra), check_reward=False)
    assert result.checks[0].startswith("verl Hydra compose")


def test_misspelled_key_fails_with_hydras_message():
    with pytest.raises(ConfigError, match=r"Could not override 'actor_rollout_ref.actor.clip_ration_low'"):
        validate_verl_overrides(_overrides("verl.extra_overrides=[actor_rollout_ref.actor.clip_ration_low=0.1]"),
                                check_reward=False)


def test_unknown_estimator_fails_listing_verls_registry():
    with pytest.raises(ConfigError, match=r"verl.adv_estimator: Unknown advantage estimator.*grpo"):
        validate_verl_overrides(_overrides("verl.adv_estimator=grpoo"), check_reward=False)


def test_indivisible_batch_fails_with_verls_validate_message():
    # 3 prompts x 3 rollouts = 9 sequences cannot be split across 8 GPUs.
    with pytest.raises(ConfigError, match=r"real_train_batch_size \(9\) must be divisible"):
        validate_verl_overrides(_overrides("algorithm.train_batch_size=3", "algorithm.rollouts=3"), check_reward=False)


def test_unloadable_checkpoint_callback_fails_with_verls_loader_message():
    overrides = _overrides() + ["trainer.checkpoint_callback_class=verl_grpo.trainers.verl.callback.NoSuchCallback"]
    with pytest.raises(ConfigError, match="NoSuchCallback"):
        validate_verl_overrides(overrides, check_reward=False)


def test_verl_builds_our_callback_from_the_composed_config(monkeypatch, tmp_path):
    """verl's own build_checkpoint_callback (what PPOTrainer.__init__ calls) instantiates our class."""
    from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback

    from verl_grpo.trainers.verl.callback import StoreCheckpointCallback
    from verl_grpo.trainers.verl.settings import checkpoint_env

    for k, v in checkpoint_env(f"file://{tmp_path}/store", None, "r1", "/w/ckpt", 2).items():
        monkeypatch.setenv(k, v)
    callback = build_checkpoint_callback(compose_verl_config(_overrides()))
    assert isinstance(callback, StoreCheckpointCallback)
    assert callback.settings.checkpoint_dir.as_posix() == "/w/ckpt" and callback.train_batch_size == 8


def test_unloadable_reward_module_fails():
    overrides = _overrides() + ["reward.custom_reward_function.path=pkg://verl_grpo.no_such_rewards"]
    with pytest.raises(ConfigError, match="no_such_rewards"):
        validate_verl_overrides(overrides, check_reward=True)


def test_retrieval_composes_verls_tool_loop_and_loads_the_search_tool():
    """The dry run's check: the composed config runs `tool_agent` (not single_turn_agent) and the tool config's class
    imports and loads through verl's own tool registry."""
    overrides = _overrides("services.enabled=[retrieval]")
    config = compose_verl_config(overrides)
    rollout = config.actor_rollout_ref.rollout
    assert rollout.agent.default_agent_loop == "tool_agent" and rollout.multi_turn.enable
    assert config.data.return_raw_chat and config.data.tool_config_path == "infra/verl/search_tool.yaml"
    checks = validate_verl_overrides(overrides, check_reward=False).checks
    assert "agent loop 'tool_agent' is registered in verl and is the rollout's default" in checks
    assert any(c.startswith("tool config infra/verl/search_tool.yaml loads with verl's tool registry: search")
               for c in checks)


def test_multi_turn_without_the_tool_loop_fails_the_dry_run():
    """The state the issue found: multi_turn.enable with verl's default single_turn_agent never calls a tool."""
    with pytest.raises(ConfigError, match="single_turn_agent, which never calls a tool"):
        validate_verl_overrides(_overrides(
            "services.enabled=[retrieval]",
            "verl.extra_overrides=[actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent]"),
            check_reward=False)
