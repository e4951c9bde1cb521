"""A verl run's metrics: verl's `file` logger output of this process plus the history restored with the checkpoint.

verl truncates its log at every start, so the steps of earlier processes travel inside each checkpoint
(`metrics.jsonl`) and come back as `history.jsonl` on restore.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from verl_grpo.trainers.run_summary import SummaryNames
from verl_grpo.trainers.signal import ALL_TIED, CLIPPED_RATIO, LOSS, MEAN_LENGTH, REWARD
from verl_grpo.trainers.verl import reward_metrics
from verl_grpo.trainers.verl.settings import StoreSettings


def read_records(path: Path) -> list[dict[str, Any]]:
    """Flat `{"step": N, key: value}` records of a metrics.jsonl or of verl's file logger (`{"step", "data"}`)."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError:
            continue  # the last line of a log killed mid-write
        data = raw.get("data") if isinstance(raw.get("data"), dict) else {k: v for k, v in raw.items() if k != "step"}
        out.append({"step": int(raw["step"]), **data})
    return out


def merged_metrics(settings: StoreSettings, upto_step: int | None = None) -> list[dict[str, Any]]:
    """History (earlier processes) + this process's verl log, one record per step (later wins), in step order.

    verl logs step 0's initial validation and each step's line after that step's save, so a checkpoint of
    step N carries lines up to N-1 (step N's own line reaches the store with the next save or at the end). Each
    step's reward metrics from its rollout dump (component means, failed calls: reward_metrics) join its line.
    """
    by_step: dict[int, dict[str, Any]] = {}
    for record in read_records(settings.history_path) + read_records(settings.verl_metrics_path):
        if upto_step is None or record["step"] <= upto_step:
            by_step.setdefault(record["step"], {}).update(record)
    # Dumps of steps before upto_step are whole (verl writes step N's after saving it); at the end all are.
    for step, record in reward_metrics.record(settings.metrics_dir, settings.rollout_dir, upto_step).items():
        if step in by_step and (upto_step is None or step <= upto_step):
            by_step[step].update(record)
    return [{**by_step[s], **common_figures(by_step[s])} for s in sorted(by_step)]


VERL_NAMES = {
    "critic/score/mean": REWARD,
    "actor/pg_loss": LOSS,
    "response_length/mean": MEAN_LENGTH,
    "response_length/clip_ratio": CLIPPED_RATIO,
}
"""verl 0.9.1's step metrics (verl/trainer/ppo/metric_utils.py compute_data_metrics, the actor's pg_loss) → the
signal vocabulary of verl_grpo.trainers.signal."""


def common_figures(metrics: dict[str, Any]) -> dict[str, float]:
    """A verl step's figures in the signal vocabulary: the VERL_NAMES, and ALL_TIED where it is certain.

    verl logs no tied-group share, no per-component reward means (its reward loop keeps them in the batch) and no
    zero-std figure. Every group tied for sure when every response scored the same (score max == min) or every
    advantage is exactly 0; groups tied at different scores are not caught, since GRPO's float32 mean/std leave
    advantages of up to ~0.06 there.
    """
    out = {ours: float(metrics[theirs]) for theirs, ours in VERL_NAMES.items() if _number(metrics.get(theirs))}
    score = metrics.get("critic/score/max"), metrics.get("critic/score/min")
    advantage = metrics.get("critic/advantages/max"), metrics.get("critic/advantages/min")
    if all(_number(v) for v in score) and score[0] == score[1]:
        out[ALL_TIED] = 1.0
    elif all(_number(v) for v in advantage):
        out[ALL_TIED] = 1.0 if advantage[0] == advantage[1] == 0 else 0.0
    return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


SUMMARY = SummaryNames(
    final={
        "critic/score/mean": "final_reward",
        "critic/rewards/mean": "final_rewards_mean",
        "actor/entropy": "final_entropy",
        "actor/pg_loss": "final_loss",
        "actor/kl_loss": "final_kl",
        "response_length/mean": "final_completions_mean_length",
    },
    reward="critic/score/mean",
    final_prefixes={"val-core/": "val-core/"},
    first_step=1,
)
"""verl's metric names → the summary names the TRL backend uses; step 0 is verl's initial validation."""
