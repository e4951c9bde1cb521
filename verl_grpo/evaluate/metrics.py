"""Scoring of responses and aggregation of per-problem rows into the eval metrics.

Aggregation is pure (lists of dicts in, dict of floats out) so it is unit-tested without a model.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Sequence
from typing import Any

from verl_grpo.rewards.answers import answer_blocks

CORRECT_KEY = "acc"
"""Key of the scorer's correctness value (1/True when the final answer is right)."""
FORMAT_KEYS = ("strict_format", "answer_format", "format")
"""The scorers' format component, per dataset (gsm8k, math, mbpp): 1 when the response has the required layout."""
PRED_KEY = "pred"
"""Key of the scorer's extracted answer, when it reports one."""
_NON_COMPONENT_KEYS = {"score", CORRECT_KEY, PRED_KEY}


def extract_answer(response: str) -> str | None:
    """Text of the response's <answer>…</answer> blocks, stripped, when they all say the same; None when there
    is none or two differ (a response with two different answers must not vote for either in maj@k)."""
    found = {block.strip() for block in answer_blocks(response)}
    return found.pop() if len(found) == 1 else None


def score_row(
    scorer: Any, data_source: str, response: str, ground_truth: str, extra_info: dict,
    components: Collection[str] | None = None,
) -> dict[str, Any]:
    """One scored response: `score`, `correct`, `pred` and each component (`reward/<name>`) of the scorer's result.

    `components` names the reward components; None takes every numeric field besides score/acc/pred.
    """
    result = scorer(data_source, response, ground_truth, extra_info)
    if not isinstance(result, dict) or "score" not in result:
        # A bare number (verl also accepts that) is the score and the correctness at once.
        result = {"score": float(result), CORRECT_KEY: float(result)}
    pred = result.get(PRED_KEY)
    row: dict[str, Any] = {
        "score": float(result["score"]),
        "correct": bool(float(result.get(CORRECT_KEY, result["score"])) > 0.5),
        "pred": (str(pred) or None) if pred is not None else extract_answer(response),
    }
    for key, value in result.items():
        wanted = key in components if components is not None else key not in _NON_COMPONENT_KEYS
        if wanted and isinstance(value, (int, float, bool)):
            row[f"reward/{key}"] = float(value)
    return row


def aggregate(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Greedy metrics over per-problem rows (`correct`, `score`, `response_tokens`, `reward/*`, `pred`)."""
    if not rows:
        raise ValueError("no evaluated problems to aggregate; the eval subset is empty")
    n = len(rows)
    metrics = {
        "accuracy": sum(bool(r["correct"]) for r in rows) / n,
        "mean_score": sum(float(r["score"]) for r in rows) / n,
        "mean_response_tokens": sum(int(r["response_tokens"]) for r in rows) / n,
        "truncated_rate": sum(not r.get("finished", True) for r in rows) / n,
        "n": float(n),
    }
    components = sorted({k for r in rows for k in r if k.startswith("reward/")})
    for key in components:
        values = [float(r[key]) for r in rows if r.get(key) is not None and not _is_nan(r[key])]
        if values:
            metrics[key] = sum(values) / len(values)
    with_tools = [int(r["tool_calls"]) for r in rows if r.get("tool_calls") is not None]
    if with_tools:  # the eval offered tools: how many answers used one (the search share), and how often
        metrics["tool_use_rate"] = sum(calls > 0 for calls in with_tools) / len(with_tools)
        metrics["tool_calls_per_response"] = sum(with_tools) / len(with_tools)
    fmt = next((f"reward/{k}" for k in FORMAT_KEYS if f"reward/{k}" in metrics), None)
    if fmt is not None:
        metrics["format_rate"] = sum(float(r.get(fmt) or 0.0) > 0.5 for r in rows) / n
    else:  # a scorer without a format component: having an answer block is the format
        metrics["format_rate"] = sum(r.get("pred") is not None for r in rows) / n
    return metrics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_correct(samples: Sequence[tuple[str | None, bool]]) -> bool:
    """Correctness of the most frequent extracted answer (ties: the earliest); unanswered samples do not vote."""
    votes = Counter(pred for pred, _ in samples if pred is not None)
    if not votes:
        return False
    winner = votes.most_common(1)[0][0]
    return next(correct for pred, correct in samples if pred == winner)


def sampled_metrics(per_problem: Sequence[Sequence[tuple[str | None, bool]]]) -> dict[str, float]:
    """pass@k for k = 1, 2, 4, … up to the sample count, and maj@k with all k samples."""
    if not per_problem:
        raise ValueError("no sampled problems to aggregate")
    k_max = len(per_problem[0])
    if k_max < 1 or any(len(s) != k_max for s in per_problem):
        raise ValueError("every problem needs the same number (>= 1) of sampled responses")
    ks = sorted({1 << i for i in range(k_max.bit_length()) if (1 << i) <= k_max} | {k_max})
    out: dict[str, float] = {}
    for k in ks:
        out[f"pass@{k}"] = sum(pass_at_k(k_max, sum(c for _, c in s), k) for s in per_problem) / len(per_problem)
    out[f"maj@{k_max}"] = sum(majority_correct(s) for s in per_problem) / len(per_problem)
    return out


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)
