"""The held-out problems of an evaluation: read the split, pick the seeded subset, flatten each row."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from verl_grpo.contracts import DatasetVersion
from verl_grpo.data import load_split
from verl_grpo.errors import DataError
from verl_grpo.store import Store

REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")


@dataclass(frozen=True)
class EvalProblem:
    """One problem as the evaluator needs it (a verl parquet row, flattened)."""

    id: str
    """Stable problem id: `extra_info.uid` when present, else the row position in the split."""
    index: int
    data_source: str
    messages: list[dict[str, str]]
    ground_truth: str
    extra_info: dict[str, Any] = field(default_factory=dict)


def load_split_frame(dataset: DatasetVersion, split: str, store: Store) -> pd.DataFrame:
    """The split's parquet as a DataFrame, or DataError naming the split and how to get it."""
    if split not in dataset.splits:
        raise DataError(
            f"dataset {dataset.name}@{dataset.hash} has no split {split!r} (has: {', '.join(dataset.splits)}); "
            f"set eval.split to one of them"
        )
    return load_split(dataset, split, store)


def select_subset(n_rows: int, limit: int | None, seed: int) -> list[int]:
    """Row positions of the seeded subset, in ascending order (all rows when limit is None or >= n_rows).

    The subset of a given (n_rows, limit, seed) never changes, so base and trained models see the same problems.
    """
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    if limit is None or limit >= n_rows:
        return list(range(n_rows))
    if limit < 1:
        raise ValueError(f"eval.limit must be >= 1 or None, got {limit}")
    chosen = np.random.default_rng(seed).choice(n_rows, size=limit, replace=False)
    return sorted(int(i) for i in chosen)


def to_problems(frame: pd.DataFrame, positions: list[int]) -> list[EvalProblem]:
    """Flatten the chosen verl rows; DataError names the missing column."""
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise DataError(f"eval split lacks column(s) {missing}; it must be a prepared verl parquet "
                        f"(columns {', '.join(REQUIRED_COLUMNS)}, extra_info); re-run data preparation")
    problems = []
    for pos in positions:
        row = frame.iloc[pos]
        extra = _plain(row.get("extra_info")) or {}
        reward = _plain(row["reward_model"]) or {}
        if "ground_truth" not in reward:
            raise DataError(f"eval row {pos} has no reward_model.ground_truth; re-run data preparation")
        messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in _plain(row["prompt"])]
        if not messages:
            raise DataError(f"eval row {pos} has an empty prompt; re-run data preparation")
        problems.append(EvalProblem(
            id=str(extra.get("uid") or pos), index=int(extra.get("index", pos)), data_source=str(row["data_source"]),
            messages=messages, ground_truth=str(reward["ground_truth"]), extra_info=extra,
        ))
    return problems


def subset_digest(problems: list[EvalProblem]) -> str:
    """Hash of which problems (ids and gold answers) are evaluated."""
    blob = json.dumps([[p.id, p.ground_truth] for p in problems]).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _plain(value: Any) -> Any:
    """pyarrow → pandas gives numpy arrays for lists; turn them back into plain Python containers."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
