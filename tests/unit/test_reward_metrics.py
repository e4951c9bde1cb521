"""A verl step's reward metrics from its rollout dump: each score-dict component's mean and, for a run scored by its
own function, the failed calls; read once whole before a commit trims the dump, merged into the step's record, and
after a restore kept only for the restored steps."""

from __future__ import annotations

import json
from pathlib import Path

from verl_grpo.trainers.verl import reward_metrics
from verl_grpo.trainers.verl.metrics import merged_metrics
from verl_grpo.trainers.verl.samples import trim_dumps
from verl_grpo.trainers.verl.settings import StoreSettings


def dump(directory: Path, step: int, rows: list[dict]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{step}.jsonl"
    base = {"input": "q", "output": "a", "gts": "5", "step": step}
    path.write_text("".join(json.dumps({**base, **row}) + "\n" for row in rows))
    return path


def user_rows(failed: int, passed: int) -> list[dict]:
    return ([{"score": 0.0, "acc": 0.0, "failed": 1.0, "exact": 0.0}] * failed
            + [{"score": 1.0, "acc": 1.0, "failed": 0.0, "exact": 1.0}] * passed)


def test_a_dump_gives_the_component_means_and_the_failed_calls(tmp_path):
    assert reward_metrics.dump_metrics(dump(tmp_path, 1, user_rows(1, 3))) == \
        {"rewards/exact/mean": 0.75, "reward/failed": 1.0}
    shipped = dump(tmp_path, 2, [{"score": 0.6, "correctness": 1.0, "acc": 1.0, "pred": "5"},
                                 {"score": 0.1, "correctness": 0.0, "acc": 0.0, "pred": ""}])
    assert reward_metrics.dump_metrics(shipped) == {"rewards/correctness/mean": 0.5}  # no failed count to give
    assert reward_metrics.dump_metrics(dump(tmp_path, 3, [])) == {}


def settings(tmp_path: Path) -> StoreSettings:
    return StoreSettings(uri=f"file://{tmp_path}/store", endpoint_url=None, run_id="r",
                         checkpoint_dir=tmp_path / "ck")


def test_dumps_are_read_before_the_commit_trims_them_and_join_their_steps_records(tmp_path):
    s = settings(tmp_path)
    s.metrics_dir.mkdir(parents=True)
    s.verl_metrics_path.write_text("".join(json.dumps({"step": k, "data": {"critic/score/mean": 0.5}}) + "\n"
                                           for k in (1, 2, 3)))
    dump(s.rollout_dir, 1, user_rows(2, 2))
    dump(s.rollout_dir, 2, user_rows(0, 4))
    records = merged_metrics(s, upto_step=2)  # a commit of step 2: dump 2 may still be written
    assert [r.get("reward/failed") for r in records] == [2.0, None]
    trim_dumps(s.rollout_dir, None, before_step=2)  # without samples, a read dump is not kept
    assert sorted(p.name for p in s.rollout_dir.iterdir()) == ["2.jsonl"]
    dump(s.rollout_dir, 3, user_rows(1, 3))
    final = merged_metrics(s)  # finalize: every dump is whole
    assert [(r["step"], r["reward/failed"], r["rewards/exact/mean"]) for r in final] == \
        [(1, 2.0, 0.5), (2, 0.0, 1.0), (3, 1.0, 0.75)]


def test_a_restore_keeps_the_reward_metrics_of_the_restored_steps_only(tmp_path):
    s = settings(tmp_path)
    for step in (1, 2, 3):
        dump(s.rollout_dir, step, user_rows(step, 1))
    reward_metrics.record(s.metrics_dir, s.rollout_dir)
    reward_metrics.keep_upto(s.metrics_dir, 2)
    assert sorted(reward_metrics.recorded(s.metrics_dir)) == [1, 2]
    dump(s.rollout_dir, 3, user_rows(0, 2))  # the resumed run's step 3, recorded afresh
    assert reward_metrics.record(s.metrics_dir, s.rollout_dir)[3]["reward/failed"] == 0.0
    reward_metrics.keep_upto(s.metrics_dir, None)
    assert reward_metrics.recorded(s.metrics_dir) == {}
