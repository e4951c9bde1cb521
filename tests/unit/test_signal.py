"""Learning-signal diagnostics: the no-signal watch, its causes, and each backend's metric names mapped to one
vocabulary."""

from __future__ import annotations

import json

import pytest
from metrics_lines import trl_lines

from verl_grpo.config import load_config
from verl_grpo.errors import TrainingError
from verl_grpo.trainers.signal import (
    ALL_TIED,
    CLIPPED_RATIO,
    CORRECTNESS,
    MEAN_LENGTH,
    REWARD,
    TIED_GROUP_SHARE,
    NoSignalWatch,
    component_key,
    components,
    likely_causes,
    no_signal,
    run_findings,
)

GSM8K_FORMAT = ("strict_format", "thinking", "answer_block", "no_trailing")


def step(n: int, tied: float = 1.0, clipped: float = 0.0, reward: float = 0.0, **comps: float) -> dict:
    """A TRL-like record in the shared vocabulary."""
    record = {"step": n, REWARD: reward, TIED_GROUP_SHARE: tied, ALL_TIED: 1.0 if tied == 1.0 else 0.0,
              CLIPPED_RATIO: clipped, MEAN_LENGTH: 100.0}
    record.update({component_key(name): value for name, value in comps.items()})
    return record


def zeros(*names: str) -> dict[str, float]:
    return dict.fromkeys(names, 0.0)


# ---- the watch ----------------------------------------------------------------------------------------------------

def test_warns_once_after_exactly_n_no_signal_steps():
    watch = NoSignalWatch(3, max_response_length=256)
    seen = [watch.observe(step(n, clipped=1.0)) for n in (1, 2, 3, 4, 5)]
    assert seen[:2] == [None, None] and seen[3:] == [None, None]
    assert seen[2].startswith("warning: no learning signal for 3 consecutive steps (steps 1-3): ")
    assert "raise algorithm.max_response_length (now 256)" in seen[2]


def test_a_step_with_signal_resets_the_streak_and_a_new_streak_warns_again():
    watch = NoSignalWatch(2)
    assert [watch.observe(step(n)) for n in (1, 2)][1] is not None
    assert watch.observe(step(3, tied=0.5)) is None
    assert watch.observe(step(4)) is None, "one no-signal step after the reset is not a streak of 2"
    again = watch.observe(step(5))
    assert again is not None and "for 2 consecutive steps (steps 4-5)" in again


def test_signal_in_between_keeps_a_streak_from_forming():
    watch = NoSignalWatch(2)
    assert [watch.observe(step(n, tied=1.0 if n % 2 else 0.25)) for n in range(1, 9)] == [None] * 8


def test_records_without_tie_figures_neither_count_nor_reset_and_replayed_steps_are_ignored():
    watch = NoSignalWatch(2)
    assert watch.observe({"step": 0, "val-core/acc": 0.1}) is None  # verl's step-0 validation
    assert watch.observe(step(1)) is None
    assert watch.observe(step(1)) is None, "a replayed step is not a second step"
    assert watch.observe({"step": 2, "actor/lr": 1e-6}) is None
    assert watch.observe(step(3)) is not None


def test_a_record_counts_the_steps_since_the_previous_one():
    """TRL averages trainer.logging_steps steps per record: one all-tied record of 5 steps is 5 no-signal steps."""
    watch = NoSignalWatch(3)
    assert watch.observe(step(5), span=5) is not None
    resumed = NoSignalWatch(4)
    assert resumed.observe(step(12), span=2) is None and resumed.observe(step(14)) is not None


def test_stop_raises_a_training_error_naming_the_cause_and_the_switch():
    watch = NoSignalWatch(2, stop=True, max_response_length=8)
    assert watch.observe(step(1, clipped=0.9, **zeros("correctness", *GSM8K_FORMAT))) is None
    with pytest.raises(TrainingError) as err:
        watch.observe(step(2, clipped=1.0, **zeros("correctness", *GSM8K_FORMAT)))
    message = str(err.value)
    assert message.startswith("no learning signal for 2 consecutive steps (steps 1-2)") and "\n" not in message
    assert "responses truncated (95% hit the length limit" in message
    assert "raise algorithm.max_response_length (now 8)" in message
    assert "trainer.stop_on_no_signal=false" in message


def test_no_signal_reads_the_flag_then_the_share():
    assert no_signal({ALL_TIED: 1.0}) is True and no_signal({ALL_TIED: 0.0, TIED_GROUP_SHARE: 1.0}) is False
    assert no_signal({TIED_GROUP_SHARE: 1.0}) is True and no_signal({TIED_GROUP_SHARE: 0.75}) is False
    assert no_signal({REWARD: 0.0}) is None and no_signal({TIED_GROUP_SHARE: float("nan")}) is None


def test_watch_from_config():
    assert NoSignalWatch.from_config(load_config(overrides=["trainer.no_signal_steps=0"], env={})) is None
    watch = NoSignalWatch.from_config(load_config(overrides=["trainer.stop_on_no_signal=true",
                                                             "algorithm.max_response_length=64"], env={}))
    assert (watch.steps, watch.stop, watch.max_response_length) == (3, True, 64)
    with pytest.raises(ValueError, match="no_signal_steps=0"):
        NoSignalWatch(0)


