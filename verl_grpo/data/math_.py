"""MATH (Hendrycks et al.): train = the 7,500 original train problems, test = MATH-500.

Train ground truth is the content of the last `\\boxed{...}` of the worked solution; MATH-500 ships an
`answer` field, used as is.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from verl_grpo.data.schema import Problem, RawRecord, Reason, RowRejected, non_empty_str, require_object
from verl_grpo.data.sources import DatasetBuilder, HubSplit, read_jsonl, read_tar_json
from verl_grpo.latex import last_boxed

TRAIN_TARBALL = "hendrycks_MATH_train.tar.gz"
TEST_FILE = "test.jsonl"
HUB_TRAIN_ID = "DigitalLearningGmbH/MATH-lighteval"
HUB_TEST_ID = "HuggingFaceH4/MATH-500"
_LEVEL = re.compile(r"Level\s+(\d+)")


def parse_level(value: Any) -> int | None:
    """`5`, `"5"` or `"Level 5"` → 5; anything else (e.g. `"Level ?"`) → None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        m = _LEVEL.fullmatch(value.strip()) or re.fullmatch(r"(\d+)", value.strip())
        return int(m.group(1)) if m else None
    return None


def to_problem(record: RawRecord) -> Problem:
    data = require_object(record)
    problem = non_empty_str(data, "problem", Reason.MISSING_QUESTION)
    solution = data.get("solution") if isinstance(data.get("solution"), str) else ""
    if record.split == "test":
        answer = non_empty_str(data, "answer", Reason.MISSING_ANSWER).strip()
        subject = data.get("subject")
        uid = data.get("unique_id") if isinstance(data.get("unique_id"), str) and data["unique_id"] else record.uid
    else:
        if not solution.strip():
            raise RowRejected(Reason.MISSING_BOXED, "field 'solution' is missing or empty, so it has no \\boxed{}")
        boxed = last_boxed(solution)
        if boxed is None:
            raise RowRejected(Reason.MISSING_BOXED, "solution has no complete \\boxed{...}")
        if not boxed.strip():
            raise RowRejected(Reason.MISSING_BOXED, "the last \\boxed{} of the solution is empty")
        answer = boxed.strip()
        subject = data.get("type")
        uid = record.uid
    return Problem(
        uid=uid,
        split=record.split,
        question=problem.strip(),
        ground_truth=answer,
        extra={
            "problem": problem,
            "solution": solution,
            "answer": answer,
            "level": parse_level(data.get("level")),
            "subject": subject if isinstance(subject, str) else "",
        },
        position=record.position,
    )


def read_mirror(mirror: Path) -> list[RawRecord]:
    return read_tar_json(mirror / TRAIN_TARBALL, "train") + read_jsonl(mirror / TEST_FILE, "test")


def hub_splits(hub_id: str | None) -> list[HubSplit]:
    """`dataset.hub_id` replaces the train source; the test split is always MATH-500."""
    return [
        HubSplit(hub_id or HUB_TRAIN_ID, None if hub_id else "default", "train", "train"),
        HubSplit(HUB_TEST_ID, None, "test", "test"),
    ]


BUILDER = DatasetBuilder(
    name="math",
    ability="math",
    mirror_files=(TRAIN_TARBALL, TEST_FILE),
    read_mirror=read_mirror,
    hub_splits=hub_splits,
    to_problem=to_problem,
    extra_fields=[
        ("problem", pa.string()),
        ("solution", pa.string()),
        ("answer", pa.string()),
        ("level", pa.int64()),
        ("subject", pa.string()),
    ],
    has_validation=False,
)
