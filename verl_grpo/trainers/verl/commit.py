"""Committing a verl `global_step_N` dir to the store: check it is whole, stage it, add the metrics so far.

Used by the checkpoint callback after each save (in the background) and by finalize when the last upload was lost.
"""

from __future__ import annotations

import re
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.contracts import CheckpointRef
from verl_grpo.errors import ConfigError, TrainingError
from verl_grpo.layout import step_dir_name
from verl_grpo.trainers.protocol import METRICS_FILE, write_jsonl_atomic
from verl_grpo.trainers.verl.metrics import merged_metrics
from verl_grpo.trainers.verl.settings import STAGING_DIR, StoreSettings

DATALOADER_FILE = "data.pt"
FSDP_CONFIG_FILE = "fsdp_config.json"


def check_complete(step_dir: Path) -> None:
    """Raise unless verl finished writing `step_dir`: dataloader state present, every FSDP rank's shard present.

    FSDP ranks write their shards to their own node's disk; on a multi-node run without a shared
    default_local_dir the driver sees only its node's ranks, and committing that would store a torn checkpoint.
    """
    step_dir = Path(step_dir)
    if not (step_dir / DATALOADER_FILE).is_file():
        raise TrainingError(f"checkpoint {step_dir} has no {DATALOADER_FILE}; verl did not finish saving it")
    for fsdp_config in sorted(step_dir.glob(f"*/{FSDP_CONFIG_FILE}")):
        role = fsdp_config.parent
        world = int(json.loads(fsdp_config.read_text())["world_size"])
        for kind in ("model", "optim", "extra_state"):
            present = {int(p.stem.rsplit("_", 1)[1]) for p in role.glob(f"{kind}_world_size_{world}_rank_*.pt")}
            if present and present != set(range(world)):
                missing = sorted(set(range(world)) - present)
                raise ConfigError(
                    f"checkpoint {role} lacks {kind} shards of ranks {missing[:8]} (world size {world}): they were "
                    "written on other nodes' disks. Multi-node verl runs need trainer.default_local_dir on a "
                    "filesystem shared by all nodes; until then use infra.nodes=1")


def checkpoint_state(step_dir: Path, step: int, train_batch_size: int | None) -> dict[str, Any]:
    """The manifest `state`: step and data position (verl's dataloader state travels as data.pt in the dir)."""
    state: dict[str, Any] = {"backend": "verl", "global_step": step, "dataloader_state_file": DATALOADER_FILE}
    if train_batch_size:
        state["prompts_consumed"] = step * int(train_batch_size)
    data_pt = Path(step_dir) / DATALOADER_FILE
    if data_pt.is_file():
        import torch

        loaded = torch.load(data_pt, map_location="cpu", weights_only=False)
        if isinstance(loaded, Mapping) and isinstance(loaded.get("_num_yielded"), int):
            state["dataloader_batches_yielded"] = loaded["_num_yielded"]
    return state


def stage(step_dir: Path, staging_root: Path) -> Path:
    """Hard-link (copy across filesystems) every file of step_dir into staging_root/<name>; instant on one disk."""
    step_dir, target = Path(step_dir), Path(staging_root) / Path(step_dir).name
    if target.exists():
        shutil.rmtree(target)
    for src in sorted(p for p in step_dir.rglob("*") if p.is_file()):
        dest = target / src.relative_to(step_dir)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dest)
        except OSError:
            shutil.copy2(src, dest)
    return target


def prepare_upload(settings: StoreSettings, step_dir: Path, step: int) -> Path:
    """Check, stage and add the metrics so far: the directory that `CheckpointStore.save` uploads."""
    check_complete(step_dir)
    staged = stage(step_dir, settings.checkpoint_dir / STAGING_DIR)
    write_jsonl_atomic(staged / METRICS_FILE, merged_metrics(settings, upto_step=step))
    return staged


COMMITTED_LINE = re.compile(r"^checkpoint step (\d+) committed to ")
"""The log line of each commit (`after_commit`); the rehearsal reads it to report commits and time preemptions."""


def after_commit(checkpoints: CheckpointStore, settings: StoreSettings) -> Callable[[CheckpointRef], None]:
    """What follows each commit: drop its staged copy, prune to storage.keep_last, log one line."""

    def done(ref: CheckpointRef) -> None:
        shutil.rmtree(settings.checkpoint_dir / STAGING_DIR / step_dir_name(ref.step), ignore_errors=True)
        checkpoints.prune(settings.run_id, settings.keep_last)
        print(f"checkpoint step {ref.step} committed to {ref.uri}", flush=True)

    return done


def commit_now(settings: StoreSettings, step: int, train_batch_size: int | None = None,
               checkpoints: CheckpointStore | None = None) -> CheckpointRef:
    """Synchronously commit the local `global_step_{step}` (used at the end when the callback's upload was lost)."""
    checkpoints = checkpoints or CheckpointStore(settings.store())
    step_dir = settings.checkpoint_dir / step_dir_name(step)
    staged = prepare_upload(settings, step_dir, step)
    ref = checkpoints.save(settings.run_id, step, staged, checkpoint_state(step_dir, step, train_batch_size))
    after_commit(checkpoints, settings)(ref)
    return ref
