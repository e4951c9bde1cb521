"""Committing a verl `global_step_N` dir to the store: check it is whole, stage it, add the metrics so far.

On a multi-node run every node's checkpoint sync uploads its ranks' files to the store (`StoreSettings.mount`,
`checkpoint_sync`): the commit waits until the store holds the whole dir and writes the manifest in place
(`commit_mounted`). Used by the checkpoint callback after each save (in the background) and by finalize when the
last commit was lost.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.contracts import CheckpointRef
from verl_grpo.errors import ConfigError, InfraError, TrainingError
from verl_grpo.store_layout import CHECKPOINT_MANIFEST, METRICS_FILE, SAMPLES_FILE, checkpoint_dir, step_dir_name
from verl_grpo.trainers.atomic_files import write_jsonl_atomic
from verl_grpo.trainers.verl.metrics import merged_metrics
from verl_grpo.trainers.verl.samples import trim_dumps
from verl_grpo.trainers.verl.settings import STAGING_DIR, StoreSettings

DATALOADER_FILE = "data.pt"
FSDP_CONFIG_FILE = "fsdp_config.json"


def missing_parts(names: Iterable[str], read_json: Callable[[str], Any]) -> list[str]:
    """What a verl step dir with these files (paths relative to it) lacks: data.pt, FSDP ranks' shards.

    verl writes data.pt last on the driver; each role's fsdp_config.json names the world size whose every rank writes
    its own model/optim/extra_state shard (a kind no rank wrote is not expected)."""
    names = set(names)
    missing = [] if DATALOADER_FILE in names else [DATALOADER_FILE]
    for config in sorted(n for n in names if n.count("/") == 1 and n.endswith(f"/{FSDP_CONFIG_FILE}")):
        role = config.rsplit("/", 1)[0]
        world = int(read_json(config)["world_size"])
        for kind in ("model", "optim", "extra_state"):
            pattern = re.compile(rf"^{re.escape(role)}/{kind}_world_size_{world}_rank_(\d+)\.pt$")
            present = {int(m.group(1)) for n in names if (m := pattern.match(n))}
            if present and present != set(range(world)):
                ranks = sorted(set(range(world)) - present)
                missing.append(f"{role}/{kind} shards of ranks {ranks[:8]} (world size {world})")
    return missing


def check_complete(step_dir: Path) -> None:
    """Raise unless verl finished writing `step_dir`: dataloader state present, every FSDP rank's shard present.

    FSDP ranks write their shards to their own node's disk; on a multi-node run without the nodes' checkpoint sync
    (`settings.ENV_CHECKPOINT_MOUNT`) the driver sees only its node's ranks, and committing that would store a torn
    checkpoint.
    """
    step_dir = Path(step_dir)
    names = [p.relative_to(step_dir).as_posix() for p in step_dir.rglob("*") if p.is_file()]
    missing = missing_parts(names, lambda rel: json.loads((step_dir / rel).read_text()))
    if DATALOADER_FILE in missing:
        raise TrainingError(f"checkpoint {step_dir} has no {DATALOADER_FILE}; verl did not finish saving it")
    if missing:
        raise ConfigError(
            f"checkpoint {step_dir} lacks {'; '.join(missing)}: they were written on other nodes' disks. "
            "Multi-node verl runs upload every node's checkpoint dir to the store (checkpoint_sync), which the "
            "skypilot provider renders for infra.nodes > 1; launch through verl-grpo, or use infra.nodes=1")


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
    write_step_logs(settings, staged, step)
    return staged


UPLOAD_WAIT_S = 1800.0
"""Longest a commit waits for the nodes' checkpoint syncs to upload a step dir (they write back asynchronously, file by
file, once each file has settled)."""
UPLOAD_POLL_S = 1.0


def await_uploaded(checkpoints: CheckpointStore, settings: StoreSettings, step: int,
                   timeout_s: float = UPLOAD_WAIT_S, poll_s: float = UPLOAD_POLL_S) -> dict[str, int]:
    """Wait until the store holds step's dir as verl left it on every node; returns its {path: size}.

    Whole means: each file this node sees in the mounted dir is in the store at the same size (an object appears
    only once its upload is complete), and the store's copy has data.pt and every FSDP rank's shards, whichever
    node wrote them. A step still short at the deadline fails with a retryable InfraError and stays uncommitted.
    """
    step_dir = settings.checkpoint_dir / step_dir_name(step)
    base = checkpoint_dir(settings.run_id, step)
    deadline = time.monotonic() + timeout_s
    while True:
        stored = checkpoints.listing(settings.run_id, step)
        here = {p.relative_to(step_dir).as_posix(): p.stat().st_size for p in step_dir.rglob("*")
                if p.is_file() and p.name != CHECKPOINT_MANIFEST}
        behind = sorted(rel for rel, size in here.items() if stored.get(rel) != size)
        missing = behind + missing_parts(stored, lambda rel: json.loads(checkpoints.store.read_text(base, rel)))
        if not missing:
            return stored
        if time.monotonic() >= deadline:
            raise InfraError(f"checkpoint step {step}: the store still lacks {', '.join(missing[:5])} after "
                             f"{timeout_s:.0f} s; the nodes' checkpoint syncs (to {settings.mount}, log: "
                             "checkpoint-sync.log beside each node's metrics) did not upload it, "
                             "so it stays uncommitted")
        time.sleep(poll_s)


def commit_mounted(checkpoints: CheckpointStore, settings: StoreSettings, step: int,
                   state: dict[str, Any] | None) -> CheckpointRef:
    """Commit a step dir the nodes' checkpoint syncs upload: wait for the uploads, then the manifest, in place."""
    await_uploaded(checkpoints, settings, step)
    return checkpoints.commit_in_place(settings.run_id, step, state)


