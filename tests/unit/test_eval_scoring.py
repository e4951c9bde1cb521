"""Scoring of fixed responses with the project's real GSM8K scorer: known answers give exact metrics."""

import pandas as pd
import pytest

from verl_grpo.evaluate.generation import Generation
from verl_grpo.evaluate.problems import EvalProblem
from verl_grpo.evaluate.runner import score_problems
from verl_grpo.rewards import compute_score

GOLD = ["18", "3", "70000", "540"]
RESPONSES = [
    ("<think>16 - 3 - 4 = 9 eggs, 9 * 2 = 18</think><answer>18</answer>", 20),  # right, well formed
    ("<think>2 + 1</think><answer>3</answer>", 10),  # right, well formed
    ("<think>guess</think><answer>5</answer>", 8),  # wrong, well formed
    ("I am not sure", 6),  # no answer at all
]


def problems():
    return [EvalProblem(id=f"test/{i}", index=i, data_source="gsm8k",
                        messages=[{"role": "user", "content": f"q{i}"}], ground_truth=g) for i, g in enumerate(GOLD)]


def test_fixed_responses_score_exactly():
    greedy = [Generation(text, tokens, finished=True) for text, tokens in RESPONSES]
    table, metrics = score_problems(problems(), [f"prompt {i}" for i in range(4)], greedy, None, compute_score)

    assert table["correct"].tolist() == [True, True, False, False]
    assert table["pred"].tolist()[:3] == ["18", "3", "5"] and pd.isna(table["pred"][3])
    assert table["id"].tolist() == ["test/0", "test/1", "test/2", "test/3"]
    assert metrics["accuracy"] == 0.5
    assert metrics["format_rate"] == 0.75
    assert metrics["mean_response_tokens"] == 11
    assert metrics["reward/correctness"] == 0.5
    assert "reward/strict_format" in metrics and "reward/passed" not in metrics
    expected = sum(compute_score("gsm8k", text, g)["score"] for (text, _), g in zip(RESPONSES, GOLD, strict=True)) / 4
    assert metrics["mean_score"] == pytest.approx(expected)


def test_sampled_responses_give_pass_and_majority():
    greedy = [Generation(text, tokens, True) for text, tokens in RESPONSES]
    right = [Generation(f"<think>t</think><answer>{g}</answer>", 5, True) for g in GOLD]
    wrong = [Generation("<think>t</think><answer>-1</answer>", 5, True) for _ in GOLD]
    sampled = [[right[0], right[0]], [right[1], wrong[1]], [wrong[2], wrong[2]], [wrong[3], right[3]]]
    table, metrics = score_problems(problems(), ["p"] * 4, greedy, sampled, compute_score)

    assert table["sampled_correct"].tolist() == [2, 1, 0, 1]
    assert metrics["pass@1"] == pytest.approx((1 + 0.5 + 0 + 0.5) / 4)
    assert metrics["pass@2"] == 0.75
    assert metrics["maj@2"] == 0.5  # ties go to the first sample: right, right, wrong, wrong


def test_eval_scores_two_different_final_answers_as_training_does():
    texts = ["<think>t</think><answer>18</answer>\n#### 12", "<think>t</think><answer>3</answer>\n#### 3.0",
             "<think>t</think><answer>70,000</answer>\nThe answer is \\boxed{5}",
             "<think>t</think><answer>540</answer>"]
    greedy = [Generation(text, 5, True) for text in texts]
    table, _ = score_problems(problems(), ["p"] * 4, greedy, None, compute_score)

    assert table["correct"].tolist() == [False, True, False, True]
    assert pd.isna(table["pred"][0]) and table["pred"][1] == "3" and pd.isna(table["pred"][2])
    training = [compute_score("gsm8k", text, g)["acc"] == 1.0 for text, g in zip(texts, GOLD, strict=True)]
    assert table["correct"].tolist() == training
