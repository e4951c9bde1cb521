"""Pure parts of the verl checkpoint bridge: merge command, env settings, metrics merging, summary."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from verl_grpo.errors import ConfigError
from verl_grpo.trainers.atomic_files import write_jsonl_atomic
from verl_grpo.trainers.run_summary import summarize
from verl_grpo.trainers.verl.callback import StoreCheckpointCallback
from verl_grpo.trainers.verl.merge import merge_command
from verl_grpo.trainers.verl.metrics import SUMMARY, merged_metrics
from verl_grpo.trainers.verl.settings import (
    ENV_VERL_METRICS,
    TRACKER_FILE,
    StoreSettings,
    checkpoint_env,
    read_tracker,
    write_tracker,
)


def test_merge_command_is_verls_documented_cli():
    cmd = merge_command(Path("/c/global_step_9/actor"), Path("/c/model"), "fsdp2")
    assert cmd == [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
                   "--local_dir", "/c/global_step_9/actor", "--target_dir", "/c/model"]
    assert merge_command(Path("a"), Path("b"), "megatron", python="python")[:6] == [
        "python", "-m", "verl.model_merger", "merge", "--backend", "megatron"]
    with pytest.raises(ConfigError, match="model_merger backend"):
        merge_command(Path("a"), Path("b"), "deepspeed")


def test_settings_round_trip_through_the_task_env_and_name_missing_vars():
    env = checkpoint_env("s3://b/p", "http://minio:9000", "run-7", "/tmp/verl-grpo/checkpoints/run-7", 3)
    s = StoreSettings.from_env(env)
    assert (s.uri, s.endpoint_url, s.run_id, s.keep_last) == ("s3://b/p", "http://minio:9000", "run-7", 3)
    assert env[ENV_VERL_METRICS] == str(s.verl_metrics_path)
    with pytest.raises(ConfigError, match="VERL_GRPO_STORE_URI, VERL_GRPO_CHECKPOINT_DIR not set"):
        StoreSettings.from_env({"VERL_GRPO_RUN_ID": "r"})


def test_callback_rejects_a_default_local_dir_that_differs_from_the_env():
    env = checkpoint_env("s3://b/p", None, "r", "/a", 2)
    with pytest.raises(ConfigError, match="trainer.default_local_dir '/b' differs"):
        StoreCheckpointCallback(config={"trainer": {"default_local_dir": "/b"}}, env=env)


def test_metrics_merge_history_with_verls_log_later_wins_and_cut_at_step(tmp_path):
    s = StoreSettings("s3://b/p", None, "r", tmp_path)
    write_jsonl_atomic(s.history_path, [{"step": 1, "x": 1.0}, {"step": 2, "x": 2.0}])
    s.verl_metrics_path.write_text(json.dumps({"step": 2, "data": {"x": 20.0}}) + "\n"
                                   + json.dumps({"step": 3, "data": {"x": 3.0}}) + "\n" + '{"step": 4, "da')
    assert merged_metrics(s) == [{"step": 1, "x": 1.0}, {"step": 2, "x": 20.0}, {"step": 3, "x": 3.0}]
    assert [r["step"] for r in merged_metrics(s, upto_step=2)] == [1, 2]


def test_summary_uses_the_last_training_step_and_skips_initial_validation():
    records = [{"step": 0, "val-core/acc": 0.1}, {"step": 1, "critic/score/mean": 0.2},
               {"step": 2, "critic/score/mean": 0.4, "actor/pg_loss": 0.05, "val-core/acc": 0.3}]
    assert summarize(records, SUMMARY) == {"final_reward": 0.4, "final_loss": 0.05, "val-core/acc": 0.3,
                                              "mean_reward": pytest.approx(0.3)}


def test_tracker_is_written_atomically_and_read_back(tmp_path):
    write_tracker(tmp_path, 12)
    assert (tmp_path / TRACKER_FILE).read_text() == "12" and read_tracker(tmp_path) == 12
    assert not list(tmp_path.glob(".*tmp*"))
