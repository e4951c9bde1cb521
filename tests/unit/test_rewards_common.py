"""Format components shared by the datasets."""

import pytest

from verl_grpo.rewards.common import (
    answer_block_score,
    check_weights,
    no_trailing_score,
    parse_response,
    thinking_score,
    weighted_total,
)


def test_layout_ok_only_for_exact_layout():
    assert parse_response("<think>a</think>\n<answer>1</answer>\n").layout_ok
    assert not parse_response("hi <think>a</think><answer>1</answer>").layout_ok
    assert not parse_response("<think>a</think><answer>1</answer> bye").layout_ok
    assert not parse_response("<think></think><answer>1</answer>").layout_ok
    assert not parse_response("<think>a</think><answer>1</answer><answer>2</answer>").layout_ok
    assert not parse_response("<answer>1</answer><think>a</think>").layout_ok


def test_thinking_must_precede_answer():
    assert thinking_score(parse_response("<think>a</think><answer>1</answer>")) == 1.0
    assert thinking_score(parse_response("<answer>1</answer><think>a</think>")) == 0.0
    assert thinking_score(parse_response("<think>  </think><answer>1</answer>")) == 0.0


def test_answer_block_and_trailing():
    one = parse_response("<think>a</think><answer>1</answer>")
    two = parse_response("<answer>1</answer><answer>2</answer>")
    none = parse_response("just text")
    assert answer_block_score(one) == 1.0 and answer_block_score(two) == 0.0 and answer_block_score(none) == 0.0
    assert no_trailing_score(one) == 1.0 and no_trailing_score(none) == 0.0
    assert no_trailing_score(parse_response("<answer>1</answer>\n  more")) == 0.0


def test_weighted_total_and_weight_check():
    assert weighted_total({"a": 1.0, "b": 0.0}, {"a": 0.25, "b": 0.75}) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="sum to"):
        check_weights({"a": 0.5}, "x")
