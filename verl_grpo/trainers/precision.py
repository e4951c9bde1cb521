"""Which precision a training process computes in: `trainer.precision` resolved on the machine that trains.

bf16 autocast pays off only where the hardware multiplies bf16 natively: on a CPU with AVX512-BF16 or AMX tiles
(oneDNN's bf16 kernels), on a GPU with bf16 support. Elsewhere torch emulates it through float32 conversions and a
step gets slower, not faster (bench/results/trl_step.md measured both), so `auto` chooses fp32 there.
"""

from __future__ import annotations

from typing import Literal

Precision = Literal["bf16", "fp32"]


def native_bf16(use_cpu: bool) -> bool:
    """True when this machine's training device computes bf16 natively."""
    import torch

    if not use_cpu:
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def resolve_precision(setting: str, use_cpu: bool) -> Precision:
    """`trainer.precision` (auto, fp32, bf16) as this machine runs it."""
    if setting == "auto":
        return "bf16" if native_bf16(use_cpu) else "fp32"
    return "bf16" if setting == "bf16" else "fp32"


def precision_line(setting: str, use_cpu: bool) -> str:
    """`precision bf16 (auto: ...)` for the worker's log: what it chose and why."""
    chosen = resolve_precision(setting, use_cpu)
    device = "CPU" if use_cpu else "GPU"
    if setting != "auto":
        native = "" if chosen == "fp32" or native_bf16(use_cpu) else \
            f"; this {device} has no native bf16, so bf16 is emulated and slower than fp32"
        return f"precision {chosen} (trainer.precision={setting}{native})"
    why = "native bf16" if chosen == "bf16" else "no native bf16"
    return f"precision {chosen} (trainer.precision=auto: this {device} has {why})"
