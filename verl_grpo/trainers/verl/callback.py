"""`StoreCheckpointCallback`, verl 0.9.1's `trainer.checkpoint_callback_class`: each saved step goes to the store.

verl calls `on_save(trainer=, global_step=, checkpoint_dir=, async_save=)` on the driver after each save. The
step dir is hard-linked into a staging dir (verl may delete the original at its next save while the upload
runs), gets the metrics so far, and is committed through `CheckpointStore` on a `BackgroundSaver`. On a multi-node
run every node's checkpoint sync uploads its step dir: it gets the metrics in place and the background commit
waits for the uploads before writing the manifest (`commit.commit_mounted`).

verl is never imported here: its callback protocol is duck-typed, so this module stays cheap to import.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_grpo.checkpoints import BackgroundSaver, CheckpointStore
from verl_grpo.contracts import CheckpointRef
from verl_grpo.errors import ConfigError, TrainingError
from verl_grpo.store_layout import step_dir_name
from verl_grpo.trainers.verl.commit import (
    after_commit,
    checkpoint_state,
    commit_mounted,
    prepare_upload,
    write_step_metrics,
)
from verl_grpo.trainers.verl.settings import ENV_CHECKPOINT_DIR, StoreSettings


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
        self.train_batch_size = prompts_per_step(config) if config is not None else None
        self.checkpoints = checkpoints or CheckpointStore(self.settings.store())
        self.saver = BackgroundSaver(self.checkpoints, on_committed=after_commit(self.checkpoints, self.settings),
                                     commit=self._commit_mounted if self.settings.mount else None)

    def on_save(self, trainer: Any = None, global_step: int = 0, checkpoint_dir: str = "", async_save: bool = False,
                **kwargs: Any) -> None:
        if async_save:
            raise ConfigError(f"verl saved step {global_step} asynchronously; it is not durable yet and cannot be "
                              "committed. Set actor_rollout_ref.actor.checkpoint.async_save=False")
        step_dir = Path(checkpoint_dir)
        if step_dir.name != step_dir_name(global_step):
            raise TrainingError(f"verl reported step {global_step} but checkpoint dir {step_dir}; expected "
                                f"{step_dir_name(global_step)}")
        if self.settings.mount:  # every node's checkpoint sync uploads its shards: commit_mounted waits
            staged = write_step_metrics(self.settings, global_step).parent
        else:
            staged = prepare_upload(self.settings, step_dir, global_step)
        state = checkpoint_state(step_dir, global_step, self.train_batch_size)
        self.saver.submit(self.settings.run_id, global_step, staged, state)
        total = getattr(trainer, "total_training_steps", None)
        if total is None and self.config is not None:
            total = _select(self.config, "trainer.total_training_steps")
        if total is not None and global_step >= int(total):
            self.saver.wait()

    def _commit_mounted(self, run_id: str, step: int, step_dir: Path, state: dict[str, Any] | None) -> CheckpointRef:
        return commit_mounted(self.checkpoints, self.settings, step, state)

    def close(self) -> CheckpointRef | None:
        """Wait for the in-flight upload (if any); re-raises its error."""
        return self.saver.close()


def prompts_per_step(config: Any) -> int | None:
    """Prompts one saved step consumed: data.train_batch_size, or on verl's fully-async trainer (whose
    data.train_batch_size is 0) one weight sync's worth: mini-batch × require_batches × trigger_parameter_sync_step."""
    batch = _select(config, "data.train_batch_size")
    if batch:
        return int(batch)
    parts = [_select(config, key) for key in ("actor_rollout_ref.actor.ppo_mini_batch_size",
                                                "async_training.require_batches",
                                                "async_training.trigger_parameter_sync_step")]
    return parts[0] * parts[1] * parts[2] if all(isinstance(p, int) and p > 0 for p in parts) else None


def _select(config: Any, dotted: str) -> Any:
    node = config
    for part in dotted.split("."):
        if node is None:
            return None
        node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
    return node


CALLBACK_CLASS = f"{StoreCheckpointCallback.__module__}.{StoreCheckpointCallback.__qualname__}"
"""What trainer.checkpoint_callback_class names (verl imports it by this path on the driver)."""
