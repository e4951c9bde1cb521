"""The rollout_group shape on the local rehearsal of SkyPilot, through the pipeline's own calls (resolve, prepare,
provision, train): one Ray cluster of a trainer node and a rollout node running verl's fully-async entry (stood in
on the CPU by `fully_async_cpu`) beside the data-server, reward-server and replay buffer; rewards come from the
reward-server, checkpoints are numbered by weight sync and committed through the nodes' checkpoint syncs, and a
preemption resumes from the last committed version with no prompt lost or trained twice."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from verl_grpo import plain_steps
from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.config import load_config
from verl_grpo.store import Store
from verl_grpo_rehearsal import sky_boundary
from verl_grpo_rehearsal.session import rehearsal_session

pytestmark = pytest.mark.e2e

CONFIGS = ["gsm8k", "local"]
PROMPTS = re.compile(r"^rehearsal: step (\d+) prompts (.*)$")
STARTS = re.compile(r"^(?:restored checkpoint step (\d+) of run|no committed checkpoint of run)")


def test_fully_async_entry_trains_by_weight_sync_with_the_services_and_resumes_after_a_preemption(
        tiny_model_dir, tmp_path):
    overrides = [f"model.name={tiny_model_dir}", "algorithm.total_steps=4", "algorithm.save_freq=2",
                 "algorithm.max_response_length=8", "algorithm.train_batch_size=2", "algorithm.rollouts=2",
                 "async_training.trigger_parameter_sync_step=2", "warm_start.enabled=false", "trainer.backend=verl",
                 "infra.provider=skypilot", "skypilot.shape=rollout_group", "skypilot.max_restarts_on_errors=0",
                 "skypilot.termination_delay=2s"]
    cfg = load_config(CONFIGS, overrides)
    assert cfg.services.enabled == ["data", "reward", "replay"]
    with rehearsal_session(cfg, preempt_at=(1,), root=tmp_path / "rehearsal") as session:
        run = plain_steps.resolve(CONFIGS, [*overrides, *session.overrides])
        dataset = plain_steps.prepare(run.cfg)
        cluster = plain_steps.provision(run)
        result = plain_steps.train(run, dataset, cluster)
        assert result.final_step == 2  # 4 optimizer steps = 2 weight syncs (verl's parameter versions)

        (record,) = sky_boundary.queue()
        job = sky_boundary.summary(record.job_id)
        assert job["status"] == "SUCCEEDED"
        assert {job["tasks"][t] for t in ("data-server", "reward-server", "replay-buffer")} == {"CANCELLED"}
        launched = [e["num_nodes"] for e in job["events"] if e["event"] == "task_launched" and
                    e.get("task", "verl-trainer") == "verl-trainer"]
        assert 2 in launched  # 1 trainer node + skypilot.rollout_nodes=1, one Ray cluster
        assert [e["step"] for e in job["events"] if e["event"] == "preempted"] == [1]

        log = (Path(job["job_dir"]) / "run.log").read_text().splitlines()
        assert any("stood in by verl_grpo_rehearsal.fully_async_cpu" in line for line in log)
        assert any("reward-server" in line and "POST /batch_reward" in line for line in log)
        restored = [int(m[1]) if m[1] else 0 for line in log if (m := STARTS.match(line))]
        assert restored[0] == 0 and restored[-1] == 1, restored
        versions: dict[int, str] = {}
        for line in log:
            if m := PROMPTS.match(line):
                assert versions.setdefault(int(m[1]), m[2]) == m[2]
        assert sorted(versions) == [1, 2]
        trained = [p for v in sorted(versions) for p in versions[v].split(",")]
        assert len(trained) == len(set(trained)) == 2 * 2 * 2  # per version: train batch x sync period

        checkpoints = CheckpointStore(Store.from_config(run.cfg.storage))
        assert checkpoints.steps(run.run_id) == [1, 2] and checkpoints.latest_complete(run.run_id).step == 2
        assert checkpoints.manifest(run.run_id, 2)["state"]["prompts_consumed"] == 2 * 2 * 2
