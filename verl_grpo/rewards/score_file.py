"""Score a JSONL file of responses (backs `verl-grpo score --dataset NAME FILE.jsonl`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from verl_grpo.errors import DataError
from verl_grpo.rewards.scoring import compute_score, dataset_of


def score_file(dataset: str, path: Path) -> Iterator[dict]:
    """Each line `{solution_str, ground_truth[, extra_info]}` → the same object plus `"score": {...}`.

    A line that cannot be scored yields `{"line": N, "error": "..."}` and scoring goes on.
    Raises ValueError for an unknown dataset and DataError for a missing file, before reading anything.
    """
    dataset_of(dataset)
    path = Path(path)
    if not path.is_file():
        raise DataError(f"responses file {path} not found; pass a JSONL file of {{solution_str, ground_truth}} lines")
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            yield _score_line(dataset, line, number)


def _score_line(dataset: str, line: str, number: int) -> dict:
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
    try:
        score = compute_score(dataset, row["solution_str"], row["ground_truth"], row.get("extra_info"))
    except DataError as e:
        return {"line": number, "error": f"line {number}: {e}"}
    return {**row, "score": score}
