"""Verifiable rewards for GSM8K, MATH, MBPP and open-domain QA, behind verl's scorer signature.

`compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict` is what
verl's reward managers call (point `reward.custom_reward_function.path` at `verl_entry.py` in this
package, `name=compute_score`); TRL gets per-component functions from `trl_adapter`.

QA (`squad`, and verl's Search-R1 rows: any `searchR1_<name>` data_source) is scored by exact match of the
final answer block against the gold answers (`qa`); `reward.custom_reward_function.reward_kwargs.qa_match=subem`
switches to substring match. reasoning-gym rows (`reasoning_gym/<generator>`) are judged by the generator's own
`score_answer` (`reasoning_gym`). A run with its own function (`reward.path`) is scored by it instead, everywhere:
`run_scorer(cfg)`, guarded by `user_reward`; on GPU nodes verl calls it through `trainers/verl/user_entry.py`.
"""

from verl_grpo.rewards.scoring import (
    DATA_SOURCES,
    WEIGHTS,
    compute_score,
    compute_scores,
    dataset_of,
    run_scorer,
)

__all__ = ["DATA_SOURCES", "WEIGHTS", "compute_score", "compute_scores", "dataset_of", "run_scorer"]
