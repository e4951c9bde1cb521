"""Gold solutions in the response format score correct: GSM8K test, MBPP test (11-510), MATH-500."""

import json

import pytest
from math_verify import parse, verify

from verl_grpo.rewards import compute_score, compute_scores
from verl_grpo.rewards.math_ import MATH_VERIFY_TIMEOUT_S


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_gsm8k_test_gold_answers(data_mirror):
    rows = read_jsonl(data_mirror / "gsm8k" / "test.jsonl")
    assert len(rows) == 1319
    wrong = []
    for row in rows:
        reasoning, _, number = row["answer"].rpartition("####")
        response = f"<think>{reasoning.strip()}</think>\n<answer>{number.strip()}</answer>"
        result = compute_score("openai/gsm8k", response, number.strip().replace(",", ""))
        if result["correctness"] != 1.0:
            wrong.append((row["question"][:60], number))
    assert (len(rows) - len(wrong)) / len(rows) >= 0.995, wrong[:10]


def test_mbpp_test_gold_programs(data_mirror):
    rows = [r for r in read_jsonl(data_mirror / "mbpp" / "mbpp.jsonl") if 11 <= r["task_id"] <= 510]
    assert len(rows) == 500
    responses = [f"<think>Reference.</think>\n<answer>\n```python\n{r['code']}\n```\n</answer>" for r in rows]
    truths = [
        json.dumps({k: r[k] for k in ("test_list", "test_setup_code", "challenge_test_list")}) for r in rows
    ]
    results = compute_scores("mbpp", responses, truths)
    failed = [(r["task_id"], s["reason"]) for r, s in zip(rows, results) if s["test_pass_rate"] != 1.0]
    assert (len(rows) - len(failed)) / len(rows) >= 0.995, failed
    assert all(s["format"] == 1.0 and s["syntax"] == 1.0 for s in results)


def test_math500_answers_agree_with_math_verify(data_mirror):
    rows = read_jsonl(data_mirror / "math" / "test.jsonl")
    assert len(rows) == 500
    disagreements = []
    for row in rows:
        answer = row["answer"]
        ours = compute_score("HuggingFaceH4/MATH-500", f"<think>Done.</think>\n<answer>{answer}</answer>", answer)
        theirs = verify(
            parse("\\boxed{" + answer + "}", parsing_timeout=MATH_VERIFY_TIMEOUT_S),
            parse("\\boxed{" + answer + "}", parsing_timeout=MATH_VERIFY_TIMEOUT_S),
            timeout_seconds=MATH_VERIFY_TIMEOUT_S,
        )
        if bool(ours["correctness"]) != theirs:
            disagreements.append(answer)
    assert disagreements == []


@pytest.mark.parametrize("broken", ["return None", "raise ValueError"])
def test_mbpp_broken_programs_score_zero(broken):
    truth = {"test_list": ["assert f(1) == 2", "assert f(2) == 3"]}
    response = f"<think>x</think>\n<answer>\n```python\ndef f(x):\n    {broken}\n```\n</answer>"
    assert compute_score("mbpp", response, truth)["test_pass_rate"] == 0.0
