"""A 2-node verl run on the local rehearsal of SkyPilot, through the pipeline's own calls (resolve, prepare,
provision, train): every node's checkpoint sync uploads its checkpoint dir with the task's secrets (no bucket mount),
commits write manifests in place, an injected preemption kills both nodes, and the recovery on fresh nodes restores
the last committed step onto every node and resumes from it with no step lost or trained twice.

The run is a task of the user's own (dataset.name=custom), its rows in one temp dir and its reward file in another,
both outside the checkout: the file reaches every node through the store, verl's reward loader on the head calls it
there, its components are the steps' metrics, and the rows whose call raises score 0 and are counted."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from verl_grpo import plain_steps
from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.config import load_config
from verl_grpo.data.prepare import load_split
from verl_grpo.store import Store
from verl_grpo_rehearsal import sky_boundary
from verl_grpo_rehearsal.session import rehearsal_session

pytestmark = pytest.mark.e2e

CONFIGS = ["local"]
FAILING = ("13", "17")
"""Answers whose rows the user's reward raises on: each such row's rollouts score 0 and count as failed."""
REWARD = f'''import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if ground_truth in {FAILING!r}:
        raise ValueError("no verdict for " + ground_truth)
    block = re.search(r"<answer>(.*?)</answer>", solution_str, re.S)
    exact = float(bool(block) and block.group(1).strip() == ground_truth)
    return {{"score": exact + 0.1 * bool(block), "exact": exact, "has_block": float(bool(block))}}
'''


def own_task(tmp_path: Path) -> list[str]:
    """A custom task wholly outside the checkout: 9 train rows (1 carved off for validation), 2 test rows."""
    data, reward = tmp_path / "rows", tmp_path / "reward"
    data.mkdir()
    reward.mkdir()
    answers = ["5", "8", "13", "9", "12", "17", "6", "11", "4"]
    (data / "train.jsonl").write_text("".join(json.dumps({"question": f"What is {a} + 0?", "answer": a}) + "\n"
                                              for a in answers))
    (data / "test.jsonl").write_text('{"question": "What is 2 + 2?", "answer": "4"}\n'
                                     '{"question": "What is 3 + 3?", "answer": "6"}\n')
    (reward / "score.py").write_text(REWARD)
    return ["dataset.name=custom", "dataset.task=sums", f"dataset.train_files=[{data / 'train.jsonl'}]",
            f"dataset.test_files=[{data / 'test.jsonl'}]", "dataset.val_size=1", f"reward.path={reward / 'score.py'}",
            # the stand-in scores every row in one process (verl's reward loop spreads them over its workers)
            "verl.extra_overrides=[reward.num_workers=1]"]
PROMPTS = re.compile(r"^rehearsal: step (\d+) prompts (.*)$")
STARTS = re.compile(r"^(?:restored checkpoint step (\d+) of run|no committed checkpoint of run)")


def test_two_nodes_sync_their_checkpoints_commit_and_resume_after_a_preemption(tiny_model_dir, tmp_path):
    overrides = [*own_task(tmp_path), f"model.name={tiny_model_dir}", "algorithm.total_steps=4", "algorithm.save_freq=2",
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

        # The user's reward file reached both nodes through the store and scored every rollout on the head.
        node_file = re.compile(r"reward file score\.py fetched from s3://\S+/rewards/(\w+) into (/tmp/verl-grpo/rewards/\w+)")
        fetched = [m for line in log if (m := node_file.search(line))]
        assert len(fetched) == 4 and len({m[2] for m in fetched}) == 1  # 2 nodes x 2 attempts, one content
        assert str(tmp_path) not in task["run"] and f"reward_kwargs.user_path='{fetched[0][2]}/score.py'" in " ".join(
            shlex.split(next(line for line in task["run"].splitlines() if "main_ppo" in line)))
        failure = next(line for line in log if "failed on a row, which scores 0" in line)
        assert f"{fetched[0][2]}/score.py (reward.path)" in failure and "ValueError: no verdict for 1" in failure
        metrics = [json.loads(line) for line in store.read_text("runs", run.run_id, "metrics.jsonl").splitlines()]
        # (step 2's line died with the preempted head before a commit carried it: verl logs a step after its save)
        trained_steps = [m for m in metrics if m["step"] >= 1]
        assert {m["step"] for m in trained_steps} >= {1, 3, 4}
        assert all({"rewards/exact/mean", "rewards/has_block/mean", "reward/failed"} <= set(m) for m in trained_steps)
        answers = {str(row["extra_info"]["index"]): row["reward_model"]["ground_truth"]
                   for row in load_split(dataset, "train", store).to_dict("records")}
        failed = {m["step"]: m["reward/failed"] for m in trained_steps}
        assert failed == {step: 2.0 * sum(answers[p] in FAILING for p in steps[step].split(",")) for step in failed}
        assert sum(failed.values()) > 0
