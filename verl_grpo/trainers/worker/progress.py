"""A local worker's (trl, loop) progress line, `step k/N reward=… tied=… r.correctness=… len=… clip=… loss=…`:
written per logged step, parsed back.

The orchestrator streams the worker's stdout and turns these lines into TrainProgress, whose metrics carry the
record's own names (the signal vocabulary of verl_grpo.trainers.signal); writer and parser live together so the
format has one owner.
"""

from __future__ import annotations

import re
from typing import Any

from verl_grpo.rewards.user_reward import FAILED_METRIC
from verl_grpo.trainers.protocol import TrainProgress, numbers
from verl_grpo.trainers.signal import CLIPPED_RATIO, MEAN_LENGTH, TIED_GROUP_SHARE, component_key, components

LABELS = (("reward", "reward"), ("reward_std", "reward_std"), (TIED_GROUP_SHARE, "tied"), (MEAN_LENGTH, "len"),
          (CLIPPED_RATIO, "clip"), ("loss", "loss"), ("kl", "kl"), (FAILED_METRIC, "failed"), ("step_time", "s/step"))
"""Metric → its label in the line, in line order; the reward components go after `tied`, as COMPONENT + name."""
COMPONENT = "r."
"""Label prefix of a reward component's mean (`rewards/correctness/mean` → `r.correctness`)."""
_KEYS = {label: key for key, label in LABELS}
STEP_LINE = re.compile(r"^step (?P<step>\d+)/(?P<total>\d+)(?P<rest>(?: \S+=\S+)*)\s*$")


def progress_line(record: dict[str, Any], total_steps: int) -> str:
    """`step k/N reward=… loss=… s/step=…`: the single line the orchestrator streams."""
    parts = [f"step {record['step']}/{total_steps}"]
    for key, label in LABELS:
        value = record.get(key)
        if isinstance(value, (int, float)):
            parts.append(f"{label}={value:.4g}")
        if key == TIED_GROUP_SHARE:
            parts += [f"{COMPONENT}{name}={value:.4g}" for name, value in components(record).items()]
    return " ".join(parts)


def parse_progress(line: str, total_steps: int) -> TrainProgress | None:
    """The TrainProgress of a progress line (its own `/N` is the total), or None for any other line."""
    if match := STEP_LINE.match(line.strip()):
        pairs = numbers(pair.split("=", 1) for pair in match["rest"].split())
        metrics = {_key(label): value for label, value in pairs.items()}
        return TrainProgress(int(match["step"]), int(match["total"]), metrics.get("reward"), metrics)
    return None


def _key(label: str) -> str:
    if label.startswith(COMPONENT):
        return component_key(label[len(COMPONENT):])
    return _KEYS.get(label, label)
