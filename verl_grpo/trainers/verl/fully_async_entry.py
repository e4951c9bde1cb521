"""`python -m verl_grpo.trainers.verl.fully_async_entry OVERRIDES…`: verl's fully_async_main, with the checkpoint
callback its trainer does not call.

verl 0.9.1 calls `trainer.checkpoint_callback_class` only from its v1 trainer (main_ppo); the fully-async trainer
saves `global_step_N` (N = parameter version) and its rollouter's data.pt without it. This entry runs verl's own
`main` (its Hydra config, task runner, rollouter, message queue, weight sync) with one seam: the trainer actor is a
subclass whose `_save_checkpoint` calls verl's `build_checkpoint_callback(config).on_save(...)` after verl's save,
so each version is committed through the store protocol as main_ppo's steps are (`callback.StoreCheckpointCallback`).
With async_training.replay_share > 0 a second seam, `_get_samples_from_queue`, mixes replayed groups from the replay
buffer into each batch (why there, and what verl lacks: `verl_grpo.trainers.verl.replay`).
"""

from __future__ import annotations

import os
import time

import hydra
import ray
from verl.experimental.fully_async_policy import fully_async_main as verl_main
from verl.experimental.fully_async_policy.detach_utils import assemble_batch_from_rollout_samples
from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback

from verl_grpo.trainers.verl.fully_async import CONFIG_NAME, verl_config_dir
from verl_grpo.trainers.verl.replay import ReplayMixer, ReplaySettings, batch_metrics, replayed_sample


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

    def _replay_mixer(self) -> ReplayMixer | None:
        """The replay buffer's mixer when async_training.replay_share > 0 (client made on first use, in this actor)."""
        if not hasattr(self, "_replay"):
            settings = ReplaySettings.from_async_training(self.config.async_training)
            self._replay = None
            if settings.enabled:
                from verl_grpo.services.client import AsyncServiceClient, service_url

                self._replay = ReplayMixer(AsyncServiceClient(service_url("replay")), settings)
        return self._replay

    async def _get_samples_from_queue(self):
        """verl's batch, with round(required_samples × replay_share) groups drawn from the replay buffer and the rest
        fresh from verl's queue (verl's own method when replay is off)."""
        mixer = self._replay_mixer()
        if mixer is None:
            return await super()._get_samples_from_queue()
        start = time.time()
        drawn = await mixer.draw(self.required_samples, self.current_param_version)
        pending = 0  # as verl counts it: fresh samples not yet in the queue, read only by its dynamic scheduling
        if self.dynamic_schedule_enabled:
            pending = max(0, self.required_samples - len(drawn) - await self.message_queue_client.get_queue_size())
        raw_fresh = []
        while len(raw_fresh) + len(drawn) < self.required_samples:
            raw, _ = await self.message_queue_client.get_sample()
            if raw is None:  # verl's termination signal: the rollouter has generated its last group
                return None, None
            raw_fresh.append(raw)
        wait = time.time() - start
        fresh = [ray.cloudpickle.loads(raw) for raw in raw_fresh]
        replayed = [replayed_sample(item) for item in drawn]
        metrics = batch_metrics(len(fresh), replayed, self.current_param_version)
        await mixer.record(list(zip(raw_fresh, fresh)), drawn)  # before assembly, which edits the samples
        balance = self._balance_batch if self.config.trainer.balance_batch else None
        batch = assemble_batch_from_rollout_samples([*fresh, *replayed], self.tokenizer, self.config, balance)
        batch.meta_info.update(metrics)
        batch.meta_info["fully_async/total_wait_time"] = wait
        self._step_wait_times.append(wait)
        self._step_wait_samples.append(pending)
        return 0, batch


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
