"""Training metrics lines as the TRL backend writes them (metrics.jsonl), for the reward-curve tests."""

import json

COMPONENTS = ("correctness", "strict_format", "thinking", "answer_block", "no_trailing")


def trl_lines(steps: int, tied: bool = False, tied_share: float = 0.25) -> list[str]:
    """TRL-named metrics lines: the total and each component rise with the step; `tied`: with the share of groups
    whose rollouts all scored alike (1.0: no learning signal)."""
    lines = []
    for s in range(1, steps + 1):
        record = {"step": s, "loss": 0.1, "reward": s / 100, "reward_std": 0.2, "completions/mean_length": 60.0 + s,
                  "completions/clipped_ratio": 0.5, "prompt_indices": [1, 2],
                  **{f"rewards/{c}/mean": s / 1000 for c in COMPONENTS}, **{f"rewards/{c}/std": 0.3 for c in COMPONENTS}}
        if tied:
            record["signal/tied_group_share"] = tied_share
        lines.append(json.dumps(record))
    return lines
