"""A verl run's training samples: verl's own rollout dumps, kept the way the run's metrics are.

With trainer.log_samples_every > 0 the launch sets verl's `trainer.rollout_data_dir` to `<checkpoint dir>-rollouts`
(beside the checkpoint dir, so no checkpoint sync uploads it). verl's trainer writes every rollout of each step there
as `{step}.jsonl` (`RayPPOTrainer._write_generations`: input, output, gts, score, step and the reward function's
extra fields, one line per rollout, a prompt's rollouts consecutive). Like metrics.jsonl, samples.jsonl travels
inside each checkpoint and comes back as a history on restore. Each commit keeps of the earlier dumps only the lines
samples.jsonl reads (the first whole groups of sampled steps), so the node's disk does not fill with every rollout.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_grpo.trainers.worker.metrics import read_metrics
from verl_grpo.trainers.worker.samples import Sample, first_groups, group_advantages, sampled_step, score_components

ENV_SAMPLES = "VERL_GRPO_SAMPLES"
"""`every,per_step,group_size`: trainer.log_samples_every, trainer.samples_per_step and algorithm.rollouts."""
DUMP_FIELDS = frozenset({"input", "output", "gts", "score", "step", "request_id"})
"""The fields verl writes for every rollout; the others come from the reward function's score dict."""


@dataclass(frozen=True)
class SamplesPlan:
    every: int
    per_step: int
    group_size: int

    @classmethod
    def of(cls, cfg: Any) -> SamplesPlan | None:
        every = cfg.trainer.log_samples_every
        return cls(every, cfg.trainer.samples_per_step, cfg.algorithm.rollouts) if every else None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SamplesPlan | None:
        raw = env.get(ENV_SAMPLES)
        if not raw:
            return None
        every, per_step, group_size = (int(x) for x in raw.split(","))
        return cls(every, per_step, group_size)

    def env(self) -> dict[str, str]:
        return {ENV_SAMPLES: f"{self.every},{self.per_step},{self.group_size}"}

    @property
    def lines_kept(self) -> int:
        """The dump lines samples.jsonl reads from a sampled step: the first whole groups holding per_step."""
        return math.ceil(self.per_step / self.group_size) * self.group_size


def rollout_dir(checkpoint_dir: str | Path) -> Path:
    """verl's trainer.rollout_data_dir for a run whose trainer.default_local_dir is checkpoint_dir."""
    return Path(f"{checkpoint_dir}-rollouts")


def dump_steps(directory: Path) -> dict[int, Path]:
    """The `{step}.jsonl` dumps in directory, by step."""
    if not directory.is_dir():
        return {}
    return {int(p.stem): p for p in directory.glob("*.jsonl") if p.stem.isdigit()}


def dump_samples(path: Path, plan: SamplesPlan) -> list[Sample]:
    """The first whole groups of one step's dump as Samples, with GRPO's group-normalised advantages."""
    entries = []
    with open(path) as f:
        for line in f:
            if len(entries) >= plan.lines_kept:
                break
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                break  # the line verl's writer thread is still writing
    groups = [entries[i:i + plan.group_size] for i in range(0, len(entries), plan.group_size)]
    return first_groups([_group(g) for g in groups], plan.per_step)


def merged_samples(history: Path, dumps: Path, plan: SamplesPlan | None, upto_step: int | None = None
                   ) -> list[dict[str, Any]]:
    """History (earlier processes) + this process's dumps of sampled steps, one record per step (later wins)."""
    by_step = {r["step"]: r for r in read_metrics(history) if upto_step is None or r["step"] <= upto_step}
    if plan is not None:
        for step, path in sorted(dump_steps(dumps).items()):
            if (upto_step is None or step <= upto_step) and sampled_step(step, plan.every):
                if samples := dump_samples(path, plan):
                    by_step[step] = {"step": step, "samples": [s.record() for s in samples]}
    return [by_step[s] for s in sorted(by_step)]


def trim_dumps(dumps: Path, plan: SamplesPlan | None, before_step: int) -> None:
    """Keep of each dump before before_step only what samples.jsonl reads (nothing without a plan: the dumps were
    only read for reward metrics); verl's writer thread may still be on the current step's, which stays whole."""
    for step, path in dump_steps(dumps).items():
        if step >= before_step:
            continue
        if plan is None or not sampled_step(step, plan.every):
            path.unlink(missing_ok=True)
            continue
        with open(path) as f:
            head = [line for _, line in zip(range(plan.lines_kept + 1), f, strict=False)]
        if len(head) > plan.lines_kept:
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text("".join(head[: plan.lines_kept]))
            os.replace(tmp, path)


def _group(entries: list[dict[str, Any]]) -> list[Sample]:
    scores = [float(e.get("score") or 0.0) for e in entries]
    return [Sample(prompt=str(e.get("input", "")), response=str(e.get("output", "")), reward=score,
                   advantage=advantage, truncated=None, components=score_components(e, skip=DUMP_FIELDS))
            for e, score, advantage in zip(entries, scores, group_advantages(scores), strict=True)]
