"""verl_overrides: the pure RunConfig → verl main_ppo Hydra override mapping."""

from __future__ import annotations

from functools import partial

import pytest
from run_configs import VERL_FILES, VERL_H100_8, build_config, overrides_dict

from verl_grpo.config import load_config
from verl_grpo.errors import ConfigError
from verl_grpo.trainers.verl.overrides import VerlPaths, gpus_per_node, verl_overrides

PATHS = VerlPaths(checkpoint_dir="/w/checkpoints/r1")


_cfg = partial(build_config, *VERL_H100_8)


def test_maps_grpo_settings_to_verl_keys():
    cfg = _cfg("algorithm.rollouts=8", "algorithm.clip_low=0.2", "algorithm.clip_high=0.28", "algorithm.kl_coef=0.01",
               "algorithm.loss_agg_mode=seq-mean-token-mean", "infra.nodes=2", "verl.rollout_engine=sglang",
               "verl.lora_rank=16", "verl.lora_alpha=32", "verl.ppo_mini_batch_size=4")
    o = overrides_dict(verl_overrides(cfg, VERL_FILES, PATHS, "r1", env={}))
    assert o["algorithm.adv_estimator"] == "grpo"
    assert o["actor_rollout_ref.rollout.n"] == "8"
    assert o["actor_rollout_ref.actor.clip_ratio_low"] == "0.2"
    assert o["actor_rollout_ref.actor.clip_ratio_high"] == "0.28"
    assert o["actor_rollout_ref.actor.loss_agg_mode"] == "seq-mean-token-mean"
    assert o["actor_rollout_ref.actor.use_kl_loss"] == "True"
    assert o["actor_rollout_ref.actor.kl_loss_coef"] == "0.01"
    assert o["actor_rollout_ref.actor.ppo_mini_batch_size"] == "4"
    assert o["actor_rollout_ref.rollout.name"] == "sglang"
    assert o["actor_rollout_ref.model.lora_rank"] == "16" and o["actor_rollout_ref.model.lora_alpha"] == "32"
    assert o["data.train_files"] == "/w/train.parquet" and o["data.val_files"] == "/w/val.parquet"
    assert o["trainer.nnodes"] == "2" and o["trainer.n_gpus_per_node"] == "8"
    assert o["trainer.resume_mode"] == "auto"
    assert o["trainer.default_local_dir"] == "/w/checkpoints/r1"
    assert o["trainer.checkpoint_callback_class"] == "verl_grpo.trainers.verl.callback.StoreCheckpointCallback"
    assert o["reward.custom_reward_function.path"] == "pkg://verl_grpo.rewards"
    assert o["reward.custom_reward_function.name"] == "compute_score"
    assert o["actor_rollout_ref.model.path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "critic.enable" not in o


def test_wandb_logger_only_with_key_and_key_never_in_overrides():
    cfg = _cfg()
    without = overrides_dict(verl_overrides(cfg, VERL_FILES, PATHS, "r1", env={}))
    assert without["trainer.logger"] == "[console,file]"
    with_key = verl_overrides(cfg, VERL_FILES, PATHS, "r1", env={"WANDB_API_KEY": "sekret-123"})
    assert overrides_dict(with_key)["trainer.logger"] == "[console,file,wandb]"
    assert not any("sekret-123" in o for o in with_key)


def test_gae_adds_a_critic_and_megatron_switches_engine():
    o = overrides_dict(verl_overrides(_cfg("verl.adv_estimator=gae", "verl.strategy=fsdp"), VERL_FILES, PATHS, "r1", env={}))
    assert o["critic.enable"] == "True" and o["critic.strategy"] == "fsdp"
    assert o["critic.model.path"] == o["actor_rollout_ref.model.path"]
    m = overrides_dict(verl_overrides(_cfg("verl.strategy=megatron", "verl.megatron_tp=2"), VERL_FILES, PATHS, "r1", env={}))
    assert m["model_engine"] == "megatron"
    assert m["actor_rollout_ref.actor.megatron.tensor_model_parallel_size"] == "2"
    assert "actor_rollout_ref.actor.strategy" not in m


def test_user_overrides_pass_through_last():
    cfg = _cfg()
    cfg.verl.extra_overrides = ["actor_rollout_ref.actor.entropy_coeff=0.001", "trainer.test_freq=10"]
    out = verl_overrides(cfg, VERL_FILES, PATHS, "r1", env={})
    assert out[-2:] == cfg.verl.extra_overrides


@pytest.mark.parametrize(
    ("overrides", "files", "fragment"),
    [
        (["model.name=tiny"], VERL_FILES, "model.name 'tiny'"),
        (["verl.ppo_mini_batch_size=16"], VERL_FILES, "verl.ppo_mini_batch_size (16)"),
        ([], {"train": "/w/train.parquet"}, "val parquet"),
    ],
)
def test_bad_settings_name_the_field(overrides, files, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        verl_overrides(_cfg(*overrides), files, PATHS, "r1", env={})


@pytest.mark.parametrize(("spec", "n"), [("H100:8", 8), ("A100", 1), ("L4:2", 2)])
def test_gpus_per_node_from_accelerators(spec, n):
    assert gpus_per_node(_cfg(f"infra.accelerators={spec}")) == n


def test_gpus_per_node_rejects_fractions_and_missing():
    with pytest.raises(ConfigError, match="whole GPUs"):
        gpus_per_node(_cfg("infra.accelerators=H100:0.5"))
    with pytest.raises(ConfigError, match="infra.accelerators is not set"):
        gpus_per_node(load_config([], ["trainer.backend=verl"]))


def test_services_switch_reward_and_tools():
    from verl_grpo.config import load_config
    from verl_grpo.trainers.verl.overrides import REMOTE_REWARD_MODULE, VerlPaths, run_paths, verl_overrides

    cfg = load_config(["gsm8k"], ["trainer.backend=verl", "infra.accelerators=H100:8",
                                  "services.enabled=[reward, retrieval]"], env={})
    paths = run_paths(cfg, "/ckpt")
    assert paths.reward_path == REMOTE_REWARD_MODULE
    out = verl_overrides(cfg, {"train": "t.parquet", "val": "v.parquet"}, paths, "r1")
    assert f"reward.custom_reward_function.path={REMOTE_REWARD_MODULE}" in out
    assert "actor_rollout_ref.rollout.multi_turn.enable=True" in out
    plain = load_config(["gsm8k"], ["trainer.backend=verl", "infra.accelerators=H100:8"], env={})
    assert run_paths(plain, "/ckpt") == VerlPaths(checkpoint_dir="/ckpt")


def test_retrieval_selects_verls_tool_loop_with_the_search_tool():
    """multi_turn.enable alone leaves verl on single_turn_agent; the tool loop, its tool config, raw chat prompts and
    the tool-turn bound come with it."""
    on = overrides_dict(verl_overrides(_cfg("services.enabled=[retrieval]", "services.retrieval.max_tool_turns=3"),
                                 VERL_FILES, PATHS, "r1"))
    rollout = "actor_rollout_ref.rollout"
    assert on[f"{rollout}.agent.default_agent_loop"] == "tool_agent"
    assert on[f"{rollout}.multi_turn.tool_config_path"] == "infra/verl/search_tool.yaml"
    assert on[f"{rollout}.multi_turn.max_user_turns"] == "3"
    assert on["data.return_raw_chat"] == "True"
    # verl's own default (256 characters) would cut a result to its first lines; the run's cut is the run's setting,
    # and the results get room on top of the model's own tokens: 3 turns of 3000 characters (≤ 1000 tokens each)
    assert on[f"{rollout}.multi_turn.max_tool_response_length"] == "3000"
    assert on[f"{rollout}.multi_turn.tool_response_truncate_side"] == "right"
    own = _cfg().algorithm.max_response_length
    assert int(on["data.max_response_length"]) == own + 3 * (1000 + 32)
    assert int(on[f"{rollout}.max_model_len"]) == _cfg().algorithm.max_prompt_length + own + 3 * 1032
    off = overrides_dict(verl_overrides(_cfg(), VERL_FILES, PATHS, "r1"))
    assert not any(k.startswith((f"{rollout}.multi_turn", f"{rollout}.agent")) or k == "data.return_raw_chat"
                   for k in off)
    assert off["data.max_response_length"] == str(own)


def test_use_retrieval_knob_switches_the_tool_loop():
    from verl_grpo.config import load_config as load

    base = ["trainer.backend=verl", "infra.provider=skypilot", "infra.accelerators=H100:8"]
    assert "retrieval" in load([], base, env={"USE_RETRIEVAL": "true"}).services.enabled
    on = verl_overrides(load([], base, env={"USE_RETRIEVAL": "true"}), VERL_FILES, PATHS, "r1")
    assert "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent" in on
    off = verl_overrides(load([], base, env={"USE_RETRIEVAL": "false"}), VERL_FILES, PATHS, "r1")
    assert not any("agent_loop" in o for o in off)


def test_project_name_is_the_wandb_project_wandb_accepts():
    """verl passes trainer.project_name to wandb.init(project=...), whose validator rejects `/`."""
    from wandb.sdk.wandb_settings import Settings

    cfg = _cfg("dataset.name=gsm8k")
    project = overrides_dict(verl_overrides(cfg, VERL_FILES, PATHS, "r1", env={"WANDB_API_KEY": "k"}))["trainer.project_name"]
    assert project == cfg.wandb_project == "verl-grpo-gsm8k"
    assert Settings(project=project).project == project


@pytest.mark.parametrize("extra, mini", [
    (["algorithm.train_batch_size=32"], 8),  # the shipped gsm8k batch: four updates per step
    (["algorithm.train_batch_size=6"], 2),  # the largest count up to 4 that divides the batch: 3
    (["algorithm.train_batch_size=2"], 1),
    (["algorithm.train_batch_size=1"], 1),
    (["algorithm.train_batch_size=32", "verl.ppo_mini_batches=1"], 32),  # one update: every ratio is 1
    (["algorithm.train_batch_size=32", "verl.ppo_mini_batch_size=16"], 16),
])
def test_a_step_updates_in_several_mini_batches_so_the_clip_acts(extra, mini):
    o = overrides_dict(verl_overrides(_cfg(*extra), VERL_FILES, PATHS, "r1", env={}))
    assert o["actor_rollout_ref.actor.ppo_mini_batch_size"] == str(mini)
