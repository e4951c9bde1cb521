"""verl 0.9.1 loads our scorer through `reward.custom_reward_function` exactly as its trainer does."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf
from verl.trainer.ppo.reward import get_custom_reward_fn

import verl_grpo.rewards

REWARDS_DIR = Path(verl_grpo.rewards.__file__).parent


@pytest.mark.parametrize("entry", ["verl_entry.py", "__init__.py"])
def test_verl_loads_compute_score_by_file_path(entry):
    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": str(REWARDS_DIR / entry),
                    "name": "compute_score",
                    "reward_kwargs": {},
                }
            }
        }
    )
    fn = get_custom_reward_fn(config)
    # The keyword call of verl's NaiveRewardManager.run_single.
    result = fn(
        data_source="openai/gsm8k",
        solution_str="<think>3 * 6</think>\n<answer>18</answer>",
        ground_truth="18",
        extra_info={"index": 0, "num_turns": None, "rollout_reward_scores": {}},
    )
    assert result["score"] == 1.0 and result["acc"] == 1.0 and result["pred"] == "18"
    wrong = fn(data_source="lighteval/MATH", solution_str="<answer>\\frac13</answer>", ground_truth="\\frac12")
    assert wrong["acc"] == 0.0


def test_verl_reward_kwargs_are_passed_through():
    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": f"file://{REWARDS_DIR / 'verl_entry.py'}",
                    "name": "compute_score",
                    "reward_kwargs": {"unused_option": 1},
                }
            }
        }
    )
    fn = get_custom_reward_fn(config)
    assert fn(data_source="gsm8k", solution_str="#### 5", ground_truth="5")["correctness"] == 1.0