def write_step_metrics(settings: StoreSettings, step: int) -> Path:
    """The metrics and samples so far into the local step dir, where the checkpoint sync uploads them with verl's
    files; returns the metrics file."""
    return write_step_logs(settings, settings.checkpoint_dir / step_dir_name(step), step)


def write_step_logs(settings: StoreSettings, step_dir: Path, step: int) -> Path:
    """metrics.jsonl and samples.jsonl up to step into a checkpoint's dir; then the rollout dumps before this step
    shrink to what samples.jsonl reads. Returns the metrics file."""
    metrics = write_jsonl_atomic(step_dir / METRICS_FILE, merged_metrics(settings, upto_step=step))
    write_jsonl_atomic(step_dir / SAMPLES_FILE, settings.merged_samples(upto_step=step))
    trim_dumps(settings.rollout_dir, settings.samples, before_step=step)
    return metrics


COMMITTED_LINE = re.compile(r"^checkpoint step (\d+) committed to ")
"""The log line of each commit (`after_commit`); the rehearsal reads it to report commits and time preemptions."""


def after_commit(checkpoints: CheckpointStore, settings: StoreSettings) -> Callable[[CheckpointRef], None]:
    """What follows each commit: drop its staged copy, prune to storage.keep_last, log one line."""

    def done(ref: CheckpointRef) -> None:
        if not settings.mount:
            shutil.rmtree(settings.checkpoint_dir / STAGING_DIR / step_dir_name(ref.step), ignore_errors=True)
        checkpoints.prune(settings.run_id, settings.keep_last)
        print(f"checkpoint step {ref.step} committed to {ref.uri}", flush=True)

    return done


def commit_now(settings: StoreSettings, step: int, train_batch_size: int | None = None,
               checkpoints: CheckpointStore | None = None) -> CheckpointRef:
    """Synchronously commit the local `global_step_{step}` (used at the end when the callback's upload was lost)."""
    checkpoints = checkpoints or CheckpointStore(settings.store())
    step_dir = settings.checkpoint_dir / step_dir_name(step)
    if settings.mount:
        write_step_metrics(settings, step)
        ref = commit_mounted(checkpoints, settings, step, checkpoint_state(step_dir, step, train_batch_size))
    else:
        staged = prepare_upload(settings, step_dir, step)
        ref = checkpoints.save(settings.run_id, step, staged, checkpoint_state(step_dir, step, train_batch_size))
    after_commit(checkpoints, settings)(ref)
    return ref
