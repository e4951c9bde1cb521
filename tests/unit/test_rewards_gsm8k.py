"""GSM8K extraction and scoring (pure)."""

import pytest

from verl_grpo.errors import DataError
from verl_grpo.rewards import gsm8k
from verl_grpo.rewards.gsm8k import compute_score


def fmt(answer: str, thinking: str = "Add them up.") -> str:
    return f"<think>{thinking}</think>\n<answer>{answer}</answer>"


@pytest.mark.parametrize(
    ("response", "truth"),
    [
        (fmt("18"), "18"),
        (fmt("$18"), "18"),
        (fmt("18 dollars"), "18"),
        (fmt("5 cm"), "5"),
        (fmt("1,000"), "1000"),
        (fmt("2.50"), "2.5"),
        (fmt("3/4"), "0.75"),
        (fmt("\\frac{3}{4}"), "0.75"),
        (fmt("-5"), "-5"),
        (fmt("\u22125"), "-5"),
        (fmt("\\boxed{18}"), "18"),
        (fmt("#### 18"), "18"),
        (fmt("3 * 6 = 18"), "18"),
        (fmt("25%"), "25"),
        ("Long reasoning.\n#### 1,234", "1234"),
        ("so the total is \\boxed{7}", "7"),
        ("The answer is 42.", "42"),
        ("I had 3 apples and 5 pears.\n8", "8"),
        ("Adding them up:\n49 - 10 = 39", "39"),  # a final line ending an equation states its result
        ("3 + 5 = 8 apples", "8"),
        (fmt("1,000") + "\n#### 1000.0", "1000"),  # one answer stated twice
        ("#### 18\nThe answer is \\boxed{18.00}.\n18", "18"),
        (fmt("18", thinking="The answer is 12? No: 3 * 6 = 18."), "18"),  # a candidate rejected in the reasoning
        ("<think>The answer is 12? No.</think>\nThe answer is 18.", "18"),
        ("Let's find the answer: add them.\n#### 18", "18"),  # a phrase without a number states nothing
        ("The answer isn't 17.\n#### 18", "18"),
    ],
)
def test_correct_answers(response, truth):
    assert compute_score(response, truth)["correctness"] == 1.0


@pytest.mark.parametrize(
    ("response", "truth"),
    [
        (fmt("12 or 18"), "18"),
        (fmt("12, 18"), "18"),
        (fmt("17"), "18"),
        (fmt("18.5"), "18"),
        ("I had 3 apples and 5 pears and 18 plums in total", "18"),  # never "the last number anywhere"
        ("49 - 10 = 18 + 21", "39"),  # an equation that ends in an expression states no single value
        ("<think>x</think><answer>12</answer><answer>18</answer>", "18"),  # two different final answers
        (fmt("18") + "\nThe answer is 12", "18"),
        (fmt("18") + "\n#### 12", "18"),
        (fmt("18") + "\n\\boxed{12}", "18"),
        (fmt("18") + "\n12", "18"),  # a final line
        (fmt("\\boxed{12} \\boxed{18}"), "18"),
        (fmt("18") + "\nThe answer is 12 or 18", "18"),
        ("work\n#### 18\nThe answer is 12", "18"),
        ("work\n#### 12\n#### 18", "18"),
        ("work \\boxed{12} then \\boxed{18}", "18"),
        ("\\boxed{18}\nThe answer is 12", "18"),
        ("The answer is 12.\nThe answer is 18.", "18"),
        ("The answer is 18.\n12", "18"),
        ("", "18"),
    ],
)
def test_incorrect_or_ambiguous_answers(response, truth):
    result = compute_score(response, truth)
    assert result["correctness"] == 0.0
    assert result["acc"] == 0.0


def test_perfect_response_scores_one_with_every_component():
    result = compute_score(fmt("18"), "18")
    assert result == {
        "score": 1.0,
        "correctness": 1.0,
        "strict_format": 1.0,
        "thinking": 1.0,
        "answer_block": 1.0,
        "no_trailing": 1.0,
        "acc": 1.0,
        "pred": "18",
    }


def test_weights_apply_per_component():
    trailing = compute_score(fmt("18") + " extra words", "18")
    assert trailing["no_trailing"] == 0.0 and trailing["strict_format"] == 0.0
    assert trailing["score"] == pytest.approx(0.6 + 0.1 + 0.1)
    units = compute_score(fmt("18 dollars"), "18")
    assert units["strict_format"] == 0.0 and units["score"] == pytest.approx(0.85)
    no_think = compute_score("<answer>18</answer>", "18")
    assert no_think["thinking"] == 0.0 and no_think["score"] == pytest.approx(0.6 + 0.1 + 0.05)
    hashes_only = compute_score("work\n#### 18", "18")
    assert hashes_only["score"] == pytest.approx(0.6)


def test_weights_table_sums_to_one():
    assert sum(gsm8k.WEIGHTS.values()) == pytest.approx(1.0)
    assert gsm8k.WEIGHTS["correctness"] == 0.6


def test_pred_is_canonical():
    assert compute_score(fmt("2.50"), "2.5")["pred"] == "2.5"
    assert compute_score(fmt("1/3"), "5")["pred"] == "1/3"
    assert compute_score(fmt("maybe"), "5")["pred"] == ""


def test_non_numeric_ground_truth_is_a_data_error():
    with pytest.raises(DataError, match="ground_truth"):
        compute_score(fmt("1"), "eighteen")


def test_ground_truth_with_commas_is_accepted():
    assert compute_score(fmt("1000"), "1,000")["correctness"] == 1.0
