"""A verl step's reward metrics, read from verl's rollout dump of that step.

verl logs no per-component reward means and no count of failed reward calls (its reward loop keeps the score dicts in
the batch, `metrics.common_figures`), but its rollout dump (`trainer.rollout_data_dir`, `{step}.jsonl`) holds every
rollout's whole score dict. Each dump is read once, whole, before a commit trims it (`commit.write_step_logs`) and at
finalize, into `reward-metrics.jsonl` beside the node's metrics: `rewards/<key>/mean` of each numeric key of the
score dicts and, for a run scored by its own function, `reward/failed` (the rows whose call failed and scored 0),
TRL's names (`rewards.user_reward.step_metrics`). `metrics.merged_metrics` adds them to the step's record; a restore
keeps those of the restored steps only, whose dumps are trimmed by then (the history carries them too).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from verl_grpo.rewards.user_reward import FAILED, step_metrics
from verl_grpo.trainers.atomic_files import write_jsonl_atomic
from verl_grpo.trainers.verl.samples import DUMP_FIELDS, dump_steps
from verl_grpo.trainers.worker.metrics import read_metrics

REWARD_METRICS_FILE = "reward-metrics.jsonl"


def dump_metrics(path: Path) -> dict[str, float]:
    """The step metrics of one whole dump's rows ({} for an empty one); `reward/failed` only when the rows say
    whether their call failed (a run scored by its own function)."""
    rows: list[dict[str, Any]] = []
    with open(path) as f:
        for line in f:
            try:
                rows.append({k: v for k, v in json.loads(line).items() if k not in DUMP_FIELDS})
            except json.JSONDecodeError:
                break
    if not rows:
        return {}
    return step_metrics(rows, count_failures=any(FAILED in row for row in rows))


def metrics_path(metrics_dir: Path) -> Path:
    return Path(metrics_dir) / REWARD_METRICS_FILE


def recorded(metrics_dir: Path) -> dict[int, dict[str, Any]]:
    """The recorded steps' reward metrics, by step."""
    return {int(r["step"]): r for r in read_metrics(metrics_path(metrics_dir))}


def record(metrics_dir: Path, dumps: Path, before_step: int | None = None) -> dict[int, dict[str, Any]]:
    """Read each dump of a step before `before_step` (every dump: None) not yet recorded; returns every recorded
    step's metrics."""
    done = recorded(metrics_dir)
    new = {step: {"step": step, **dump_metrics(path)} for step, path in sorted(dump_steps(dumps).items())
           if step not in done and (before_step is None or step < before_step)}
    if new:
        done.update(new)
        write_jsonl_atomic(metrics_path(metrics_dir), [done[s] for s in sorted(done)])
    return done


def keep_upto(metrics_dir: Path, step: int | None) -> None:
    """After a restore: keep the reward metrics of steps up to the restored one (None: none)."""
    done = recorded(metrics_dir)
    if done:
        write_jsonl_atomic(metrics_path(metrics_dir), [done[s] for s in sorted(done) if step is not None and s <= step])
