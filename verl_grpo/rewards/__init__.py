"""Verifiable rewards for GSM8K, MATH and MBPP, behind verl's scorer signature.

`compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict` is what
verl's reward managers call (point `reward.custom_reward_function.path` at `verl_entry.py` in this
package, `name=compute_score`); TRL gets per-component functions from `trl_adapter`.
"""

from verl_grpo.rewards.scoring import (
    DATA_SOURCES,
    WEIGHTS,
    compute_score,
    compute_scores,
    dataset_of,
)

__all__ = ["DATA_SOURCES", "WEIGHTS", "compute_score", "compute_scores", "dataset_of"]
