"""GSM8K: grade-school word problems; the ground truth is the number after `####`."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa

from verl_grpo.data.schema import Problem, RawRecord, Reason, RowRejected, non_empty_str, require_object
from verl_grpo.data.sources import DatasetBuilder, HubSplit, read_jsonl

HUB_ID = "openai/gsm8k"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def extract_final_answer(answer: str) -> str:
    """The number after the last `####`, commas removed (`#### 1,234` → `1234`), or RowRejected."""
    if "####" not in answer:
        raise RowRejected(Reason.NON_NUMERIC_ANSWER, "answer has no '#### <number>' line")
    final = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not _NUMBER.fullmatch(final):
        raise RowRejected(Reason.NON_NUMERIC_ANSWER, f"text after '####' is not a number: {final[:40]!r}")
    return final


def to_problem(record: RawRecord) -> Problem:
    data = require_object(record)
    question = non_empty_str(data, "question", Reason.MISSING_QUESTION)
    answer = non_empty_str(data, "answer", Reason.MISSING_ANSWER)
    return Problem(
        uid=record.uid,
        split=record.split,
        question=question.strip(),
        ground_truth=extract_final_answer(answer),
        extra={"question": question, "answer": answer},
        position=record.position,
    )


def read_mirror(mirror: Path) -> list[RawRecord]:
    return read_jsonl(mirror / "train.jsonl", "train") + read_jsonl(mirror / "test.jsonl", "test")


def hub_splits(hub_id: str | None) -> list[HubSplit]:
    hub = hub_id or HUB_ID
    return [HubSplit(hub, "main", "train", "train"), HubSplit(hub, "main", "test", "test")]


BUILDER = DatasetBuilder(
    name="gsm8k",
    ability="math",
    mirror_files=("train.jsonl", "test.jsonl"),
    read_mirror=read_mirror,
    hub_splits=hub_splits,
    to_problem=to_problem,
    extra_fields=[("question", pa.string()), ("answer", pa.string())],
    has_validation=False,
)
