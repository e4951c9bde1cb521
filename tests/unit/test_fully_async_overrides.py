"""fully_async_overrides: the pure RunConfig → verl fully-async trainer mapping (skypilot.shape=rollout_group), and the
knob run script that resizes it at launch."""

from __future__ import annotations

import shlex
import subprocess
from functools import partial

import pytest
from run_configs import VERL_FILES, VERL_ROLLOUT_GROUP, build_config, overrides_dict

from verl_grpo.config import load_config
from verl_grpo.errors import ConfigError
from verl_grpo.providers.skypilot.knobs import knob_task
from verl_grpo.trainers.verl.callback import CALLBACK_CLASS
from verl_grpo.trainers.verl.fully_async import (
    ENTRY_MODULE,
    LITERAL_KNOB_KEYS,
    fully_async_overrides,
    knob_defaults,
    knob_expressions,
    planned_checkpoint_steps,
)
from verl_grpo.trainers.verl.overrides import VerlPaths, cluster_nodes, run_paths, uses_fully_async, verl_overrides

PATHS = VerlPaths(checkpoint_dir="/w/checkpoints/r1")


_cfg = partial(build_config, *VERL_ROLLOUT_GROUP)


def test_sizes_trainer_and_rollout_replicas_and_sets_the_async_knobs_with_verls_meaning():
    cfg = _cfg("infra.nodes=2", "skypilot.rollout_nodes=3", "async_training.staleness_threshold=0.5",
               "async_training.trigger_parameter_sync_step=2", "async_training.partial_rollout=false",
               "algorithm.train_batch_size=64", "verl.ppo_mini_batch_size=16", "algorithm.total_steps=40",
               "algorithm.save_freq=10")
    o = overrides_dict(fully_async_overrides(cfg, VERL_FILES, PATHS, "r1", env={}))
    assert o["trainer.nnodes"] == "2" and o["trainer.n_gpus_per_node"] == "8"
    assert o["rollout.nnodes"] == "3" and o["rollout.n_gpus_per_node"] == "8"
    assert o["async_training.staleness_threshold"] == "0.5"
    assert o["async_training.trigger_parameter_sync_step"] == "2"
    assert o["async_training.partial_rollout"] == "False"
    # one trainer step takes the run's train batch: 16-prompt mini-batches x 4; prompts reach the rollouter one by one
    assert o["actor_rollout_ref.actor.ppo_mini_batch_size"] == "16" and o["async_training.require_batches"] == "4"
    assert o["data.train_batch_size"] == "0" and o["data.gen_batch_size"] == "1"
    assert o["actor_rollout_ref.hybrid_engine"] == "False"
    assert o["rollout.total_rollout_steps"] == str(40 * 64)
    # verl counts steps, checkpoints and save_freq by weight sync (parameter version)
    assert o["trainer.total_training_steps"] == "20" and o["trainer.save_freq"] == "5"
    assert cluster_nodes(cfg) == 5


def test_keeps_main_ppos_data_reward_checkpoint_and_resume_settings():
    cfg = _cfg()
    assert cfg.services.enabled == ["data", "reward", "replay"]  # the shape's services, recorded in the config
    paths = run_paths(cfg, "/w/checkpoints/r1")
    fa = fully_async_overrides(cfg, VERL_FILES, paths, "r1", env={})
    o = overrides_dict(fa)
    assert o["data.train_files"] == "/w/train.parquet" and o["data.val_files"] == "/w/val.parquet"
    assert o["reward.custom_reward_function.path"] == "pkg://verl_grpo.services.reward_client"
    assert o["reward.custom_reward_function.name"] == "compute_score"
    assert o["trainer.default_local_dir"] == "/w/checkpoints/r1"
    assert o["trainer.checkpoint_callback_class"] == CALLBACK_CLASS
    assert o["trainer.resume_mode"] == "auto"
    keys = [x.partition("=")[0] for x in fa]
    assert len(keys) == len(set(keys)), "every key once: the replaced main_ppo keys are not repeated"
    main_ppo = overrides_dict(verl_overrides(cfg, VERL_FILES, paths, "r1", env={}))
    changed = {k for k in main_ppo if main_ppo[k] != o.get(k)}
    assert changed == {"data.train_batch_size"}  # one sync per step: verl's step count and save_freq are ours
    one_kept = overrides_dict(fully_async_overrides(_cfg("storage.keep_last=1"), VERL_FILES, paths, "r1", env={}))
    assert one_kept["trainer.max_actor_ckpt_to_keep"] == "2"  # infra.nodes=1, but a 2-node Ray cluster: synced checkpoints


