"""MATH builder: last \\boxed{} extraction (nested braces, short form, \\fbox) and row validation."""

import json

import pytest

from verl_grpo.data.math_ import last_boxed, parse_level, to_problem
from verl_grpo.data.schema import RawRecord, Reason, RowRejected


def record(data, split="train", uid="train/algebra/1.json"):
    return RawRecord(split=split, position=0, uid=uid, raw=json.dumps(data), data=data)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so the answer is $\boxed{5}$.", "5"),
        (r"$\boxed{\frac{1}{2}}$", r"\frac{1}{2}"),
        (r"$\boxed{\frac{\sqrt{3}}{2^{x+1}}}$ done", r"\frac{\sqrt{3}}{2^{x+1}}"),
        (r"first \boxed{1}, finally \boxed{x^{2}}", "x^{2}"),
        (r"$\boxed{\{1,2\}}$", r"\{1,2\}"),
        (r"= \boxed {17}.$$", "17"),
        (r"our answer is $\boxed 2$.", "2"),
        (r"$x^2 + y^2 = \boxed 9$.", "9"),
        (r"\fbox{3}", "3"),
        (r"\boxed{-3}", "-3"),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize("text", ["no box here", r"\boxed{unbalanced", r"\boxed", ""])
def test_last_boxed_none(text):
    assert last_boxed(text) is None


def test_last_boxed_empty_box_is_empty_string():
    assert last_boxed(r"there are $\boxed{}$ primes") == ""


@pytest.mark.parametrize(("value", "level"), [("Level 5", 5), ("Level ?", None), (3, 3), ("2", 2), (None, None)])
def test_parse_level(value, level):
    assert parse_level(value) == level


def test_train_row_uses_last_boxed_of_solution():
    p = to_problem(record({"problem": "Find x.", "level": "Level 2", "type": "Algebra",
                           "solution": r"Try \boxed{1}. No: $x=\boxed{\frac{3}{4}}$."}))
    assert p.ground_truth == r"\frac{3}{4}"
    assert p.extra["level"] == 2 and p.extra["subject"] == "Algebra" and p.extra["answer"] == r"\frac{3}{4}"
    assert p.uid == "train/algebra/1.json" and p.split == "train"


def test_test_row_uses_answer_field_and_unique_id():
    data = {"problem": "P", "solution": r"\boxed{2}", "answer": "2", "subject": "Geometry", "level": 4,
            "unique_id": "test/geometry/12.json"}
    p = to_problem(record(data, split="test", uid="test/0"))
    got = (p.ground_truth, p.uid, p.extra["level"], p.extra["subject"])
    assert got == ("2", "test/geometry/12.json", 4, "Geometry")


@pytest.mark.parametrize(
    ("data", "split", "reason"),
    [
        ({"problem": "P", "solution": "no box"}, "train", Reason.MISSING_BOXED),
        ({"problem": "P", "solution": r"there are $\boxed{}$ of them"}, "train", Reason.MISSING_BOXED),
        ({"problem": "P"}, "train", Reason.MISSING_BOXED),
        ({"solution": r"\boxed{1}"}, "train", Reason.MISSING_QUESTION),
        ({"problem": "", "solution": r"\boxed{1}"}, "train", Reason.MISSING_QUESTION),
        ({"problem": "P", "solution": r"\boxed{1}"}, "test", Reason.MISSING_ANSWER),
        ({"problem": "P", "answer": " "}, "test", Reason.MISSING_ANSWER),
    ],
)
def test_invalid_rows(data, split, reason):
    with pytest.raises(RowRejected) as exc:
        to_problem(record(data, split=split))
    assert exc.value.reason == reason
