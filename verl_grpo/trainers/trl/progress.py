"""The TRL worker's progress line, `step k/N reward=… loss=… s/step=…`: written per logged step, parsed back.

The orchestrator streams the worker's stdout and turns these lines into TrainProgress; writer and parser live
together so the format has one owner.
"""

from __future__ import annotations

import re
from typing import Any

from verl_grpo.trainers.protocol import TrainProgress, numbers

LABELS = (("reward", "reward"), ("reward_std", "reward_std"), ("loss", "loss"), ("kl", "kl"),
          ("completions/mean_length", "len"), ("step_time", "s/step"))
"""Metric → its label in the line, in line order."""
STEP_LINE = re.compile(r"^step (?P<step>\d+)/(?P<total>\d+)(?P<rest>(?: \S+=\S+)*)\s*$")


def progress_line(record: dict[str, Any], total_steps: int) -> str:
    """`step k/N reward=… loss=… s/step=…`: the single line the orchestrator streams."""
    parts = [f"step {record['step']}/{total_steps}"]
    for key, label in LABELS:
        value = record.get(key)
        if isinstance(value, (int, float)):
            parts.append(f"{label}={value:.4g}")
    return " ".join(parts)


def parse_progress(line: str, total_steps: int) -> TrainProgress | None:
    """The TrainProgress of a progress line (its own `/N` is the total), or None for any other line."""
    if match := STEP_LINE.match(line.strip()):
        metrics = numbers(pair.split("=", 1) for pair in match["rest"].split())
        return TrainProgress(int(match["step"]), int(match["total"]), metrics.get("reward"), metrics)
    return None
