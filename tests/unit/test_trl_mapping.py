"""RunConfig → trl.GRPOConfig: field mapping, batch arithmetic against TRL's own sampler, errors."""

from __future__ import annotations

import os
import signal
import time
from functools import partial

import pytest
from run_configs import build_config

from verl_grpo.config import load_config
from verl_grpo.errors import ConfigError
from verl_grpo.trainers import TRAINERS, get_trainer
from verl_grpo.trainers.precision import native_bf16
from verl_grpo.trainers.trl.backend import LOSS_TYPES, grpo_args, trl_top_k
from verl_grpo.trainers.worker.batch_layout import batch_layout
from verl_grpo.trainers.worker.metrics import MetricsLog, read_metrics
from verl_grpo.trainers.worker.progress import progress_line
from verl_grpo.trainers.worker.termination import Termination

_cfg = partial(build_config, env={})


def test_algorithm_fields_map_to_trl_names(tmp_path):
    cfg = _cfg("algorithm.rollouts=6", "algorithm.clip_low=0.15", "algorithm.clip_high=0.3", "algorithm.kl_coef=0.01",
               "algorithm.lr=3e-6", "algorithm.temperature=0.7", "algorithm.top_p=0.9", "algorithm.top_k=20",
               "algorithm.max_response_length=96", "algorithm.total_steps=7", "algorithm.save_freq=3",
               "algorithm.seed=11", "algorithm.train_batch_size=2", "trainer.logging_steps=2")
    args = grpo_args(cfg, tmp_path, use_cpu=True)
    assert (args.num_generations, args.epsilon, args.epsilon_high, args.beta) == (6, 0.15, 0.3, 0.01)
    assert (args.learning_rate, args.temperature, args.top_p, args.top_k) == (3e-6, 0.7, 0.9, 20)
    assert (args.max_completion_length, args.max_steps, args.save_steps, args.seed) == (96, 7, 3, 11)
    assert args.logging_steps == 2
    assert args.report_to == [] or args.report_to == ["none"]
    assert args.loss_type == "dapo"
    assert args.num_iterations == 1


def test_cpu_settings_keep_full_precision_and_full_checkpoints(tmp_path):
    args = grpo_args(_cfg(), tmp_path, use_cpu=True)
    assert args.use_cpu is True
    # trainer.precision=auto follows the host (bf16 only where this CPU computes it natively: test_precision.py)
    assert args.bf16 is native_bf16(use_cpu=True) and args.fp16 is False
    assert grpo_args(_cfg("trainer.precision=fp32"), tmp_path, use_cpu=True).bf16 is False
    assert args.save_only_model is False, "optimizer/scheduler/RNG are needed for an exact resume"
    assert args.dataloader_num_workers == 0
    assert args.output_dir == str(tmp_path)


@pytest.mark.parametrize("verl_top_k, expected", [(-1, 0), (0, 0), (1, 1), (50, 50)])
def test_top_k_disabled_value(verl_top_k, expected, tmp_path):
    assert trl_top_k(verl_top_k) == expected
    assert grpo_args(_cfg(f"algorithm.top_k={verl_top_k}"), tmp_path, use_cpu=True).top_k == expected


@pytest.mark.parametrize("mode, loss", sorted(LOSS_TYPES.items()))
def test_loss_agg_modes(mode, loss, tmp_path):
    assert grpo_args(_cfg(f"algorithm.loss_agg_mode={mode}"), tmp_path, use_cpu=True).loss_type == loss


def test_token_mean_is_global_token_normalisation():
    # verl token-mean divides by all response tokens of the step; TRL's dapo does, bnpo only per micro-batch.
    assert LOSS_TYPES["token-mean"] == "dapo"
    assert LOSS_TYPES["seq-mean-token-mean"] == "grpo"
    assert LOSS_TYPES["seq-mean-token-sum-norm"] == "dr_grpo"


def test_seq_mean_token_sum_has_no_trl_equivalent(tmp_path):
    with pytest.raises(ConfigError, match="algorithm.loss_agg_mode"):
        grpo_args(_cfg("algorithm.loss_agg_mode=seq-mean-token-sum"), tmp_path, use_cpu=True)


@pytest.mark.parametrize(
    "prompts, rollouts, micro",
    [(4, 4, None), (4, 4, 4), (4, 4, 8), (2, 4, 2), (8, 2, 4), (3, 5, 5), (1, 2, 1), (6, 3, 9)],
)
def test_one_optimizer_step_is_train_batch_times_rollouts(prompts, rollouts, micro, tmp_path):
    overrides = [f"algorithm.train_batch_size={prompts}", f"algorithm.rollouts={rollouts}"]
    if micro is not None:
        overrides.append(f"trainer.micro_batch_size={micro}")
    args = grpo_args(_cfg(*overrides), tmp_path, use_cpu=True)
    completions = prompts * rollouts
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == completions
    assert args.per_device_train_batch_size == (micro or completions)
    assert args.steps_per_generation == args.gradient_accumulation_steps, "one generation per optimizer step"
    assert args.generation_batch_size == completions
    assert args.generation_batch_size // args.num_generations == prompts


