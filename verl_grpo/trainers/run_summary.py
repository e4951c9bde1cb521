"""One `TrainResult.summary` vocabulary for every backend (`final_reward`, `final_loss`, `mean_reward`, …), built by
`summarize` from the run's per-step metrics and each backend's `SummaryNames`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_grpo.rewards.user_reward import FAILED_METRIC


@dataclass(frozen=True)
class SummaryNames:
    """How one backend's metric names become `TrainResult.summary` names."""

    final: Mapping[str, str]
    """Metric of the last training step → its summary name."""
    reward: str
    """The per-step reward; its mean over all training steps is `mean_reward`."""
    final_prefixes: Mapping[str, str] = field(default_factory=dict)
    """Metric-name prefix → the prefix its summary name gets (`rewards/` → `final_rewards/`)."""
    first_step: int = 0
    """Records of earlier steps are not training steps (verl logs its initial validation as step 0)."""
    totals: tuple[str, ...] = ()
    """Run totals the trainer reports at the end, kept under their own names (HF's `train_runtime`, …)."""
    sums: Mapping[str, str] = field(default_factory=lambda: {FAILED_METRIC: "reward_failed_rows"})
    """Per-step counts summed over the training steps → the sum's summary name (rows a user's reward failed on)."""

    def summary_name(self, key: str) -> str | None:
        if key in self.final:
            return self.final[key]
        for prefix, renamed in self.final_prefixes.items():
            if key.startswith(prefix):
                return renamed + key[len(prefix):]
        return None


def summarize(records: Sequence[Mapping[str, Any]], names: SummaryNames,
              totals: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Last-training-step metrics under their summary names, the mean reward over all steps, and the run totals."""
    out: dict[str, float] = {}
    train = [r for r in records if r["step"] >= names.first_step]
    if train:
        for key, value in train[-1].items():
            name = names.summary_name(key)
            if name is not None and _is_number(value):
                out[name] = float(value)
        rewards = [r[names.reward] for r in train if _is_number(r.get(names.reward))]
        if rewards:
            out["mean_reward"] = sum(rewards) / len(rewards)
        for key, name in names.sums.items():
            counts = [float(r[key]) for r in train if _is_number(r.get(key))]
            if counts:
                out[name] = sum(counts)
    for key in names.totals:
        value = (totals or {}).get(key)
        if _is_number(value):
            out[key] = float(value)
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float))
