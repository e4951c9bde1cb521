"""MBPP (Mostly Basic Python Problems): the standard splits by task_id, tests as the ground truth.

Splits (upstream README): 1–10 few-shot prompts, 11–510 test, 511–600 validation, 601–974 train.
The ground truth is a JSON string `{"test_list", "test_setup_code", "challenge_test_list"}` that the
code scorer executes. The user prompt shows the first test, as the MBPP paper does, so the model
learns the function name and signature the tests call.
"""

from __future__ import annotations

import ast
import builtins
import json
import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa

from verl_grpo.data.schema import Problem, RawRecord, Reason, RowRejected, non_empty_str, require_object
from verl_grpo.data.sources import DatasetBuilder, HubSplit, read_jsonl

HUB_ID = "google-research-datasets/mbpp"
MIRROR_FILE = "mbpp.jsonl"
TASK_SPLITS = (("prompt", 1, 10), ("test", 11, 510), ("val", 511, 600), ("train", 601, 974))
TEST_INSTRUCTION = "Your code should pass this test:"


def split_of(task_id: int) -> str | None:
    """The standard split of a task_id (`val` for upstream's validation), None outside 1–974."""
    for split, lo, hi in TASK_SPLITS:
        if lo <= task_id <= hi:
            return split
    return None


def parse_quietly(source: str) -> ast.Module:
    """`ast.parse` without the invalid-escape warnings that many MBPP strings (regexes like "\\d") trigger."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))
        try:
            return ast.parse(source)
        except ValueError as e:  # null bytes: Python 3.11 raises ValueError, later versions SyntaxError
            raise SyntaxError(str(e)) from None


def check_assert(test: str) -> ast.Assert:
    """A test line must parse as exactly one `assert` statement."""
    try:
        tree = parse_quietly(test)
    except SyntaxError as e:
        raise RowRejected(Reason.INVALID_TESTS, f"test {test[:60]!r} does not parse: {e.msg}") from None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        raise RowRejected(Reason.INVALID_TESTS, f"test {test[:60]!r} is not a single assert statement")
    return tree.body[0]


def entry_point(test: ast.Assert, code: str) -> str | None:
    """The function a test calls: the first called name the reference code defines, else the first non-builtin."""
    calls = sorted(
        (n for n in ast.walk(test) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)),
        key=lambda n: (n.lineno, n.col_offset),
    )
    names = [c.func.id for c in calls]  # type: ignore[attr-defined]
    try:
        defined = {n.name for n in ast.walk(parse_quietly(code)) if isinstance(n, ast.FunctionDef)}
    except SyntaxError:
        defined = set()
    for name in names:
        if name in defined:
            return name
    return next((name for name in names if not hasattr(builtins, name)), None)


def _str_list(data: dict[str, Any], key: str) -> list[str]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise RowRejected(Reason.INVALID_TESTS, f"field {key!r} must be a list of strings")
    return value


def to_problem(record: RawRecord) -> Problem:
    data = require_object(record)
    task_id = data.get("task_id")
    if not isinstance(task_id, int) or isinstance(task_id, bool) or split_of(task_id) is None:
        raise RowRejected(Reason.INVALID_TASK_ID, f"task_id must be an integer in 1–974 (got {task_id!r})")
    text = non_empty_str(data, "text", Reason.MISSING_QUESTION)
    tests = _str_list(data, "test_list")
    if not [t for t in tests if t.strip()]:
        raise RowRejected(Reason.MISSING_TESTS, "field 'test_list' is missing or empty")
    challenge = _str_list(data, "challenge_test_list")
    first = [check_assert(t) for t in tests][0]
    for t in challenge:
        check_assert(t)
    setup = data.get("test_setup_code") or ""
    if not isinstance(setup, str):
        raise RowRejected(Reason.INVALID_TESTS, "field 'test_setup_code' must be a string")
    try:
        parse_quietly(setup)
    except SyntaxError as e:
        raise RowRejected(Reason.INVALID_TESTS, f"test_setup_code does not parse: {e.msg}") from None
    code = data.get("code") if isinstance(data.get("code"), str) else ""
    func = entry_point(first, code)
    if func is None:
        raise RowRejected(Reason.INVALID_TESTS, f"first test {tests[0][:60]!r} calls no function to implement")
    ground_truth = json.dumps({"test_list": tests, "test_setup_code": setup, "challenge_test_list": challenge})
    return Problem(
        uid=f"task/{task_id}",
        split=split_of(task_id) or "",
        question=f"{text.strip()}\n{TEST_INSTRUCTION}\n{tests[0].strip()}",
        ground_truth=ground_truth,
        extra={
            "task_id": task_id,
            "text": text,
            "code": code,
            "entry_point": func,
            "test_list": tests,
            "test_setup_code": setup,
            "challenge_test_list": challenge,
        },
        position=record.position,
    )


def read_mirror(mirror: Path) -> list[RawRecord]:
    return read_jsonl(mirror / MIRROR_FILE, "all")


def hub_splits(hub_id: str | None) -> list[HubSplit]:
    """All four upstream splits; rows are re-assigned by task_id, so the hub and the mirror agree."""
    hub = hub_id or HUB_ID
    return [HubSplit(hub, "full", s, "all") for s in ("train", "validation", "test", "prompt")]


BUILDER = DatasetBuilder(
    name="mbpp",
    ability="code",
    mirror_files=(MIRROR_FILE,),
    read_mirror=read_mirror,
    hub_splits=hub_splits,
    to_problem=to_problem,
    extra_fields=[
        ("task_id", pa.int64()),
        ("text", pa.string()),
        ("code", pa.string()),
        ("entry_point", pa.string()),
        ("test_list", pa.list_(pa.string())),
        ("test_setup_code", pa.string()),
        ("challenge_test_list", pa.list_(pa.string())),
    ],
    has_validation=True,
)
