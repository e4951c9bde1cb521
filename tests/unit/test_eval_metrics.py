import math

import pytest

from verl_grpo.evaluate.metrics import aggregate, extract_answer, majority_correct, pass_at_k, sampled_metrics


def row(correct, score, tokens, fmt=None, pred="1", finished=True):
    r = {"correct": correct, "score": score, "response_tokens": tokens, "pred": pred, "finished": finished}
    if fmt is not None:
        r["reward/strict_format"] = fmt
        r["reward/correctness"] = float(correct)
    return r


def test_aggregate_means_over_problems():
    rows = [row(True, 1.0, 10, 1.0), row(False, 0.25, 20, 1.0), row(False, 0.0, 30, 0.0, finished=False),
            row(True, 0.75, 40, 0.0)]
    m = aggregate(rows)
    assert m["accuracy"] == 0.5
    assert m["mean_score"] == 0.5
    assert m["mean_response_tokens"] == 25
    assert m["format_rate"] == 0.5
    assert m["reward/strict_format"] == 0.5 and m["reward/correctness"] == 0.5
    assert m["truncated_rate"] == 0.25 and m["n"] == 4


def test_format_rate_without_a_format_component_counts_answer_blocks():
    m = aggregate([row(True, 1.0, 5, pred="3"), row(False, 0.0, 5, pred=None)])
    assert m["format_rate"] == 0.5


def test_aggregate_refuses_an_empty_subset():
    with pytest.raises(ValueError, match="empty"):
        aggregate([])


def test_pass_at_k_unbiased_estimator():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_majority_vote_ignores_unanswered_and_breaks_ties_by_first_seen():
    assert majority_correct([("7", True), ("8", False), ("7", True)]) is True
    assert majority_correct([(None, False), (None, False), ("8", True)]) is True
    assert majority_correct([("8", False), ("7", True)]) is False
    assert majority_correct([(None, False)]) is False


def test_sampled_metrics_over_problems():
    per_problem = [
        [("1", True), ("1", True), ("2", False), ("1", True)],  # 3/4 correct, majority right
        [("5", False), ("5", False), ("6", True), ("7", False)],  # 1/4 correct, majority wrong
    ]
    m = sampled_metrics(per_problem)
    assert set(m) == {"pass@1", "pass@2", "pass@4", "maj@4"}
    assert m["pass@1"] == pytest.approx((0.75 + 0.25) / 2)
    assert m["pass@4"] == 1.0
    assert m["maj@4"] == 0.5
    with pytest.raises(ValueError, match="same number"):
        sampled_metrics([[("1", True)], [("1", True), ("2", False)]])


def test_extract_answer_reads_one_answer_only():
    assert extract_answer("<think>x</think><answer> 12 </answer>") == "12"
    assert extract_answer("<answer>2</answer> then <answer> 2</answer>") == "2"
    assert extract_answer("<answer>1</answer> then <answer>2</answer>") is None
    assert extract_answer("no block") is None
