"""verl checkpoints in the store: upload each `global_step_N` as verl saves it, restore before a resume, publish at the end.

Three moments of a verl run on a cluster, all configured by non-secret env vars the SkyPilot task sets
(`checkpoint_env` builds them; credentials come from the environment as usual):

1. **Before main_ppo** (`python -m verl_grpo.trainers.verl.restore`, every node): restore the store's
   `latest_complete(run_id)` into `trainer.default_local_dir` and write verl's
   `latest_checkpointed_iteration.txt` atomically, so `resume_mode=auto` resumes exactly the checkpoint the
   store verified. Local `global_step_*` dirs the store did not vouch for are removed, never chosen.
2. **During training**: `StoreCheckpointCallback` is verl 0.9.1's `trainer.checkpoint_callback_class`
   (verl calls `on_save(trainer=, global_step=, checkpoint_dir=, async_save=)` on the driver after each save).
   It hard-links the step dir into a staging dir (verl may delete the original at its next save while the
   upload runs), adds the metrics so far, and commits it through `CheckpointStore` on a `BackgroundSaver`.
3. **After main_ppo** (`python -m verl_grpo.trainers.verl.finalize`, head node): make sure the final step is
   committed, merge the final actor to an HF model with `verl.model_merger`, upload it to
   `runs/{run_id}/model`, and write `runs/{run_id}/metrics.jsonl` and `runs/{run_id}/train_result.json`
   (the pipeline reads the latter from the store).

verl is never imported here: its callback protocol is duck-typed, so this module stays cheap to import.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_grpo.checkpoints import BackgroundSaver, CheckpointStore
from verl_grpo.contracts import CheckpointRef, TrainResult
from verl_grpo.errors import ConfigError, DataError, TrainingError
from verl_grpo.layout import model_dir, run_metrics, step_dir_name, train_result
from verl_grpo.store import Store
from verl_grpo.trainers.protocol import (
    METRICS_FILE,
    STEP_PREFIX,
    LocalCheckpoints,
    SummaryNames,
    restore_latest as restore_from_store,
    summarize,
    write_jsonl_atomic,
    write_text_atomic,
)

log = logging.getLogger(__name__)

ENV_STORE_URI = "VERL_GRPO_STORE_URI"
ENV_STORE_ENDPOINT = "VERL_GRPO_STORE_ENDPOINT"
ENV_RUN_ID = "VERL_GRPO_RUN_ID"
ENV_CHECKPOINT_DIR = "VERL_GRPO_CHECKPOINT_DIR"
"""Must equal verl's trainer.default_local_dir (verl_overrides sets both from the same value)."""
ENV_KEEP_LAST = "VERL_GRPO_KEEP_LAST"
ENV_VERL_METRICS = "VERL_FILE_LOGGER_PATH"
"""verl's own `file` logger writes one `{"step": N, "data": {...}}` line per step here (truncated at each start)."""

CALLBACK_CLASS = "verl_grpo.trainers.verl.checkpoints.StoreCheckpointCallback"
TRACKER_FILE = "latest_checkpointed_iteration.txt"
"""verl's resume tracker in default_local_dir (verl.utils.checkpoint.checkpoint_manager.get_checkpoint_tracker_filename)."""
DATALOADER_FILE = "data.pt"
FSDP_CONFIG_FILE = "fsdp_config.json"
STAGING_DIR = ".staging"
MERGE_BACKENDS = {"fsdp": "fsdp", "fsdp2": "fsdp", "megatron": "megatron"}
"""verl.verl.strategy → `verl.model_merger --backend`."""


