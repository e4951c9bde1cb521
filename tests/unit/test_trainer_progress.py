"""Each backend reads its own training log lines back as TrainProgress (`get_trainer(backend).parse_progress`)."""

from __future__ import annotations

from verl_grpo.trainers import get_trainer
from verl_grpo.trainers.protocol import TrainProgress
from verl_grpo.trainers.worker.progress import progress_line

NOT_STEP_LINES = ("checkpoint step 2 committed to file:///x", "resuming run r from checkpoint step 2",
                  "training done: step 8, model at file:///m", "")


def test_trl_reads_the_workers_step_lines():
    parse = get_trainer("trl").parse_progress
    trl = parse("step 3/8 reward=0.25 reward_std=0.1 loss=0.01 s/step=2.5", 100)
    assert (trl.step, trl.total_steps, trl.reward) == (3, 8, 0.25)
    assert trl.metrics == {"reward": 0.25, "reward_std": 0.1, "loss": 0.01, "step_time": 2.5}
    assert trl.percent == 37.5
    assert parse("step 2/8", 8) == TrainProgress(2, 8, None, {})
    assert parse("step:5 - critic/score/mean:0.75", 10) is None
    assert all(parse(line, 8) is None for line in NOT_STEP_LINES)


def test_trl_parses_what_its_worker_prints():
    line = progress_line({"step": 4, "reward": 0.5, "loss": 0.01, "completions/mean_length": 37.0}, 10)
    progress = get_trainer("trl").parse_progress(line, 10)
    assert (progress.step, progress.total_steps, progress.reward) == (4, 10, 0.5)
    assert progress.metrics == {"reward": 0.5, "loss": 0.01, "completions/mean_length": 37.0}


def test_trl_line_carries_the_signal_figures_back_under_their_record_names():
    record = {"step": 2, "reward": 0.0, "signal/tied_group_share": 1.0, "signal/all_tied": 1.0,
              "rewards/correctness/mean": 0.0, "rewards/strict_format/mean": 0.25, "rewards/correctness/std": 0.0,
              "completions/mean_length": 8.0, "completions/clipped_ratio": 0.875, "loss": 0.0, "step_time": 0.5,
              "frac_reward_zero_std": 1.0, "prompt_indices": [0, 1]}
    line = progress_line(record, 3)
    assert line == ("step 2/3 reward=0 tied=1 r.correctness=0 r.strict_format=0.25 len=8 clip=0.875 loss=0 "
                    "s/step=0.5")
    progress = get_trainer("trl").parse_progress(line, 3)
    assert progress.metrics == {"reward": 0.0, "signal/tied_group_share": 1.0, "rewards/correctness/mean": 0.0,
                                "rewards/strict_format/mean": 0.25, "completions/mean_length": 8.0,
                                "completions/clipped_ratio": 0.875, "loss": 0.0, "step_time": 0.5}


def test_verl_reads_its_console_loggers_step_lines():
    parse = get_trainer("verl").parse_progress
    verl = parse("step:5 - critic/score/mean:0.75 - actor/lr:1e-06 - timing:abc", 10)
    assert (verl.step, verl.total_steps, verl.reward) == (5, 10, 0.75)
    assert verl.metrics == {"critic/score/mean": 0.75, "actor/lr": 1e-06, "reward": 0.75} and verl.percent == 50.0
    assert parse("step:6 - critic/rewards/mean:0.5 - actor/pg_loss:0.1", 10).reward == 0.5
    assert parse("step:7 - actor/pg_loss:0.1", 10).reward is None
    assert parse("step 3/8 reward=0.25", 8) is None
    assert all(parse(line, 8) is None for line in NOT_STEP_LINES)
