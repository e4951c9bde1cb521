"""Entry file for verl's `reward.custom_reward_function.path` (`name=compute_score`).

verl loads this file by path as a standalone module (not as part of the package), so it only
re-exports through absolute imports of the installed `verl_grpo` package.
"""

from verl_grpo.rewards.scoring import compute_score

__all__ = ["compute_score"]
