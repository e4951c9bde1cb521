"""A 2-node verl run on the local rehearsal of SkyPilot, through the pipeline's own calls (resolve, prepare,
provision, train): every node's checkpoint sync uploads its checkpoint dir with the task's secrets (no bucket mount),
commits write manifests in place, an injected preemption kills both nodes, and the recovery on fresh nodes restores
the last committed step onto every node and resumes from it with no step lost or trained twice."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from verl_grpo import plain_steps
from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.config import load_config
from verl_grpo.rehearsal import sky_boundary
from verl_grpo.rehearsal.session import rehearsal_session
from verl_grpo.store import Store

pytestmark = pytest.mark.e2e

CONFIGS = ["gsm8k", "local"]
PROMPTS = re.compile(r"^rehearsal: step (\d+) prompts (.*)$")
STARTS = re.compile(r"^(?:restored checkpoint step (\d+) of run|no committed checkpoint of run)")


def test_two_nodes_sync_their_checkpoints_commit_and_resume_after_a_preemption(tiny_model_dir, tmp_path):
    overrides = [f"model.name={tiny_model_dir}", "algorithm.total_steps=4", "algorithm.save_freq=2",
                 "algorithm.max_response_length=8", "algorithm.train_batch_size=2", "algorithm.rollouts=2",
                 "warm_start.enabled=false", "trainer.backend=verl", "infra.provider=skypilot", "infra.nodes=2",
                 "skypilot.shape=multinode", "skypilot.max_restarts_on_errors=0"]
    cfg = load_config(CONFIGS, overrides)
    with rehearsal_session(cfg, preempt_at=(2,), root=tmp_path / "rehearsal") as session:
        run = plain_steps.resolve(CONFIGS, [*overrides, *session.overrides])
        dataset = plain_steps.prepare(run.cfg)
        cluster = plain_steps.provision(run)
        result = plain_steps.train(run, dataset, cluster)  # the managed job recovers from the preemption itself
        assert result.final_step == 4

        (record,) = sky_boundary.queue()
        job = sky_boundary.summary(record.job_id)
        task = yaml.safe_load((Path(job["job_dir"]) / "task.yaml").read_text())
        assert "file_mounts" not in task and "python -m verl_grpo.trainers.verl.checkpoint_sync" in task["run"]
        assert task["envs"]["VERL_GRPO_CHECKPOINT_MOUNT"] == f"{run.cfg.storage.uri}/runs/{run.run_id}/checkpoints"
        assert [e["num_nodes"] for e in job["events"] if e["event"] == "task_launched"] == [2, 2]  # fresh nodes
        assert [e["step"] for e in job["events"] if e["event"] == "preempted"] == [2]

        log = (Path(job["job_dir"]) / "run.log").read_text().splitlines()
        restored = [int(m[1]) if m[1] else 0 for line in log if (m := STARTS.match(line))]
        assert restored[0] == 0 and restored[-1] == 2, restored  # the recovery resumed the committed step 2
        worker_restores = [line for line in log if line.startswith("(verl-grpo") and "checkpoint" in line
                           and ("restored" in line or "no committed" in line)]
        assert "no committed checkpoint" in worker_restores[0] and "restored checkpoint step 2" in worker_restores[-1]
        head_sync = next(Path(job["job_dir"]).glob("attempt-2/*/node-0/tmp/**/checkpoint-sync.log")).read_text()
        assert "already in the store" in head_sync and "uploaded global_step_4/" in head_sync
        assert "global_step_2/" not in head_sync.split("already in the store")[1]  # restored, not uploaded again
        steps: dict[int, str] = {}
        for line in log:
            if m := PROMPTS.match(line):
                assert steps.setdefault(int(m[1]), m[2]) == m[2]  # a step retrained after the resume sees its prompts
        assert sorted(steps) == [1, 2, 3, 4]
        trained = [p for s in sorted(steps) for p in steps[s].split(",")]
        assert len(trained) == len(set(trained)) == 4 * 2

        store = Store.from_config(run.cfg.storage)
        checkpoints = CheckpointStore(store)
        assert checkpoints.steps(run.run_id) == [2, 4]
        for step in (2, 4):  # committed in place: the manifest lists every file the nodes' syncs uploaded
            manifest = checkpoints.manifest(run.run_id, step)
            assert manifest is not None and "data.pt" in {e["path"] for e in manifest["files"]}
        assert checkpoints.latest_complete(run.run_id).step == 4
