"""Benchmark: fp32 against bf16 mixed precision (trainer.precision) on the `make run` model; writes
bench/results/precision.md.

Both sides in one run, one after the other, on SmolLM2-135M-Instruct with float32 weights and the profile's torch
threads, as the trl backend runs them: bf16 is Accelerate's autocast (what the Trainer enters for `bf16=True`, also
around `generate`), the master weights stay float32.

- generate: the step's 8 rows (2 prompts × 4 rollouts), 32 new tokens each, sampled;
- update: forward + backward + AdamW step on 2 rows of 192 tokens (the step's micro-batch shape, shortened);
- numerics: per-token log-probs of the same tokens and the mean loss, bf16 against fp32, with the tolerance
  tests/integration/test_precision.py holds the tiny model to.

It also says which precision `trainer.precision=auto` takes on this machine (native bf16: AVX512-BF16 or AMX).
Full GRPO steps in either precision: `python bench/trl_step_bench.py -o trainer.precision=bf16`.

Run: `python bench/precision_bench.py` (about 3 minutes on a CPU without native bf16, where bf16 is emulated).
"""

from __future__ import annotations

import contextlib
import platform
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "precision.md"
LOGP_MEAN_ABS_TOL, LOSS_REL_TOL = 0.1, 1e-2  # as tests/integration/test_precision.py


def main() -> None:
    import torch
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.utils import selective_log_softmax

    from verl_grpo.config import load_config
    from verl_grpo.models import resolve_model
    from verl_grpo.trainers.precision import native_bf16, precision_line

    cfg = load_config(["gsm8k", "local"])
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    model_dir = resolve_model(cfg.model.name)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    prompts = [f"Natalia sold clips to {i * 7 + 5} of her friends in April, and then she sold half as many clips in "
               "May. How many clips did Natalia sell altogether in April and May?" for i in range(8)]
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    autocast = Accelerator(cpu=True, mixed_precision="bf16").autocast
    sides = {"fp32": contextlib.nullcontext, "bf16": autocast}

    def generate(context) -> float:
        torch.manual_seed(0)
        started = time.perf_counter()
        with torch.no_grad(), context():
            model.generate(**enc, max_new_tokens=32, min_new_tokens=32, do_sample=True, top_k=0,
                           pad_token_id=tokenizer.pad_token_id)
        return time.perf_counter() - started

    ids = torch.randint(0, 5000, (2, 192), generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)  # lr 0: every side updates the same weights

    def update(context) -> float:
        started = time.perf_counter()
        with context():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - started

    def numerics(context):
        with torch.no_grad(), context():
            out = model(input_ids=ids, labels=ids)
        return selective_log_softmax(out.logits[:, :-1].float(), ids[:, 1:]), out.loss.float().item()

    generate(contextlib.nullcontext)  # warm-up: first-call allocations and kernel selection
    times = {side: (generate(ctx), update(ctx)) for side, ctx in sides.items()}
    (lp32, loss32), (lp16, loss16) = numerics(sides["fp32"]), numerics(sides["bf16"])
    diff = (lp16 - lp32).abs()
    loss_rel = abs(loss16 - loss32) / loss32

    rows = [f"| generate 8 rows × 32 tokens | {times['fp32'][0]:.2f} s | {times['bf16'][0]:.2f} s | "
            f"{times['fp32'][0] / times['bf16'][0]:.2f}x |",
            f"| update (forward + backward + AdamW), 2 × 192 tokens | {times['fp32'][1]:.2f} s | "
            f"{times['bf16'][1]:.2f} s | {times['fp32'][1] / times['bf16'][1]:.2f}x |"]
    native = native_bf16(use_cpu=True)
    text = f"""# Precision: fp32 against bf16 mixed precision (`trainer.precision`)

Written by `bench/precision_bench.py` on {time.strftime('%Y-%m-%d')}. SmolLM2-135M-Instruct (float32 master
weights), torch threads {torch.get_num_threads()}; bf16 = Accelerate's autocast, as the trl backend's Trainer runs it (also around
`generate`). Both sides in one run, one after the other.

This machine: {platform.processor() or platform.machine()}, torch CPU capability {torch.backends.cpu.get_cpu_capability()},
native bf16 (AVX512-BF16 or AMX): **{'yes' if native else 'no'}**. `trainer.precision=auto` here:
`{precision_line('auto', True)}`.

| measure | fp32 | bf16 autocast | speed-up fp32/bf16 |
|---|---:|---:|---:|
{chr(10).join(rows)}

Numerics (the same 2 × 192 tokens): per-token log-prob mean |bf16 - fp32| = {diff.mean().item():.4f} nat (max
{diff.max().item():.4f}; tolerance {LOGP_MEAN_ABS_TOL}), loss {loss32:.5f} (fp32) vs {loss16:.5f} (bf16), relative
difference {loss_rel:.1e} (tolerance {LOSS_REL_TOL:g}): {'within' if diff.mean().item() <= LOGP_MEAN_ABS_TOL and loss_rel <= LOSS_REL_TOL else 'OUTSIDE'} the tolerance.

Other hosts (earlier runs, not repeated by this one):
- x86_64, torch CPU capability AVX2, no native bf16 (2026-11-26, this page at 2d11c26): generate 0.50x (5.67 s
  fp32, 11.44 s bf16), update 0.07x (6.52 s fp32, 91.94 s bf16).
- the AVX512-BF16 host of issue #28: generate 1.5x, forward + backward 1.6x.
"""
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