def test_user_extra_overrides_come_last():
    fa = fully_async_overrides(_cfg("verl.extra_overrides=[async_training.require_batches=2]"), VERL_FILES, PATHS, "r1")
    assert fa[-1] == "async_training.require_batches=2"


@pytest.mark.parametrize("extra, field", [
    (["algorithm.total_steps=9", "async_training.trigger_parameter_sync_step=2", "algorithm.save_freq=2"],
     "algorithm.total_steps"),
    (["algorithm.save_freq=3", "async_training.trigger_parameter_sync_step=2", "algorithm.total_steps=20"],
     "algorithm.save_freq"),
    (["algorithm.train_batch_size=24", "verl.ppo_mini_batch_size=16"], "algorithm.train_batch_size"),
])
def test_settings_verl_cannot_count_are_one_line_config_errors(extra, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as e:
        fully_async_overrides(_cfg(*extra), VERL_FILES, PATHS, "r1")
    assert "\n" not in str(e.value)


def test_only_the_rollout_group_on_skypilot_trains_fully_async():
    assert uses_fully_async(_cfg())
    assert not uses_fully_async(_cfg("skypilot.shape=job_group"))
    assert not uses_fully_async(load_config([], ["trainer.backend=verl", "skypilot.shape=rollout_group"]))
    assert cluster_nodes(_cfg("skypilot.shape=multinode", "infra.nodes=2")) == 2


def test_planned_steps_are_weight_syncs():
    assert planned_checkpoint_steps(_cfg("algorithm.total_steps=40", "algorithm.save_freq=10",
                                         "async_training.trigger_parameter_sync_step=4"), None) == 10
    assert planned_checkpoint_steps(_cfg("skypilot.shape=multinode", "algorithm.total_steps=40"), None) == 40


def _expanded(cfg, **env: str) -> dict[str, str]:
    """The fully-async command as bash expands the rendered knob script under `env`."""
    command = ["python", "-m", ENTRY_MODULE, *fully_async_overrides(cfg, VERL_FILES, PATHS, "r1", env={})]
    knobs = knob_task(cfg, command, retrieval_available=False, derived=knob_expressions(cfg),
                      defaults=knob_defaults(cfg), literal=LITERAL_KNOB_KEYS)
    envs = {**knobs.envs, **env}
    script = "\n".join([*(f"{k}={shlex.quote(v)}" for k, v in envs.items()), *knobs.prelude,
                        f"for a in {knobs.train_command}; do echo \"$a\"; done"])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    return overrides_dict([line for line in out.splitlines() if "=" in line])


def test_launch_knobs_resize_the_fully_async_run_like_main_ppo():
    cfg = _cfg("algorithm.train_batch_size=32", "algorithm.total_steps=20", "algorithm.save_freq=10",
               "async_training.trigger_parameter_sync_step=2", "verl.ppo_mini_batch_size=8")
    default = _expanded(cfg)
    assert default["rollout.total_rollout_steps"] == str(20 * 32) and default["trainer.total_training_steps"] == "10"
    assert default["async_training.require_batches"] == "4" and default["data.train_batch_size"] == "0"
    resized = _expanded(cfg, TOTAL_STEPS="50", TRAIN_BATCH_SIZE="64")
    assert resized["rollout.total_rollout_steps"] == str(50 * 64) and resized["trainer.total_training_steps"] == "25"
    assert resized["async_training.require_batches"] == "8" and resized["data.train_batch_size"] == "0"
