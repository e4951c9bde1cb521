"""Loop backend: RunConfig → the loop worker's spec and command (`plan`), validated offline.

The worker (`python -m verl_grpo.trainers.loop.worker SPEC`) runs the asynchronous RL loop of the public
SkyPilot job-group examples on this machine: rollout servers behind a router (started by the worker), the
data-server, reward-server and replay buffer (started by the provider as the run's services, which RunConfig
enables for trainer.backend=loop), and a plain-torch GRPO update that pushes its weights to every rollout server.
"""

from __future__ import annotations

from verl_grpo.config import RunConfig
from verl_grpo.config.placement import placement
from verl_grpo.contracts import Cluster, DatasetVersion, TrainSpec
from verl_grpo.errors import ConfigError
from verl_grpo.store import Store
from verl_grpo.trainers.loop.batch import replay_count
from verl_grpo.trainers.protocol import TrainProgress
from verl_grpo.trainers.worker import progress
from verl_grpo.trainers.worker.batch_layout import batch_layout
from verl_grpo.trainers.worker.spec import worker_train_spec

REQUIRED_SERVICES = ("data", "reward", "replay")
"""The services the loop reads: prompts (data), rewards (reward) and the groups it trains again (replay)."""


def check_loop(cfg: RunConfig) -> None:
    """ConfigError naming the field for settings the loop cannot run."""
    alg, at = cfg.algorithm, cfg.async_training
    if cfg.trainer.backend != "loop":
        raise ConfigError(f"trainer.backend is {cfg.trainer.backend!r}; the loop backend cannot check it")
    if not placement(cfg).on_this_machine:
        raise ConfigError("trainer.backend=loop runs its rollout servers on this machine (infra.provider=local); on "
                          "SkyPilot use trainer.backend=verl with skypilot.shape=rollout_group")
    missing = [s for s in REQUIRED_SERVICES if s not in cfg.services.enabled]
    if missing:
        raise ConfigError(f"trainer.backend=loop needs services.enabled to include {', '.join(missing)}; add them "
                          f"(e.g. -o 'services.enabled=[{', '.join(REQUIRED_SERVICES)}]')")
    if alg.kl_coef > 0:
        raise ConfigError(f"algorithm.kl_coef={alg.kl_coef}: trainer.backend=loop keeps no reference model; set "
                          "algorithm.kl_coef=0 or use trainer.backend=trl")
    batch_layout(cfg)  # ConfigError when trainer.micro_batch_size does not divide a step's completions
    if at.replay_share > 0 and replay_count(alg.train_batch_size, at.replay_share) == 0:
        raise ConfigError(f"async_training.replay_share={at.replay_share} of algorithm.train_batch_size="
                          f"{alg.train_batch_size} rounds to no replayed group per step (and one group stays fresh); "
                          "raise the share or the batch size")


class LoopTrainer:
    """Trainer backend `loop`: the rollout → reward → replay → update loop as separate processes on this machine."""

    name = "loop"

    def check(self, cfg: RunConfig) -> str:
        check_loop(cfg)
        alg, at = cfg.algorithm, cfg.async_training
        replayed = replay_count(alg.train_batch_size, at.replay_share)
        return (f"loop: {at.rollout_servers} rollout server(s) behind a router; {alg.train_batch_size} prompt groups "
                f"x {alg.rollouts} rollouts per step ({replayed} from the replay buffer, each at most "
                f"{1 + at.max_replays} times), weights pushed every {at.trigger_parameter_sync_step} step(s), "
                f"staleness <= {at.max_staleness} version(s), checkpoint every {alg.save_freq}")

    def plan(self, cfg: RunConfig, dataset: DatasetVersion, store: Store, run_id: str, cluster: Cluster) -> TrainSpec:
        """Validate offline, write `<workdir>/train_spec.json`, return the worker command."""
        self.check(cfg)
        if not cluster.on_this_machine:
            raise ConfigError("trainer.backend=loop runs on this machine only (infra.provider=local)")
        return worker_train_spec(self.name, "verl_grpo.trainers.loop.worker", cfg, dataset, store, run_id, cluster)

    def parse_progress(self, line: str, total_steps: int) -> TrainProgress | None:
        """The worker's `step k/N reward=… loss=… version=… replay=… stale=…` lines (the TRL line format)."""
        return progress.parse_progress(line, total_steps)
