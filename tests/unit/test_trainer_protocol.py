"""The worker protocol both trainer backends share: exit codes, atomic files, restore, summary."""

from __future__ import annotations

import json

import pytest

from verl_grpo.contracts import CheckpointRef
from verl_grpo.errors import ConfigError, DataError, InfraError, Preempted, TrainingError
from verl_grpo.trainers import atomic_files
from verl_grpo.trainers.atomic_files import write_json_atomic, write_jsonl_atomic, write_text_atomic
from verl_grpo.trainers.exits import exit_code
from verl_grpo.trainers.local_checkpoints import LocalCheckpoints, restore_latest
from verl_grpo.trainers.run_summary import SummaryNames, summarize


def test_exit_codes_follow_the_error_type():
    assert [exit_code(e) for e in (ConfigError("x"), DataError("x"), InfraError("x"), Preempted("x"))] == [2, 2, 75, 75]
    assert exit_code(TrainingError("x")) == 1 and exit_code(RuntimeError("x")) == 1


def test_atomic_writes_replace_the_file_and_leave_no_temp_file(tmp_path):
    target = write_text_atomic(tmp_path / "sub" / "a.txt", "one")
    write_text_atomic(target, "two")
    write_json_atomic(tmp_path / "r.json", {"a": 1})
    write_jsonl_atomic(tmp_path / "m.jsonl", [{"step": 1}, {"step": 2}])
    assert target.read_text() == "two" and json.loads((tmp_path / "r.json").read_text()) == {"a": 1}
    assert (tmp_path / "m.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.txt", "m.jsonl", "r.json", "sub"]


def test_a_failed_atomic_write_keeps_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    target = write_text_atomic(tmp_path / "a.json", "old")

    def disk_full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic_files.os, "replace", disk_full)
    with pytest.raises(OSError):
        write_json_atomic(target, {"new": 1})
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.json"]


class FakeCheckpoints:
    """The two CheckpointStore calls restore_latest makes; the store holds step 4 with files a and b/c."""

    def __init__(self, step: int | None):
        self.step = step

    def latest_complete(self, run_id):
        return None if self.step is None else CheckpointRef(run_id=run_id, step=self.step, uri=f"mem://{self.step}")

    def restore(self, ref, local_dir):
        (local_dir / "b").mkdir(parents=True, exist_ok=True)
        (local_dir / "a").write_text("a")
        (local_dir / "b" / "c").write_text("c")
        return {"files": [{"path": "a"}, {"path": "b/c"}]}


def test_restore_keeps_only_the_stores_latest_checkpoint_and_its_listed_files(tmp_path):
    local = LocalCheckpoints(tmp_path, "checkpoint-")
    for step in (3, 4, 5):
        local.step_dir(step).mkdir(parents=True)
    (local.step_dir(4) / "stale.pt").write_text("from an interrupted save")
    (tmp_path / "checkpoint-x").mkdir()
    ref, step_dir = restore_latest(FakeCheckpoints(4), "r", local)
    assert ref.step == 4 and step_dir == local.step_dir(4) and local.steps() == [4]
    assert sorted(p.relative_to(step_dir).as_posix() for p in step_dir.rglob("*")) == ["a", "b", "b/c"]
    assert (tmp_path / "checkpoint-x").is_dir()
    assert restore_latest(FakeCheckpoints(None), "r", local) is None and local.steps() == []


def test_summary_names_map_last_step_metrics_and_average_the_reward():
    names = SummaryNames(final={"score": "final_reward", "loss": "final_loss"}, reward="score",
                         final_prefixes={"rewards/": "final_rewards/"}, first_step=1, totals=("runtime",))
    records = [{"step": 0, "score": 9.0}, {"step": 1, "score": 0.2, "loss": 1.0},
               {"step": 2, "score": 0.4, "loss": None, "rewards/fmt": 1, "other": 3.0}]
    assert summarize(records, names, {"runtime": 12, "ignored": 1.0}) == {
        "final_reward": 0.4, "final_rewards/fmt": 1.0, "mean_reward": pytest.approx(0.3), "runtime": 12.0}
    assert summarize([], names) == {}
