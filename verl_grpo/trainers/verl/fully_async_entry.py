"""`python -m verl_grpo.trainers.verl.fully_async_entry OVERRIDES…`: verl's fully_async_main, with the checkpoint
callback its trainer does not call.

verl 0.9.1 calls `trainer.checkpoint_callback_class` only from its v1 trainer (main_ppo); the fully-async trainer
saves `global_step_N` (N = parameter version) and its rollouter's data.pt without it. This entry runs verl's own
`main` (its Hydra config, task runner, rollouter, message queue, weight sync) with one seam: the trainer actor is a
subclass whose `_save_checkpoint` calls verl's `build_checkpoint_callback(config).on_save(...)` after verl's save,
so each version is committed through the store protocol as main_ppo's steps are (`callback.StoreCheckpointCallback`).
"""

from __future__ import annotations

import os

import hydra
import ray
from verl.experimental.fully_async_policy import fully_async_main as verl_main
from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback

from verl_grpo.trainers.verl.fully_async import CONFIG_NAME, verl_config_dir


class StoreCommittingTrainer(verl_main.FullyAsyncTrainer.__ray_actor_class__):
    """verl's FullyAsyncTrainer, calling the configured checkpoint callback after each save (as verl's v1 trainer)."""

    def _save_checkpoint(self):
        super()._save_checkpoint()
        if getattr(self, "_checkpoint_callback", None) is None:
            self._checkpoint_callback = build_checkpoint_callback(self.config)
        step = self.current_param_version
        self._checkpoint_callback.on_save(
            trainer=self, global_step=step,
            checkpoint_dir=os.path.join(self.config.trainer.default_local_dir, f"global_step_{step}"),
            async_save=bool(self.config.actor_rollout_ref.actor.checkpoint.get("async_save", False)))


class StoreCommittingTaskRunner(verl_main.FullyAsyncTaskRunner.__ray_actor_class__):
    """verl's FullyAsyncTaskRunner creating `StoreCommittingTrainer` as its trainer actor."""

    def _create_trainer(self, config) -> None:
        # verl's method names the trainer actor class by its module global; this actor process rebinds it for the call.
        verl_class = verl_main.FullyAsyncTrainer
        verl_main.FullyAsyncTrainer = ray.remote(**verl_class._default_options)(StoreCommittingTrainer)
        try:
            super()._create_trainer(config)
        finally:
            verl_main.FullyAsyncTrainer = verl_class


@hydra.main(config_path=verl_config_dir(), config_name=CONFIG_NAME, version_base=None)
def main(config) -> None:
    """verl's fully_async_main.main with StoreCommittingTaskRunner as its task runner (its module global, rebound in
    this driver process; the runner actor imports this module by name)."""
    verl_runner = verl_main.FullyAsyncTaskRunner
    verl_main.FullyAsyncTaskRunner = ray.remote(**verl_runner._default_options)(StoreCommittingTaskRunner)
    try:
        verl_main.main.__wrapped__(config)
    finally:
        verl_main.FullyAsyncTaskRunner = verl_runner


if __name__ == "__main__":
    main()