def test_config_rejects_a_stop_without_a_watch_in_one_line_naming_the_fields():
    from verl_grpo.errors import ConfigError

    with pytest.raises(ConfigError, match=r"trainer.no_signal_steps \(e.g. 3\) or trainer.stop_on_no_signal=false"):
        load_config(overrides=["trainer.stop_on_no_signal=true", "trainer.no_signal_steps=0"], env={})
    with pytest.raises(ConfigError, match="trainer.no_signal_steps"):
        load_config(overrides=["trainer.no_signal_steps=-1"], env={})


# ---- causes -------------------------------------------------------------------------------------------------------

def test_truncation_is_named_from_a_high_clipped_ratio_only():
    assert likely_causes([step(1, clipped=0.5)], 32)[0].startswith("responses truncated (50% hit the length limit")
    assert not any("truncated" in c for c in likely_causes([step(1, clipped=0.4, **zeros(*GSM8K_FORMAT))]))


def test_format_never_met_when_every_format_component_is_zero():
    causes = likely_causes([step(1, **zeros("correctness", *GSM8K_FORMAT))])
    assert causes == [causes[0]] and causes[0].startswith(
        "format never met (strict_format, thinking, answer_block, no_trailing all 0)")
    assert "dataset.system_prompt" in causes[0]


def test_task_too_hard_when_the_format_is_met_but_nothing_is_correct():
    streak = [step(1, reward=0.0, correctness=0.0, thinking=0.5, answer_block=0.0, strict_format=0.0),
              step(2, reward=0.0, correctness=0.0, thinking=1.0, answer_block=0.0, strict_format=0.0)]
    (cause,) = likely_causes(streak)
    assert cause.startswith("task too hard (correctness 0 while the format is met: thinking 0.75)")
    mbpp = likely_causes([step(1, test_pass_rate=0.0, syntax=1.0, format=1.0, thinking=0.0)])
    assert mbpp[0].startswith("task too hard (test_pass_rate 0")


def test_truncation_comes_first_and_other_causes_follow():
    causes = likely_causes([step(1, clipped=1.0, **zeros("correctness", *GSM8K_FORMAT))], 8)
    assert [c.split(" (")[0] for c in causes] == ["responses truncated", "format never met"]


def test_rollouts_that_all_earn_the_same_nonzero_reward():
    (cause,) = likely_causes([step(1, reward=1.0, correctness=1.0, thinking=1.0)])
    assert cause.startswith("every rollout of a prompt earns the same reward (mean 1)")
    assert "algorithm.temperature" in cause


def test_zero_rewards_without_component_means_point_at_the_rollouts():
    (cause,) = likely_causes([{"step": 1, REWARD: 0.0, ALL_TIED: 1.0}])
    assert "no per-component means" in cause and "trainer.rollout_data_dir" in cause


def test_every_dataset_has_exactly_one_correctness_component():
    from verl_grpo.rewards.scoring import WEIGHTS

    for dataset, weights in WEIGHTS.items():
        assert len(CORRECTNESS & set(weights)) == 1, dataset


def test_components_reads_the_reward_means_only():
    record = {"rewards/correctness/mean": 0.5, "rewards/correctness/std": 0.1, "rewards//mean": 1.0, "reward": 0.5,
              "rewards/format/mean": None}
    assert components(record) == {"correctness": 0.5}


# ---- MLflow ---------------------------------------------------------------------------------------------------------

def test_the_vocabulary_reaches_mlflow_as_train_metrics():
    import json

    from verl_grpo.registry.tracking import training_points

    record = {"step": 3, TIED_GROUP_SHARE: 1.0, ALL_TIED: 1.0, CLIPPED_RATIO: 0.5, MEAN_LENGTH: 8.0,
              component_key("correctness"): 0.0, "prompt_indices": [1, 2]}
    points = {m.key: (m.value, m.step) for m in training_points([json.dumps(record)])}
    assert points == {"train/signal/tied_group_share": (1.0, 3), "train/signal/all_tied": (1.0, 3),
                      "train/completions/clipped_ratio": (0.5, 3), "train/completions/mean_length": (8.0, 3),
                      "train/rewards/correctness/mean": (0.0, 3)}


def test_a_finished_runs_metrics_give_the_streak_it_warned_of_once_and_none_with_signal():
    """Read back for the run's summary and registry decision (`run_findings`), from any backend's metrics.jsonl."""
    def records(lines):
        return [json.loads(line) for line in lines]

    flat = records(trl_lines(2, tied=True) + trl_lines(6, tied=True, tied_share=1.0)[2:])  # steps 3-6 all tied
    (finding,) = run_findings(flat, 3, max_response_length=256)
    assert finding.startswith("no learning signal for 3 consecutive steps (steps 3-5)")
    assert run_findings(records(trl_lines(6, tied=True)), 3) == []
    assert run_findings(flat, 0) == [], "trainer.no_signal_steps=0 turns the watch off"
