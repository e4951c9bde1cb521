"""MBPP ground truth, code extraction and the non-executing components."""

import json

import pytest

from verl_grpo.errors import DataError
from verl_grpo.rewards import mbpp
from verl_grpo.rewards.common import parse_response
from verl_grpo.rewards.mbpp import compute_score, extract_code, parse_ground_truth

CODE = "def add(a, b):\n    return a + b"
TRUTH = {"test_list": ["assert add(1, 2) == 3"], "test_setup_code": "", "challenge_test_list": []}


def fmt(body: str) -> str:
    return f"<think>Easy.</think>\n<answer>\n```python\n{body}\n```\n</answer>"


def test_ground_truth_json_or_dict():
    assert parse_ground_truth(json.dumps(TRUTH)).test_list == TRUTH["test_list"]
    assert parse_ground_truth(TRUTH).setup_code == ""


@pytest.mark.parametrize(
    ("truth", "field"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ({"test_list": []}, "test_list"),
        ({"test_list": "assert 1"}, "test_list"),
        ({"test_list": ["assert 1"], "test_setup_code": 3}, "test_setup_code"),
    ],
)
def test_bad_ground_truth_names_the_field(truth, field):
    with pytest.raises(DataError, match=field):
        parse_ground_truth(truth)


def test_extract_code_variants():
    assert extract_code(parse_response(fmt(CODE))) == CODE
    assert extract_code(parse_response(f"<answer>{CODE}</answer>")) == CODE
    assert extract_code(parse_response(f"Here:\n```python\nx = 1\n```\nand\n```py\n{CODE}\n```")) == CODE
    assert extract_code(parse_response("no code at all")) is None


def test_unparseable_code_is_not_run(monkeypatch):
    def fail(*_a, **_k):
        raise AssertionError("the pool must not be used for code that does not parse")

    monkeypatch.setattr(mbpp, "get_pool", fail)
    result = compute_score(fmt("def add(a, b) return a + b"), TRUTH)
    assert result["syntax"] == 0.0 and result["test_pass_rate"] == 0.0
    assert result["format"] == 1.0 and result["thinking"] == 1.0
    assert result["score"] == pytest.approx(0.2)
    assert result["reason"] == "code does not parse"


def test_weights():
    assert mbpp.WEIGHTS == {"test_pass_rate": 0.7, "syntax": 0.1, "format": 0.1, "thinking": 0.1}
