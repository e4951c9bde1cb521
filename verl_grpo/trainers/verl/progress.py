"""verl's console logger line, `step:k - critic/score/mean:0.25 - actor/lr:1e-06 - …`, read back as TrainProgress."""

from __future__ import annotations

import re

from verl_grpo.trainers.protocol import TrainProgress, numbers
from verl_grpo.trainers.verl.metrics import common_figures

STEP_LINE = re.compile(r"^step:(?P<step>\d+) - (?P<rest>.*)$")
REWARD_KEYS = ("critic/score/mean", "critic/rewards/mean")
"""The step's reward: the mean task score, else the mean reward (score plus any penalties)."""


def parse_progress(line: str, total_steps: int) -> TrainProgress | None:
    """The TrainProgress of one of verl's step lines (which carry no total: `total_steps` is the run's), or None.

    Its metrics are verl's plus the signal vocabulary (`metrics.common_figures`), as in the run's metrics.jsonl.
    """
    if match := STEP_LINE.match(line.strip()):
        metrics = numbers(pair.split(":", 1) for pair in match["rest"].split(" - ") if ":" in pair)
        metrics.update(common_figures(metrics))
        reward = next((metrics[k] for k in REWARD_KEYS if k in metrics), None)
        return TrainProgress(int(match["step"]), total_steps, reward, metrics)
    return None
