"""Dispatch on `data_source` to the dataset scorers (verl's names and the hub ids it uses)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verl_grpo.rewards import gsm8k, math_, mbpp, qa, reasoning_gym

SEARCH_R1_PREFIX = "searchR1_"
"""verl's Search-R1 rows are named searchR1_<dataset> (searchR1_nq, searchR1_hotpotqa, ...); any such name is QA."""

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
    "squad": "squad",
    "rajpurkar/squad": "squad",
    "nq_hotpotqa": "nq_hotpotqa",
    "reasoning_gym": "reasoning_gym",
    **{
        SEARCH_R1_PREFIX + name: "nq_hotpotqa"
        for name in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
    },
}
"""Accepted data_source values → our dataset name (plus any other name starting with SEARCH_R1_PREFIX, and
reasoning-gym's rows, REASONING_GYM_PREFIX + generator)."""
REASONING_GYM_PREFIX = "reasoning_gym/"

WEIGHTS: dict[str, dict[str, float]] = {
    "gsm8k": gsm8k.WEIGHTS,
    "math": math_.WEIGHTS,
    "mbpp": mbpp.WEIGHTS,
    "squad": qa.WEIGHTS,
    "nq_hotpotqa": qa.WEIGHTS,
    "reasoning_gym": reasoning_gym.WEIGHTS,
}
"""Component weights per dataset (GRAIL); each table sums to 1."""

QA_DATASETS = frozenset({"squad", "nq_hotpotqa"})


def dataset_of(data_source: str) -> str:
    """Our dataset name for a data_source; ValueError naming the supported ones otherwise."""
    source = str(data_source)
    name = DATA_SOURCES.get(source) or DATA_SOURCES.get(source.lower())
    if name is None and source.lower().startswith(SEARCH_R1_PREFIX.lower()) and len(source) > len(SEARCH_R1_PREFIX):
        name = "nq_hotpotqa"
    if name is None and (source == "reasoning_gym" or source.startswith(REASONING_GYM_PREFIX)):
        name = "reasoning_gym"
    if name is None:
        named = sorted((s for s in DATA_SOURCES if not s.startswith(SEARCH_R1_PREFIX)), key=str.lower)
        raise ValueError(
            f"unknown data_source {data_source!r}; supported: {', '.join(named)}, any {SEARCH_R1_PREFIX}<name> "
            f"(verl's Search-R1 rows, e.g. searchR1_nq) and {REASONING_GYM_PREFIX}<generator>; another task is scored "
            "by your own function (reward.path)"
        )
    return name


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> dict:
    """Score one response: `score` (weighted total in [0, 1]), each component, `acc` and `pred`/test counts.

    `qa_match` ("em", the default, or "subem") picks the QA match mode (verl:
    `reward.custom_reward_function.reward_kwargs.qa_match=subem`); other datasets ignore it. `extra_info` and other
    keyword arguments (verl passes e.g. reward_router_address) are accepted and unused.
    """
    dataset = dataset_of(data_source)
    if dataset == "gsm8k":
        return gsm8k.compute_score(solution_str, ground_truth)
    if dataset == "math":
        return math_.compute_score(solution_str, ground_truth)
    if dataset == "reasoning_gym":
        return reasoning_gym.compute_score(solution_str, ground_truth)
    if dataset in QA_DATASETS:
        match = kwargs.get("qa_match")
        return qa.compute_score(solution_str, ground_truth, match="em" if match is None else match)
    return mbpp.compute_score(solution_str, ground_truth)


def compute_scores(
    data_source: str, solution_strs: Sequence[str], ground_truths: Sequence[Any], **kwargs: Any
) -> list[dict]:
    """Score a batch of one dataset; MBPP programs run in parallel across the execution pool. Keyword arguments
    go to compute_score (e.g. qa_match)."""
    if len(solution_strs) != len(ground_truths):
        raise ValueError(f"{len(solution_strs)} solutions but {len(ground_truths)} ground truths")
    if dataset_of(data_source) == "mbpp":
        return mbpp.compute_scores(solution_strs, ground_truths)
    return [compute_score(data_source, s, g, **kwargs) for s, g in zip(solution_strs, ground_truths)]


def run_scorer(cfg: Any):
    """What scores a run's responses, with verl's signature: the user's function (reward.path, guarded: see
    rewards.user_reward), else the task's own scorer (`compute_score`, dispatching on data_source)."""
    from verl_grpo.rewards.user_reward import UserReward

    user = UserReward.of(cfg)
    return user if user is not None else compute_score
