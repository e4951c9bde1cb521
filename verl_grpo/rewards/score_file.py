"""Score a JSONL file of responses (backs `verl-grpo score`): with a shipped task's scorer (`--dataset NAME`) or
with a run's (its own function, reward.path, or its task's scorer: `-c CONFIG`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from verl_grpo.errors import DataError
from verl_grpo.rewards.scoring import compute_score, dataset_of
from verl_grpo.rewards.user_reward import UserReward


def score_file(dataset: str, path: Path, user: UserReward | None = None) -> Iterator[dict]:
    """Each line `{solution_str, ground_truth[, extra_info][, data_source]}` → the same object plus `"score": {...}`
    (and, when the user's function failed on it, `"error"`: why, the row scoring 0 as in training).

    `dataset` is the data_source of lines that name none. A line that cannot be scored yields
    `{"line": N, "error": "..."}` and scoring goes on. Raises ValueError for an unknown dataset (without `user`),
    and DataError for a missing file (ConfigError for a function that cannot be imported), before reading anything.
    """
    if user is None:
        dataset_of(dataset)
    else:
        user.check()
    path = Path(path)
    if not path.is_file():
        raise DataError(f"responses file {path} not found; pass a JSONL file of {{solution_str, ground_truth}} lines")
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            yield _score_line(dataset, line, number, user)


def _score_line(dataset: str, line: str, number: int, user: UserReward | None) -> dict:
    try:
        row = json.loads(line)
    except ValueError as e:
        return {"line": number, "error": f"line {number} is not valid JSON: {e}"}
    if not isinstance(row, dict):
        return {"line": number, "error": f"line {number} must be a JSON object, got {type(row).__name__}"}
    missing = [k for k in ("solution_str", "ground_truth") if k not in row]
    if missing:
        return {"line": number, "error": f"line {number} lacks {', '.join(missing)}"}
    if not isinstance(row["solution_str"], str):
        return {"line": number, "error": f"line {number}: solution_str must be a string"}
    source: Any = row.get("data_source") or dataset
    if user is not None:
        score, error = user.score_or_error(source, row["solution_str"], row["ground_truth"], row.get("extra_info"))
        return {**row, "score": score, **({"error": f"line {number}: {error}"} if error else {})}
    try:
        score = compute_score(source, row["solution_str"], row["ground_truth"], row.get("extra_info"))
    except (DataError, ValueError) as e:
        return {"line": number, "error": f"line {number}: {e}"}
    return {**row, "score": score}
