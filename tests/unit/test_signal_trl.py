"""TRL's metric names in the signal vocabulary (verl_grpo.trainers.signal), checked against the installed TRL."""

from __future__ import annotations

import inspect

from verl_grpo.trainers.signal import ALL_TIED, CLIPPED_RATIO, MEAN_LENGTH, TIED_GROUP_SHARE


def test_trl_logs_the_names_the_vocabulary_relies_on():
    from trl import GRPOTrainer

    source = inspect.getsource(GRPOTrainer)
    for key in ("frac_reward_zero_std", CLIPPED_RATIO, MEAN_LENGTH, 'f"rewards/{reward_func_name}/mean"',
                '"reward"', '"reward_std"'):
        assert key in source, key


def test_trl_figures_map_frac_reward_zero_std():
    from verl_grpo.trainers.trl.callbacks import signal_figures

    assert signal_figures({"frac_reward_zero_std": 1.0, "reward": 0.3, "reward_std": 0.0}) == {
        TIED_GROUP_SHARE: 1.0, ALL_TIED: 1.0}
    assert signal_figures({"frac_reward_zero_std": 0.5, "reward": 0.3, "reward_std": 0.2}) == {
        TIED_GROUP_SHARE: 0.5, ALL_TIED: 0.0}
    assert signal_figures({"reward": 0.0, "reward_std": 0.0}) == {ALL_TIED: 1.0}, "all rewards 0"
    assert signal_figures({"loss": 0.1}) == {}
