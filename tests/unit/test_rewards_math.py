"""MATH extraction and Math-Verify equivalence."""

import threading

import pytest

from verl_grpo.errors import DataError
from verl_grpo.rewards import math_
from verl_grpo.rewards.common import parse_response
from verl_grpo.rewards.math_ import compute_score, extract_answer


def fmt(answer: str) -> str:
    return f"<think>Simplify.</think>\n<answer>{answer}</answer>"


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("\\frac{1}{2}", "\\frac12"),
        ("$\\frac{1}{2}$", "\\frac{1}{2}"),
        ("\\boxed{0.5}", "\\frac{1}{2}"),
        ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}"),
        ("(3, -1)", "(3,-1)"),
        ("\\$18.90", "\\$18.90"),
        ("x = 5", "5"),
    ],
)
def test_equivalent_answers(answer, truth):
    assert compute_score(fmt(answer), truth)["correctness"] == 1.0


@pytest.mark.parametrize(("answer", "truth"), [("\\frac{1}{3}", "\\frac12"), ("(3, 1)", "(3,-1)"), ("", "5")])
def test_wrong_answers(answer, truth):
    assert compute_score(fmt(answer), truth)["correctness"] == 0.0


@pytest.mark.parametrize(
    "response",
    [
        fmt("\\frac{1}{2}") + " \\boxed{3}",
        fmt("\\boxed{3} or \\boxed{\\frac12}"),
        "so \\boxed{3} and \\boxed{\\frac12}",
        "<think>t</think><answer>3</answer><answer>\\frac12</answer>",
        "\\boxed{\\frac12}" + fmt("3"),
    ],
)
def test_two_different_final_answers_are_incorrect(response):
    result = compute_score(response, "\\frac12")
    assert result["correctness"] == 0.0 and result["pred"] == ""


@pytest.mark.parametrize(
    "response",
    [
        "<think>t</think><answer>\\frac12</answer><answer>0.5</answer>",  # one answer, two forms
        fmt("\\frac{1}{2}") + " so \\boxed{0.5}",
        "<think>Try \\boxed{3}: no.</think><answer>\\frac12</answer>",  # rejected in the reasoning
    ],
)
def test_one_answer_stated_twice_is_correct(response):
    assert compute_score(response, "\\frac12")["correctness"] == 1.0


def test_fallback_to_last_boxed_without_answer_block():
    result = compute_score("so we get \\boxed{\\frac{1}{2}}.", "\\frac12")
    assert result["correctness"] == 1.0 and result["answer_format"] == 0.0
    assert result["score"] == pytest.approx(0.7)


def test_components_and_pred():
    result = compute_score(fmt("$\\frac{1}{2}$"), "\\frac12")
    assert result["score"] == 1.0 and result["pred"] == "\\frac{1}{2}"
    assert set(math_.WEIGHTS) == {"correctness", "answer_format", "thinking", "no_trailing"}
    trailing = compute_score(fmt("1") + " done", "1")
    assert trailing["no_trailing"] == 0.0 and trailing["answer_format"] == 0.0
    assert trailing["score"] == pytest.approx(0.8)


def test_extract_answer_strips_delimiters():
    assert extract_answer(parse_response(fmt("\\(x^2\\)"))) == "x^2"
    assert extract_answer(parse_response("<answer>1</answer><answer>2</answer>")) is None


def test_empty_ground_truth_is_a_data_error():
    with pytest.raises(DataError, match="ground_truth"):
        compute_score(fmt("1"), "  ")


def test_scoring_off_the_main_thread_matches_main_thread():
    """verl calls scorers from executor threads, where Math-Verify's SIGALRM timeouts cannot run."""
    out = {}
    thread = threading.Thread(target=lambda: out.update(r=compute_score(fmt("0.5"), "\\frac12")))
    thread.start()
    thread.join(120)
    assert out["r"]["correctness"] == 1.0
