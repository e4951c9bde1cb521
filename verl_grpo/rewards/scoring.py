"""Dispatch on `data_source` to the dataset scorers (verl's names and the hub ids it uses)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verl_grpo.rewards import gsm8k, math_, mbpp

DATA_SOURCES: dict[str, str] = {
    "gsm8k": "gsm8k",
    "openai/gsm8k": "gsm8k",
    "math": "math",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
    "hendrycks/competition_math": "math",
    "mbpp": "mbpp",
    "google-research-datasets/mbpp": "mbpp",
    "Muennighoff/mbpp": "mbpp",
}
"""Accepted data_source values → our dataset name."""

WEIGHTS: dict[str, dict[str, float]] = {"gsm8k": gsm8k.WEIGHTS, "math": math_.WEIGHTS, "mbpp": mbpp.WEIGHTS}
"""Component weights per dataset (GRAIL); each table sums to 1."""


def dataset_of(data_source: str) -> str:
    """Our dataset name for a data_source; ValueError naming the supported ones otherwise."""
    name = DATA_SOURCES.get(str(data_source)) or DATA_SOURCES.get(str(data_source).lower())
    if name is None:
        raise ValueError(
            f"unknown data_source {data_source!r}; supported: {', '.join(sorted(DATA_SOURCES, key=str.lower))}"
        )
    return name


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> dict:
    """Score one response: `score` (weighted total in [0, 1]), each component, `acc` and `pred`/test counts.

    `extra_info` and extra keyword arguments (verl passes e.g. reward_router_address) are accepted and unused.
    """
    dataset = dataset_of(data_source)
    if dataset == "gsm8k":
        return gsm8k.compute_score(solution_str, ground_truth)
    if dataset == "math":
        return math_.compute_score(solution_str, ground_truth)
    return mbpp.compute_score(solution_str, ground_truth)


def compute_scores(data_source: str, solution_strs: Sequence[str], ground_truths: Sequence[Any]) -> list[dict]:
    """Score a batch of one dataset; MBPP programs run in parallel across the execution pool."""
    if len(solution_strs) != len(ground_truths):
        raise ValueError(f"{len(solution_strs)} solutions but {len(ground_truths)} ground truths")
    if dataset_of(data_source) == "mbpp":
        return mbpp.compute_scores(solution_strs, ground_truths)
    return [compute_score(data_source, s, g) for s, g in zip(solution_strs, ground_truths)]