@dataclass(frozen=True)
class StoreSettings:
    """Where a verl run's checkpoints go, read from the env vars the task sets."""

    uri: str
    endpoint_url: str | None
    run_id: str
    checkpoint_dir: Path
    keep_last: int = 2

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "StoreSettings":
        env = os.environ if env is None else env
        missing = [k for k in (ENV_STORE_URI, ENV_RUN_ID, ENV_CHECKPOINT_DIR) if not env.get(k)]
        if missing:
            raise ConfigError(f"{', '.join(missing)} not set; the verl task sets them from the run config "
                              "(verl_grpo.trainers.verl.checkpoints.checkpoint_env) — launch through verl-grpo")
        try:
            keep = int(env.get(ENV_KEEP_LAST) or 2)
        except ValueError:
            raise ConfigError(f"{ENV_KEEP_LAST}={env[ENV_KEEP_LAST]!r} is not an integer (storage.keep_last)") from None
        return cls(uri=env[ENV_STORE_URI], endpoint_url=env.get(ENV_STORE_ENDPOINT) or None, run_id=env[ENV_RUN_ID],
                   checkpoint_dir=Path(env[ENV_CHECKPOINT_DIR]), keep_last=max(keep, 1))

    @property
    def metrics_dir(self) -> Path:
        return self.checkpoint_dir / "metrics"

    @property
    def history_path(self) -> Path:
        """Metrics of the steps before this process started (from the restored checkpoint)."""
        return self.metrics_dir / "history.jsonl"

    @property
    def verl_metrics_path(self) -> Path:
        """verl's file logger output of this process."""
        return self.metrics_dir / "verl.jsonl"

    @property
    def local_checkpoints(self) -> LocalCheckpoints:
        """verl's `global_step_{N}` dirs in trainer.default_local_dir."""
        return LocalCheckpoints(self.checkpoint_dir, STEP_PREFIX)

    def store(self) -> Store:
        return Store(self.uri, self.endpoint_url)


def checkpoint_env(uri: str, endpoint_url: str | None, run_id: str, checkpoint_dir: str, keep_last: int) -> dict[str, str]:
    """The non-secret env of a verl task that the callback, restore and finalize entries read."""
    env = {ENV_STORE_URI: uri, ENV_RUN_ID: run_id, ENV_CHECKPOINT_DIR: checkpoint_dir, ENV_KEEP_LAST: str(keep_last),
           ENV_VERL_METRICS: f"{checkpoint_dir}/metrics/verl.jsonl"}
    if endpoint_url:
        env[ENV_STORE_ENDPOINT] = endpoint_url
    return env


# ---- checkpoint contents -------------------------------------------------------------------------------------------

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


# ---- metrics ---------------------------------------------------------------------------------------------------------

