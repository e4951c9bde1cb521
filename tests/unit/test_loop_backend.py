"""trainer.backend=loop offline: the services it enables, the settings it refuses (one ConfigError naming the field),
the worker command it plans, its progress lines, and the run-summary lines of its facts."""

from __future__ import annotations

import json

import pytest

from verl_grpo.config import load_config
from verl_grpo.contracts import Cluster, DatasetVersion
from verl_grpo.errors import ConfigError
from verl_grpo.store import Store
from verl_grpo.summary import async_loop_lines
from verl_grpo.trainers import get_trainer
from verl_grpo.trainers.loop.rollouts import groups_ahead

LOOP = ["trainer.backend=loop", "warm_start.enabled=false", "algorithm.train_batch_size=4"]


def test_loop_enables_the_services_it_reads():
    cfg = load_config(overrides=[*LOOP, "services.enabled=[retrieval]"])
    assert cfg.services.enabled == ["retrieval", "data", "reward", "replay"]
    assert load_config(overrides=["services.enabled=[retrieval]"]).services.enabled == ["retrieval"]


@pytest.mark.parametrize("override, field", [
    ("algorithm.kl_coef=0.1", "algorithm.kl_coef"),
    ("trainer.micro_batch_size=3", "trainer.micro_batch_size"),
    ("async_training.replay_share=0.1", "async_training.replay_share"),
])
def test_check_names_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        get_trainer("loop").check(load_config(overrides=[*LOOP, override]))


def test_check_describes_the_loop():
    cfg = load_config(overrides=[*LOOP, "async_training.replay_share=0.5", "async_training.max_replays=2"])
    line = get_trainer("loop").check(cfg)
    assert "2 rollout server(s)" in line and "(2 from the replay buffer, each at most 3 times)" in line


def test_plan_writes_the_spec_and_the_worker_command(tmp_path, tiny_model_dir):
    cfg = load_config(overrides=[*LOOP, f"model.name={tiny_model_dir}"])
    dataset = DatasetVersion(name="gsm8k", hash="h", uri="file:///d", splits={"train": "file:///d/train.parquet"},
                             counts={"train": 100})
    store = Store(f"file://{tmp_path / 'store'}")
    remote = Cluster(provider="skypilot", name="c", workdir=str(tmp_path), on_this_machine=False)
    with pytest.raises(ConfigError, match="this machine only"):
        get_trainer("loop").plan(cfg, dataset, store, "run-1", remote)
    cluster = Cluster(provider="local", name="c", workdir=str(tmp_path), on_this_machine=True)
    spec = get_trainer("loop").plan(cfg, dataset, store, "run-1", cluster)
    assert spec.command[-3:] == ["-m", "verl_grpo.trainers.loop.worker", spec.spec_uri]
    written = json.loads((tmp_path / "train_spec.json").read_text())
    assert written["backend"] == "loop" and written["model_path"] == str(tiny_model_dir)
    assert spec.total_steps == cfg.algorithm.total_steps


def test_progress_lines_parse_with_the_loop_figures():
    got = get_trainer("loop").parse_progress("step 3/12 reward=0.5 loss=0.1 version=3 replay=0.5 stale=1", 12)
    assert got.step == 3 and got.reward == 0.5 and got.metrics["version"] == 3 and got.metrics["stale"] == 1


def test_generation_runs_ahead_by_verls_bound():
    cfg = load_config(overrides=[*LOOP, "async_training.replay_share=0.5", "async_training.staleness_threshold=0.5",
                                 "async_training.trigger_parameter_sync_step=2"])
    assert groups_ahead(cfg) == 6  # 2 fresh groups per step x 2 steps per sync x 1.5


def test_summary_lines():
    lines = async_loop_lines({"policy_version": 12.0, "policy_version/server_1": 12.0,
                              "policy_version/server_0": 12.0, "replay_share": 0.4583, "max_staleness": 2.0,
                              "dropped_stale": 1.0})
    assert lines == ["policy versions   trainer v12; server_0 v12, server_1 v12",
                     "replay share      0.458 of trained groups",
                     "largest staleness 2 policy version(s) (1 stale group(s) dropped)"]
    assert async_loop_lines({"final_reward": 1.0}) == []
