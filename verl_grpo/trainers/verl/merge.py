"""The final actor checkpoint → an HF model directory, with verl's own `verl.model_merger` CLI."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from verl_grpo.errors import ConfigError, TrainingError

MERGE_BACKENDS = {"fsdp": "fsdp", "fsdp2": "fsdp", "megatron": "megatron"}
"""verl.verl.strategy → `verl.model_merger --backend`."""


def merge_command(actor_dir: Path, target_dir: Path, backend: str = "fsdp", python: str | None = None) -> list[str]:
    """`python -m verl.model_merger merge --backend … --local_dir <global_step_N/actor> --target_dir …`."""
    if backend not in MERGE_BACKENDS:
        raise ConfigError(f"verl.strategy {backend!r} has no model_merger backend; use one of {sorted(MERGE_BACKENDS)}")
    return [python or sys.executable, "-m", "verl.model_merger", "merge", "--backend", MERGE_BACKENDS[backend],
            "--local_dir", str(actor_dir), "--target_dir", str(target_dir)]


def merge_actor(actor_dir: Path, target_dir: Path, backend: str = "fsdp",
                run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> Path:
    """Merge a verl actor checkpoint into an HF model directory (in a subprocess: its memory is freed after)."""
    target_dir = Path(target_dir)
    if target_dir.exists():
        shutil.rmtree(target_dir)
    proc = run(merge_command(actor_dir, target_dir, backend), capture_output=True, text=True)
    if proc.returncode != 0:
        raise TrainingError(f"verl.model_merger failed on {actor_dir} (exit {proc.returncode}):\n"
                            f"{(proc.stderr or proc.stdout or '')[-2000:]}")
    if not (target_dir / "config.json").is_file():
        raise TrainingError(f"verl.model_merger wrote no config.json into {target_dir}")
    return target_dir