def read_records(path: Path) -> list[dict[str, Any]]:
    """Flat `{"step": N, key: value}` records of a metrics.jsonl or of verl's file logger (`{"step", "data"}`)."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError:
            continue  # the last line of a log killed mid-write
        data = raw.get("data") if isinstance(raw.get("data"), dict) else {k: v for k, v in raw.items() if k != "step"}
        out.append({"step": int(raw["step"]), **data})
    return out


def merged_metrics(settings: StoreSettings, upto_step: int | None = None) -> list[dict[str, Any]]:
    """History (earlier processes) + this process's verl log, one record per step (later wins), in step order.

    verl logs step 0's initial validation and each step's line after that step's save, so a checkpoint of
    step N carries lines up to N-1 (step N's own line reaches the store with the next save or at the end).
    """
    by_step: dict[int, dict[str, Any]] = {}
    for record in read_records(settings.history_path) + read_records(settings.verl_metrics_path):
        if upto_step is None or record["step"] <= upto_step:
            by_step.setdefault(record["step"], {}).update(record)
    return [by_step[s] for s in sorted(by_step)]


SUMMARY = SummaryNames(
    final={
        "critic/score/mean": "final_reward",
        "critic/rewards/mean": "final_rewards_mean",
        "actor/entropy": "final_entropy",
        "actor/pg_loss": "final_loss",
        "actor/kl_loss": "final_kl",
        "response_length/mean": "final_completions_mean_length",
    },
    reward="critic/score/mean",
    final_prefixes={"val-core/": "val-core/"},
    first_step=1,
)
"""verl's metric names → the summary names the TRL backend uses; step 0 is verl's initial validation."""


# ---- commit ----------------------------------------------------------------------------------------------------------

def prepare_upload(settings: StoreSettings, step_dir: Path, step: int) -> Path:
    """Check, stage and add the metrics so far: the directory that `CheckpointStore.save` uploads."""
    check_complete(step_dir)
    staged = stage(step_dir, settings.checkpoint_dir / STAGING_DIR)
    write_jsonl_atomic(staged / METRICS_FILE, merged_metrics(settings, upto_step=step))
    return staged


def _after_commit(checkpoints: CheckpointStore, settings: StoreSettings) -> Callable[[CheckpointRef], None]:
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
    _after_commit(checkpoints, settings)(ref)
    return ref


class StoreCheckpointCallback:
    """verl 0.9.1 `trainer.checkpoint_callback_class`: commit each saved `global_step_N` to the store.

    Follows verl's CheckpointCallback protocol (`__init__(config)`, `on_save(trainer, global_step,
    checkpoint_dir, async_save, **kwargs)`). Uploads run in a background thread; training waits only if the
    previous upload is still running at the next save, and the last step's upload is awaited before
    on_save returns (the driver exits right after fit). Errors propagate, which aborts training: verl's
    documented contract for durability-critical callbacks.
    """

    def __init__(self, config: Any = None, env: Mapping[str, str] | None = None,
                 checkpoints: CheckpointStore | None = None):
        self.config = config
        self.settings = StoreSettings.from_env(env)
        if config is not None:
            local_dir = str(_select(config, "trainer.default_local_dir") or "")
            if local_dir and Path(local_dir) != self.settings.checkpoint_dir:
                raise ConfigError(f"trainer.default_local_dir {local_dir!r} differs from {ENV_CHECKPOINT_DIR}="
                                  f"{self.settings.checkpoint_dir}; set both from the same value")
            if _select(config, "actor_rollout_ref.actor.checkpoint.async_save"):
                raise ConfigError("actor_rollout_ref.actor.checkpoint.async_save=True leaves checkpoints unfinished "
                                  "when verl calls on_save; set it to False to commit checkpoints to the store")
        self.train_batch_size = _select(config, "data.train_batch_size") if config is not None else None
        self.checkpoints = checkpoints or CheckpointStore(self.settings.store())
        self.saver = BackgroundSaver(self.checkpoints, on_committed=_after_commit(self.checkpoints, self.settings))

    def on_save(self, trainer: Any = None, global_step: int = 0, checkpoint_dir: str = "", async_save: bool = False,
                **kwargs: Any) -> None:
        if async_save:
            raise ConfigError(f"verl saved step {global_step} asynchronously; it is not durable yet and cannot be "
                              "committed. Set actor_rollout_ref.actor.checkpoint.async_save=False")
        step_dir = Path(checkpoint_dir)
        if step_dir.name != step_dir_name(global_step):
            raise TrainingError(f"verl reported step {global_step} but checkpoint dir {step_dir}; expected "
                                f"{step_dir_name(global_step)}")
        staged = prepare_upload(self.settings, step_dir, global_step)
        state = checkpoint_state(step_dir, global_step, self.train_batch_size)
        self.saver.submit(self.settings.run_id, global_step, staged, state)
        total = getattr(trainer, "total_training_steps", None)
        if total is None and self.config is not None:
            total = _select(self.config, "trainer.total_training_steps")
        if total is not None and global_step >= int(total):
            self.saver.wait()

    def close(self) -> CheckpointRef | None:
        """Wait for the in-flight upload (if any); re-raises its error."""
        return self.saver.close()


def _select(config: Any, dotted: str) -> Any:
    node = config
    for part in dotted.split("."):
        if node is None:
            return None
        node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
    return node


# ---- restore ---------------------------------------------------------------------------------------------------------

def write_tracker(checkpoint_dir: Path, step: int) -> Path:
    """verl's `latest_checkpointed_iteration.txt`, written atomically."""
    return write_text_atomic(Path(checkpoint_dir) / TRACKER_FILE, str(int(step)))


def restore_latest(settings: StoreSettings, checkpoints: CheckpointStore | None = None) -> int | None:
    """Make default_local_dir hold exactly the store's latest complete checkpoint; returns its step (None: fresh start).

    Local `global_step_*` dirs other than the restored one are deleted and the tracker is rewritten (or removed),
    so verl's resume_mode=auto can only pick a checkpoint whose every file matched the manifest's sha256.
    """
    checkpoints = checkpoints or CheckpointStore(settings.store())
    local = settings.checkpoint_dir
    local.mkdir(parents=True, exist_ok=True)
    # Remove the tracker first: a crash below must leave "start fresh", never a pointer to a half-restored dir.
    (local / TRACKER_FILE).unlink(missing_ok=True)
    shutil.rmtree(local / STAGING_DIR, ignore_errors=True)
    restored = restore_from_store(checkpoints, settings.run_id, settings.local_checkpoints)
    if restored is None:
        write_jsonl_atomic(settings.history_path, [])
        print(f"no committed checkpoint of run {settings.run_id}; verl starts from scratch", flush=True)
        return None
    ref, step_dir = restored
    write_jsonl_atomic(settings.history_path, read_records(step_dir / METRICS_FILE))
    write_tracker(local, ref.step)
    print(f"restored checkpoint step {ref.step} of run {settings.run_id} from {ref.uri}", flush=True)
    return ref.step


def fetch_dataset(store_uri: str, endpoint_url: str | None, dataset_uri: str, local_dir: Path) -> bool:
    """Download the prepared dataset into local_dir unless its parquet files are there (a mount); True if fetched.

    `sky exec` on an existing cluster does not sync file mounts, so the task fetches the data itself.
    """
    local_dir = Path(local_dir)
    if any(local_dir.glob("*.parquet")):
        return False
    store = Store(store_uri, endpoint_url)
    if not dataset_uri.startswith(store.uri + "/"):
        raise DataError(f"dataset {dataset_uri} is not under the store {store.uri}; re-run data preparation "
                        "with this storage.uri")
    rel = dataset_uri[len(store.uri) + 1:]
    if not store.exists(rel):
        raise DataError(f"dataset {dataset_uri} is missing from the store and not mounted at {local_dir}; "
                        "re-run data preparation")
    store.get_dir(local_dir, rel)
    return True


# ---- finalize --------------------------------------------------------------------------------------------------------

def read_tracker(checkpoint_dir: Path) -> int | None:
    tracker = Path(checkpoint_dir) / TRACKER_FILE
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    return int(text) if text.isdigit() else None


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


def finalize(settings: StoreSettings, backend: str = "fsdp", train_batch_size: int | None = None,
             checkpoints: CheckpointStore | None = None,
             run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> TrainResult:
    """Commit the final step if needed, merge and upload the model, write metrics.jsonl and train_result.json."""
    store = settings.store()
    checkpoints = checkpoints or CheckpointStore(store)
    final_step = read_tracker(settings.checkpoint_dir)
    if final_step is None:
        raise TrainingError(f"verl left no {TRACKER_FILE} in {settings.checkpoint_dir}; it saved no checkpoint "
                            "(trainer.save_freq must be > 0) or did not finish")
    ref = checkpoints.latest_complete(settings.run_id)
    if ref is None or ref.step < final_step:
        ref = commit_now(settings, final_step, train_batch_size, checkpoints)
    merged = merge_actor(settings.checkpoint_dir / step_dir_name(final_step) / "actor",
                         settings.checkpoint_dir.parent / f"{settings.checkpoint_dir.name}-model", backend, run)
    store.rm(model_dir(settings.run_id))
    model_uri = store.put_dir(merged, model_dir(settings.run_id))
    records = merged_metrics(settings)
    local_metrics = write_jsonl_atomic(settings.metrics_dir / METRICS_FILE, records)
    metrics_uri = store.put_file(local_metrics, run_metrics(settings.run_id))
    result = TrainResult(run_id=settings.run_id, final_step=final_step, checkpoint=ref, model_uri=model_uri,
                         metrics_uri=metrics_uri, summary=summarize(records, SUMMARY))
    store.write_text(result.model_dump_json(indent=1), train_result(settings.run_id))
    print(f"training done: step {final_step}, model at {model_uri}", flush=True)
    return result
