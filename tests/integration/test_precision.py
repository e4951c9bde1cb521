"""trainer.precision: what `auto` picks on which hardware, and that bf16 mixed precision, as the trainer runs it
(Accelerate's autocast, float32 master weights), keeps log-probs and losses within the stated tolerance of fp32.

Tolerance (per-token log-probs of the same tokens, GRPO's ratio inputs): mean absolute difference <= 0.1 nat and a
relative loss difference <= 1e-2. Measured on SmolLM2-135M-Instruct: 0.044 nat mean, 2.6e-4 loss
(bench/results/trl_step.md); the tiny model here stays far inside."""

from __future__ import annotations

import contextlib

import pytest
import torch

from verl_grpo.config import load_config
from verl_grpo.trainers import precision
from verl_grpo.trainers.trl.backend import grpo_args

LOGP_MEAN_ABS_TOL, LOSS_REL_TOL = 0.1, 1e-2


@pytest.mark.parametrize("avx512_bf16, amx, expected", [(True, False, "bf16"), (False, True, "bf16"),
                                                         (False, False, "fp32")])
def test_auto_takes_bf16_only_on_a_cpu_that_computes_it_natively(monkeypatch, avx512_bf16, amx, expected):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    args = grpo_args(load_config(["gsm8k", "local"]), "/unused", use_cpu=True)
    assert args.bf16 is (expected == "bf16") and not args.fp16
    assert precision.precision_line("auto", True).startswith(f"precision {expected} (trainer.precision=auto: ")
    # An explicit setting wins, and says when it is emulated.
    assert grpo_args(load_config(["gsm8k", "local"], ["trainer.precision=fp32"]), "/unused", use_cpu=True).bf16 is False
    forced = load_config(["gsm8k", "local"], ["trainer.precision=bf16"])
    assert grpo_args(forced, "/unused", use_cpu=True).bf16 is True
    assert ("emulated and slower" in precision.precision_line("bf16", True)) is (expected == "fp32")


def test_bf16_log_probs_and_loss_stay_within_tolerance_of_fp32(tiny_model_dir):
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import selective_log_softmax

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = torch.randint(0, model.config.vocab_size, (4, 48), generator=torch.Generator().manual_seed(0))
    autocast = Accelerator(cpu=True, mixed_precision="bf16").autocast()  # what the Trainer enters for bf16=True

    def log_probs_and_loss(context):
        with torch.no_grad(), context:
            out = model(input_ids=ids, labels=ids)
        return selective_log_softmax(out.logits[:, :-1].float(), ids[:, 1:]), out.loss.float(), out.logits.dtype

    lp32, loss32, dtype32 = log_probs_and_loss(contextlib.nullcontext())
    lp16, loss16, dtype16 = log_probs_and_loss(autocast)
    assert (dtype32, dtype16) == (torch.float32, torch.bfloat16)  # autocast really ran the matmuls in bf16
    assert next(model.parameters()).dtype == torch.float32  # master weights stay float32
    diff = (lp16 - lp32).abs()
    assert 0 < diff.mean().item() <= LOGP_MEAN_ABS_TOL
    assert abs(loss16 - loss32).item() / loss32.item() <= LOSS_REL_TOL
