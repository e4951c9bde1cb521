"""The verl row format, the records builders pass around, and the rejection reasons.

A prepared parquet row is exactly what verl's `RLHFDataset` and reward manager expect
(see verl's examples/data_preprocess/gsm8k.py):

    data_source   str                      "gsm8k" | "math" | "mbpp" | "squad" | "searchR1_<source>" (nq_hotpotqa's
                                           rows, as verl tags them) | "reasoning_gym/<generator>" | a custom task's
                                           dataset.task; the reward dispatcher keys on it
    prompt        list<{role, content}>    system message (optional) + user message
    ability       str                      "math" | "code" | "qa" | "reasoning" | "custom"
    reward_model  {style: "rule", ground_truth: str}  (squad, nq_hotpotqa: Search-R1's {"target": [answers]} as JSON)
    extra_info    struct                   split, index, uid + the dataset's raw fields (fixed per dataset)

With the Search-R1 tool on (`retrieval` in services.enabled), rows also carry what verl's tool loop reads:

    agent_name                str          "tool_agent" (verl's AgentLoopManager picks the loop per row by it)
    extra_info.tools_kwargs   struct       {search: {create_kwargs: {data_source}}} (passed to the tool's create)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import pyarrow as pa

BUILDER_VERSION = "1"
"""Bump when any builder's output for the same input changes; it is part of every dataset hash."""

OUTPUT_SPLITS = ("train", "val", "test")


class Reason(StrEnum):
    """Why a raw row was quarantined into rejected.parquet."""

    INVALID_JSON = "invalid_json"
    MISSING_QUESTION = "missing_question"
    MISSING_ANSWER = "missing_answer"
    NON_NUMERIC_ANSWER = "non_numeric_answer"
    MISSING_BOXED = "missing_boxed"
    INVALID_TASK_ID = "invalid_task_id"
    DUPLICATE_ID = "duplicate_id"
    MISSING_TESTS = "missing_tests"
    INVALID_TESTS = "invalid_tests"
    PROMPT_TOO_LONG = "prompt_too_long"
    IN_TRAIN = "in_train"
    """A generated held-out row asking a question a train row asks (reasoning_gym)."""
    DUPLICATE_QUESTION = "duplicate_question"
    """A generated held-out row asking the question of an earlier held-out row (reasoning_gym)."""


class RowRejected(Exception):
    """Raised by a builder for a raw row it cannot turn into a problem."""

    def __init__(self, reason: Reason, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class RawRecord:
    """One row as read from the source, before any validation."""

    split: str
    """The source's own split (`train`/`test` file, or `all` when the builder assigns splits itself)."""
    position: int
    """0-based row position within its source split (line number among non-blank lines, member order)."""
    uid: str
    """Stable source identifier (e.g. `train/17`, `train/algebra/1.json`, `test/precalculus/807.json`)."""
    raw: str
    """The original row text, kept verbatim for rejected.parquet."""
    data: Any = None
    """Parsed JSON value; None when `error` is set."""
    error: str | None = None
    """Why the row could not even be parsed."""


@dataclass
class Problem:
    """A validated problem: everything needed for a verl row except the rendered prompt."""

    uid: str
    split: str
    question: str
    ground_truth: str
    extra: dict[str, Any] = field(default_factory=dict)
    position: int = 0
    data_source: str | None = None
    """The row's data_source when it is not the dataset's name (Search-R1's rows: `searchR1_<source>`)."""


def rejection_row(record: RawRecord, reason: Reason | str, detail: str) -> dict[str, Any]:
    return {
        "split": record.split,
        "position": record.position,
        "uid": record.uid,
        "reason": str(reason),
        "detail": detail,
        "row": record.raw,
    }


REJECTED_SCHEMA = pa.schema(
    [
        ("split", pa.string()),
        ("position", pa.int64()),
        ("uid", pa.string()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("row", pa.string()),
    ]
)

MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
COMMON_EXTRA = [("split", pa.string()), ("index", pa.int64()), ("uid", pa.string())]
TOOL_AGENT = "tool_agent"
"""verl's multi-turn tool loop (`verl.experimental.agent_loop.tool_agent_loop`), by its registered name."""
SEARCH_TOOL = "search"
"""The tool's name in infra/verl/search_tool.yaml (and the TRL tool function's name)."""
TOOLS_KWARGS = pa.struct([(SEARCH_TOOL, pa.struct([("create_kwargs", pa.struct([("data_source", pa.string())]))]))])


def row_schema(extra_fields: list[tuple[str, pa.DataType]], tool_agent: bool = False) -> pa.Schema:
    """The parquet schema of one dataset: fixed so every split (even an empty one) has the same types."""
    extra = COMMON_EXTRA + list(extra_fields) + ([("tools_kwargs", TOOLS_KWARGS)] if tool_agent else [])
    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(MESSAGE)),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            ("extra_info", pa.struct(extra)),
            *([("agent_name", pa.string())] if tool_agent else []),
        ]
    )


def verl_row(
    data_source: str, ability: str, messages: list[dict[str, str]], problem: Problem, split: str, index: int,
    tool_agent: bool = False,
) -> dict[str, Any]:
    row = {
        "data_source": data_source,
        "prompt": messages,
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": problem.ground_truth},
        "extra_info": {"split": split, "index": index, "uid": problem.uid, **problem.extra},
    }
    if tool_agent:
        row["extra_info"]["tools_kwargs"] = {SEARCH_TOOL: {"create_kwargs": {"data_source": data_source}}}
        row["agent_name"] = TOOL_AGENT
    return row


def non_empty_str(data: dict[str, Any], key: str, reason: Reason) -> str:
    """`data[key]` as a non-blank string, or RowRejected(reason)."""
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        got = "missing" if value is None else f"{type(value).__name__} {str(value)[:40]!r}"
        raise RowRejected(reason, f"field {key!r} must be a non-empty string (got {got})")
    return value


def require_object(record: RawRecord) -> dict[str, Any]:
    """The parsed row as a dict, or RowRejected(INVALID_JSON)."""
    if record.error is not None:
        raise RowRejected(Reason.INVALID_JSON, record.error)
    if not isinstance(record.data, dict):
        raise RowRejected(Reason.INVALID_JSON, f"row is a JSON {type(record.data).__name__}, not an object")
    return record.data