@pytest.mark.parametrize("prompts, rollouts, micro", [(4, 4, 8), (3, 2, 3), (2, 4, None)])
def test_trl_sampler_feeds_each_step_its_own_prompts(prompts, rollouts, micro, tmp_path):
    """Replay TRL's sampler/dataloader arithmetic: each step = `prompts` new prompts × `rollouts` copies."""
    from trl.trainer.utils import RepeatSampler

    overrides = [f"algorithm.train_batch_size={prompts}", f"algorithm.rollouts={rollouts}"]
    if micro is not None:
        overrides.append(f"trainer.micro_batch_size={micro}")
    args = grpo_args(_cfg(*overrides), tmp_path, use_cpu=True)
    n_rows = prompts * 5
    sampler = RepeatSampler(
        data_source=list(range(n_rows)),
        mini_repeat_count=args.num_generations,
        batch_size=args.generation_batch_size // args.num_generations,
        repeat_count=args.num_iterations * args.steps_per_generation,
        seed=args.seed,
    )
    # GRPOTrainer's dataloader batch is per_device × steps_per_generation; HF draws grad_accum batches per
    # optimizer step and GRPOTrainer generates only from the first of them.
    loader_batch = args.per_device_train_batch_size * args.steps_per_generation
    indices = list(sampler)
    batches = [indices[i : i + loader_batch] for i in range(0, len(indices), loader_batch)]
    steps = [batches[i : i + args.gradient_accumulation_steps]
             for i in range(0, len(batches), args.gradient_accumulation_steps)]
    assert len(steps) == 5
    seen = []
    for step in steps:
        generated = step[0]
        assert len(generated) == prompts * rollouts
        groups = [generated[i : i + rollouts] for i in range(0, len(generated), rollouts)]
        assert all(len(set(g)) == 1 for g in groups), "each prompt's rollouts are consecutive"
        seen.extend(g[0] for g in groups)
    assert sorted(seen) == list(range(n_rows)), "one epoch: every prompt exactly once"


def test_micro_batch_must_divide_the_step(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer.micro_batch_size \(5\).*4 × 4 = 16"):
        batch_layout(_cfg("algorithm.train_batch_size=4", "algorithm.rollouts=4", "trainer.micro_batch_size=5"))


def test_registry():
    assert {"trl", "verl"} <= set(TRAINERS)
    assert get_trainer("trl").name == "trl"
    with pytest.raises(ConfigError, match="trainer.backend 'nope'"):
        get_trainer("nope")


def test_check_describes_the_mapping_and_rejects_bad_settings():
    trainer = get_trainer("trl")
    line = trainer.check(_cfg("algorithm.train_batch_size=4", "algorithm.rollouts=4", "trainer.micro_batch_size=8"))
    assert "4 prompts x 4 rollouts" in line and "2 pass(es) of 8" in line and "dapo" in line
    with pytest.raises(ConfigError, match="algorithm.loss_agg_mode"):
        trainer.check(_cfg("algorithm.loss_agg_mode=seq-mean-token-sum"))
    with pytest.raises(ConfigError, match="trainer.backend"):
        trainer.check(_cfg("trainer.backend=verl"))


def test_metrics_log_dedupes_by_step_and_resets_to_checkpoint(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.reset()
    for step, reward in [(1, 0.1), (2, 0.2), (3, 0.3), (2, 0.25)]:
        log.append({"step": step, "reward": reward})
    assert [(r["step"], r["reward"]) for r in log.records()] == [(1, 0.1), (2, 0.25), (3, 0.3)]
    snapshot = tmp_path / "ckpt-metrics.jsonl"
    snapshot.write_text(log.path.read_text())
    log.reset(snapshot, upto_step=2)
    assert [r["step"] for r in read_metrics(log.path)] == [1, 2]


def test_progress_line():
    line = progress_line({"step": 3, "reward": 0.5, "loss": 0.01, "step_time": 1.25}, 10)
    assert line == "step 3/10 reward=0.5 loss=0.01 s/step=1.25"


def test_sigterm_waits_for_a_running_upload():
    previous = signal.getsignal(signal.SIGTERM)
    term = Termination()
    term.install()
    try:
        finished = []
        with pytest.raises(SystemExit) as exc, term.upload():
            os.kill(os.getpid(), signal.SIGTERM)
            finished.append("upload")
        assert finished == ["upload"]
        assert exc.value.code == 143
        with pytest.raises(SystemExit) as exc:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # not reached: the handler raises as soon as the signal is delivered
        assert exc.value.code == 143
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_search_tool_results_get_room_on_top_of_the_models_own_tokens(tmp_path):
    """TRL counts tool results against max_completion_length: with the tool, one result per turn of
    max_result_chars characters (≤ 1 token per 3 characters, plus the template's wrapping) is added."""
    cfg = load_config(["gsm8k", "local"], ["algorithm.max_response_length=96", "services.enabled=[retrieval]",
                                           "services.retrieval.max_tool_turns=2",
                                           "services.retrieval.max_result_chars=900"], env={})
    assert grpo_args(cfg, tmp_path, use_cpu=True).max_completion_length == 96 + 2 * (300 + 32)

