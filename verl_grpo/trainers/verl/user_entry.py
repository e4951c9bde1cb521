"""verl's `reward.custom_reward_function` of a run scored by its own function (reward.path) on GPU nodes.

verl loads this module (`pkg://verl_grpo.trainers.verl.user_entry`) and calls `compute_score` with the row's
arguments plus its `reward_kwargs` (verl/trainer/ppo/reward.py `get_custom_reward_fn`): where the user's function is
on this node (`user_path`, `user_name`), its per-call limit (`timeout_s`), the component keys fixed at plan time
(`components`) and how many rows the first step gives this process (`first_rows`). The user's function runs guarded
(`rewards.user_reward.UserReward`: worker processes, a time limit, a failing call scores 0 with `failed` 1), and every
row returns exactly `score`, `acc`, `failed` and the components: verl's reward loop builds its `reward_extra_info`
arrays from the first row's keys (experimental/reward_loop/reward_loop.py, agent_loop/agent_loop.py) and fails on a
row that lacks one. `compute_score_remote` is the same for a job group whose reward-server runs the function.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from verl_grpo.rewards.user_reward import FAILED, FailureGuard, UserReward

BASE_KEYS = ("score", "acc", FAILED)
"""The keys every row's result has before the function's components."""

_guards: dict[tuple, FailureGuard] = {}
_lock = threading.Lock()


def fixed_keys(result: Mapping[str, Any], components: Sequence[str]) -> dict[str, float]:
    """`result` reduced to BASE_KEYS plus `components`, each a finite float (missing or unusable: 0; `failed` kept)."""
    out: dict[str, float] = {}
    for key in (*BASE_KEYS, *components):
        value = result.get(key, 0.0)
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = 0.0
        out[key] = number if math.isfinite(number) else 0.0
    return out


def _guard(reward: UserReward, first_rows: int) -> FailureGuard:
    key = (reward, first_rows)
    with _lock:
        if key not in _guards:
            _guards[key] = FailureGuard(reward, first_rows)
        return _guards[key]


def _checked(reward: UserReward, first_rows: int, result: dict[str, float]) -> dict[str, float]:
    guard = _guard(reward, first_rows)
    with _lock:
        guard.check([result])
    return result


def _reward(user_path: str, user_name: str, timeout_s: float, components: Sequence[str]) -> UserReward:
    return UserReward(str(user_path), str(user_name), float(timeout_s), tuple(str(c) for c in components or ()))


def compute_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None, *,
                  user_path: str, user_name: str = "compute_score", timeout_s: float = 10.0,
                  components: Sequence[str] = (), first_rows: int = 1, **kwargs: Any) -> dict[str, float]:
    """The user's function on this row, guarded, as a dict of fixed keys (extra keyword arguments verl passes, such
    as reward_router_address, are not forwarded). ConfigError once every one of this process's first `first_rows`
    rows failed."""
    reward = _reward(user_path, user_name, timeout_s, components)
    result = fixed_keys(reward.score(data_source, solution_str, ground_truth, extra_info), reward.components)
    return _checked(reward, int(first_rows), result)


async def compute_score_remote(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None, *,
                               user_path: str, user_name: str = "compute_score", timeout_s: float = 10.0,
                               components: Sequence[str] = (), first_rows: int = 1, **kwargs: Any
                               ) -> dict[str, float]:
    """compute_score answered by the job group's reward-server, which runs the user's function on its node
    (`user_path` is where it reads it, named here for the failure line)."""
    from verl_grpo.services import reward_client

    reward = _reward(user_path, user_name, timeout_s, components)
    answer = await reward_client.compute_score(data_source, solution_str, ground_truth, extra_info)
    return _checked(reward, int(first_rows), fixed_keys(answer, reward.components))
