"""GSM8K builder: final-answer extraction and row validation."""

import json

import pytest

from verl_grpo.data.gsm8k import extract_final_answer, to_problem
from verl_grpo.data.schema import RawRecord, Reason, RowRejected


def record(data=None, *, raw=None, error=None, split="train"):
    raw = raw if raw is not None else json.dumps(data)
    return RawRecord(split=split, position=3, uid=f"{split}/3", raw=raw, data=data, error=error)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("She has 3 + 4 = <<3+4=7>>7 apples.\n#### 7", "7"),
        ("#### 1,234", "1234"),
        ("#### 1,234,567", "1234567"),
        ("The loss is 5.\n#### -5", "-5"),
        ("#### -1,000", "-1000"),
        ("#### 3.75", "3.75"),
        ("#### 18 ", "18"),
        ("first #### 1\nthen\n#### 2", "2"),
    ],
)
def test_extract_final_answer(answer, expected):
    assert extract_final_answer(answer) == expected


@pytest.mark.parametrize("answer", ["no marker 42", "#### forty", "#### 5 apples", "#### ", "#### $5", "#### 1/2"])
def test_non_numeric_answers_are_rejected(answer):
    with pytest.raises(RowRejected) as exc:
        extract_final_answer(answer)
    assert exc.value.reason == Reason.NON_NUMERIC_ANSWER


def test_to_problem_keeps_raw_fields_and_ground_truth():
    p = to_problem(record({"question": "  How many?  ", "answer": "2+2=4\n#### 4"}, split="test"))
    assert (p.question, p.ground_truth, p.split, p.uid) == ("How many?", "4", "test", "test/3")
    assert p.extra == {"question": "  How many?  ", "answer": "2+2=4\n#### 4"}


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({"answer": "#### 4"}, Reason.MISSING_QUESTION),
        ({"question": "   ", "answer": "#### 4"}, Reason.MISSING_QUESTION),
        ({"question": 12, "answer": "#### 4"}, Reason.MISSING_QUESTION),
        ({"question": "q?"}, Reason.MISSING_ANSWER),
        ({"question": "q?", "answer": ""}, Reason.MISSING_ANSWER),
        ({"question": "q?", "answer": "four"}, Reason.NON_NUMERIC_ANSWER),
        (["question", "answer"], Reason.INVALID_JSON),
    ],
)
def test_invalid_rows_are_rejected_with_reason(data, reason):
    with pytest.raises(RowRejected) as exc:
        to_problem(record(data))
    assert exc.value.reason == reason


def test_unparsed_row_is_invalid_json():
    with pytest.raises(RowRejected) as exc:
        to_problem(record(raw='{"question": ', error="not valid JSON: Expecting value"))
    assert exc.value.reason == Reason.INVALID_JSON
    assert "Expecting value" in exc.value.detail
