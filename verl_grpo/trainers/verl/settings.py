"""Where a verl run's checkpoints live: the task env that names them, and verl's own files in default_local_dir.

The SkyPilot task sets the non-secret env vars of `checkpoint_env`; the restore entry, the checkpoint callback
and the finalize entry read them back with `StoreSettings.from_env` (credentials come from the environment).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from verl_grpo.errors import ConfigError
from verl_grpo.store import Store
from verl_grpo.store_layout import STEP_PREFIX
from verl_grpo.trainers.atomic_files import write_text_atomic
from verl_grpo.trainers.local_checkpoints import LocalCheckpoints
from verl_grpo.trainers.verl.samples import SamplesPlan, merged_samples, rollout_dir

ENV_STORE_URI = "VERL_GRPO_STORE_URI"
ENV_STORE_ENDPOINT = "VERL_GRPO_STORE_ENDPOINT"
ENV_RUN_ID = "VERL_GRPO_RUN_ID"
ENV_CHECKPOINT_DIR = "VERL_GRPO_CHECKPOINT_DIR"
"""Must equal verl's trainer.default_local_dir (verl_overrides sets both from the same value)."""
ENV_KEEP_LAST = "VERL_GRPO_KEEP_LAST"
ENV_CHECKPOINT_MOUNT = "VERL_GRPO_CHECKPOINT_MOUNT"
"""Set on multi-node runs: the store URI (`runs/{run_id}/checkpoints`) that every node's checkpoint sync uploads the
node's checkpoint dir to (`checkpoint_sync`), so every rank's shards of a step land in one place; commits wait for
those uploads and write the manifest in place (`commit.commit_mounted`)."""
CHECKPOINT_SYNC_LOG = "checkpoint-sync.log"
"""The checkpoint sync's output, in the node's metrics dir (it runs detached from the task's log)."""
ENV_VERL_METRICS = "VERL_FILE_LOGGER_PATH"
"""verl's own `file` logger writes one `{"step": N, "data": {...}}` line per step here (truncated at each start)."""

TRACKER_FILE = "latest_checkpointed_iteration.txt"
"""verl's resume tracker in default_local_dir
(verl.utils.checkpoint.checkpoint_manager.get_checkpoint_tracker_filename)."""
STAGING_DIR = ".staging"
"""Under default_local_dir: hard-linked copies of step dirs while they upload."""


@dataclass(frozen=True)
class StoreSettings:
    """Where a verl run's checkpoints go, read from the env vars the task sets."""

    uri: str
    endpoint_url: str | None
    run_id: str
    checkpoint_dir: Path
    keep_last: int = 2
    mount: str | None = None
    """Store URI mounted at checkpoint_dir (multi-node runs), or None: checkpoint_dir is this node's own disk."""
    samples: SamplesPlan | None = None
    """Which rollouts of verl's dumps the run keeps (trainer.log_samples_every); None keeps none."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "StoreSettings":
        env = os.environ if env is None else env
        missing = [k for k in (ENV_STORE_URI, ENV_RUN_ID, ENV_CHECKPOINT_DIR) if not env.get(k)]
        if missing:
            raise ConfigError(f"{', '.join(missing)} not set; the verl task sets them from the run config "
                              "(verl_grpo.trainers.verl.settings.checkpoint_env) — launch through verl-grpo")
        try:
            keep = int(env.get(ENV_KEEP_LAST) or 2)
        except ValueError:
            value = env[ENV_KEEP_LAST]
            raise ConfigError(f"{ENV_KEEP_LAST}={value!r} is not an integer (storage.keep_last)") from None
        return cls(uri=env[ENV_STORE_URI], endpoint_url=env.get(ENV_STORE_ENDPOINT) or None, run_id=env[ENV_RUN_ID],
                   checkpoint_dir=Path(env[ENV_CHECKPOINT_DIR]), keep_last=max(keep, 1),
                   mount=env.get(ENV_CHECKPOINT_MOUNT) or None, samples=SamplesPlan.from_env(env))

    @property
    def metrics_dir(self) -> Path:
        """This node's metrics files: beside a mounted checkpoint dir (they are not the store's), else inside it."""
        return metrics_dir(str(self.checkpoint_dir), self.mount is not None)

    @property
    def history_path(self) -> Path:
        """Metrics of the steps before this process started (from the restored checkpoint)."""
        return self.metrics_dir / "history.jsonl"

    @property
    def samples_history_path(self) -> Path:
        """Samples of the steps before this process started (from the restored checkpoint)."""
        return self.metrics_dir / "samples-history.jsonl"

    @property
    def rollout_dir(self) -> Path:
        """verl's trainer.rollout_data_dir (verl.samples)."""
        return rollout_dir(self.checkpoint_dir)

    def merged_samples(self, upto_step: int | None = None) -> list[dict]:
        """The run's samples.jsonl records so far: the restored history, then this process's dumps."""
        return merged_samples(self.samples_history_path, self.rollout_dir, self.samples, upto_step)

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


def metrics_dir(checkpoint_dir: str, mounted: bool) -> Path:
    return Path(f"{checkpoint_dir}-metrics") if mounted else Path(checkpoint_dir) / "metrics"


def checkpoint_env(uri: str, endpoint_url: str | None, run_id: str, checkpoint_dir: str,
                   keep_last: int, mount: str | None = None) -> dict[str, str]:
    """The non-secret env of a verl task that the callback, restore and finalize entries read."""
    env = {ENV_STORE_URI: uri, ENV_RUN_ID: run_id, ENV_CHECKPOINT_DIR: checkpoint_dir, ENV_KEEP_LAST: str(keep_last),
           ENV_VERL_METRICS: str(metrics_dir(checkpoint_dir, mount is not None) / "verl.jsonl")}
    if endpoint_url:
        env[ENV_STORE_ENDPOINT] = endpoint_url
    if mount:
        env[ENV_CHECKPOINT_MOUNT] = mount
    return env


def write_tracker(checkpoint_dir: Path, step: int) -> Path:
    """verl's `latest_checkpointed_iteration.txt`, written atomically."""
    return write_text_atomic(Path(checkpoint_dir) / TRACKER_FILE, str(int(step)))


def read_tracker(checkpoint_dir: Path) -> int | None:
    tracker = Path(checkpoint_dir) / TRACKER_FILE
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    return int(text) if text.isdigit() else None
