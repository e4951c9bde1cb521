"""One attempt of a loop run: resume from the store, start the rollout fleet, train, publish.

1. Restores the newest committed checkpoint (model, optimizer, loop state, metrics) and moves the data-server's
   train cursor back to the checkpoint's position (PUT /cursor): prompts a killed attempt fetched but never
   trained are served again, none twice.
2. Starts the rollout servers and their router on the restored weights at the restored policy version.
3. Per step: replayed groups from the replay buffer (priority, within the staleness bound, each prompt trained at
   most 1 + max_replays times; used-up and stale items are retired), fresh groups from the producer thread
   (generated and scored while the trainer updates), one AdamW step, the step's fresh groups added to the replay
   buffer; every trigger_parameter_sync_step steps the weights are saved and pushed to every rollout server.
4. Commits a checkpoint every save_freq steps; at the end publishes the final model, metrics and TrainResult.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.contracts import CheckpointRef, TrainResult
from verl_grpo.errors import DataError, InfraError
from verl_grpo.rewards.user_reward import FailureGuard, UserReward, step_metrics
from verl_grpo.services import DEFAULT_TOKEN_ENV, token_file_env
from verl_grpo.services.client import ServiceClient, service_url
from verl_grpo.store_layout import STEP_PREFIX
from verl_grpo.trainers.atomic_files import write_json_atomic
from verl_grpo.trainers.local_checkpoints import LocalCheckpoints, restore_latest
from verl_grpo.trainers.loop.batch import Group, LoopState, choose_replays, is_stale, replay_count, staleness
from verl_grpo.trainers.loop.objective import Surrogate, group_advantages
from verl_grpo.trainers.loop.publish import FINAL_MODEL_DIR, publish
from verl_grpo.trainers.loop.rollouts import RolloutProducer
from verl_grpo.trainers.loop.update import PolicyUpdate, UpdateStats
from verl_grpo.trainers.signal import CLIPPED_RATIO, MEAN_LENGTH, TIED_GROUP_SHARE, NoSignalWatch
from verl_grpo.trainers.worker.errors import check_workdir
from verl_grpo.trainers.worker.metrics import WorkerLogs
from verl_grpo.trainers.worker.progress import progress_line
from verl_grpo.trainers.worker.samples import Sample, first_groups, sampled_step
from verl_grpo.trainers.worker.spec import WorkerSpec

STATE_FILE = "loop_state.json"
OPTIMIZER_FILE = "optimizer.pt"
MODEL_SUBDIR = "model"
WEIGHTS_DIR = "weights"
SAMPLE_OVERDRAW = 4
"""Replay candidates drawn per wanted group, so groups of prompts this attempt has not trained (a killed attempt's)
can be skipped in one request."""


def say(line: str) -> None:
    print(line, flush=True)


@dataclass
class Services:
    data: ServiceClient
    reward: ServiceClient
    replay: ServiceClient

    @classmethod
    def from_env(cls) -> Services:
        return cls(ServiceClient(service_url("data")), ServiceClient(service_url("reward")),
                   ServiceClient(service_url("replay")))

    def close(self) -> None:
        for client in (self.data, self.reward, self.replay):
            client.close()


@dataclass
class StepTimes:
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, since: float) -> float:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - since
        return now


def run(spec: WorkerSpec) -> TrainResult:
    cfg = spec.cfg
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    torch.manual_seed(cfg.algorithm.seed)
    check_workdir(spec.workdir)
    checkpoints = CheckpointStore.from_config(spec.store, cfg.storage)
    logs = WorkerLogs(spec.workdir)
    local = LocalCheckpoints(spec.workdir / "checkpoints", STEP_PREFIX)
    restored = restore_latest(checkpoints, spec.run_id, local)
    total_steps = spec.planned_steps
    from verl_grpo.models import load_model_and_tokenizer, resolve_model

    if restored is None:
        logs.reset()
        state, optimizer_state, last_ref = LoopState(), None, None
        start_model, warm_summary = _warm_started(spec, _base_model(spec, resolve_model))
    else:
        last_ref, step_dir = restored
        logs.reset(step_dir, upto_step=last_ref.step)
        state = LoopState.from_json(json.loads((step_dir / STATE_FILE).read_text()))
        start_model = step_dir / MODEL_SUBDIR
        optimizer_state = torch.load(step_dir / OPTIMIZER_FILE, weights_only=True)
        warm_summary = _committed_warm_start(spec)
        say(f"resuming run {spec.run_id} from checkpoint step {last_ref.step} ({last_ref.uri}): policy version "
            f"{state.policy_version}, data cursor {state.cursor[0]}:{state.cursor[1]}")
    model, tokenizer = load_model_and_tokenizer(start_model, cfg.model.dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.algorithm.lr)
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    final_dir = spec.workdir / FINAL_MODEL_DIR
    shutil.rmtree(final_dir, ignore_errors=True)
    servers: dict[str, int] = {}
    if state.step < total_steps:
        loop = Loop(spec, model, tokenizer, optimizer, state, logs, checkpoints)
        last_ref = loop.run(start_model) or last_ref
        servers = loop.server_versions
    else:
        say(f"run {spec.run_id} already reached step {state.step}; publishing that checkpoint")
    model.save_pretrained(final_dir, safe_serialization=True)
    tokenizer.save_pretrained(final_dir)
    return publish(spec, checkpoints, logs, state, last_ref, servers, warm_summary)


def _base_model(spec: WorkerSpec, resolve_model) -> Path | str:
    return spec.model_path if spec.model_path and Path(spec.model_path).is_dir() else resolve_model(spec.model_name)


def _warm_started(spec: WorkerSpec, base_model: Path | str) -> tuple[Path | str, dict[str, float]]:
    """The model the loop starts from: the warm start's (the same SFT phase, store commit and reuse as the trl
    backend's) when warm_start is enabled, else the base model."""
    if not spec.cfg.warm_start.enabled:
        return base_model, {}
    from verl_grpo.trainers.trl.warm_start import warm_started_model
    from verl_grpo.trainers.worker.termination import Termination

    warm_model, summary = warm_started_model(spec, base_model, Termination())
    return warm_model or base_model, summary


def _committed_warm_start(spec: WorkerSpec) -> dict[str, float]:
    """A resumed run's warm-start figures (its weights come from the checkpoint)."""
    if not spec.cfg.warm_start.enabled:
        return {}
    from verl_grpo.trainers.trl.warm_start import committed_result, summary_of

    result = committed_result(spec)
    return summary_of(result) if result else {}


@dataclass
class StepBatch:
    """The groups one step trained on (fresh from the rollout fleet, replayed from the buffer) and what it dropped."""

    replayed: list[Group]
    dropped_replay: int
    """Replay items the buffer handed back too stale to train."""
    fresh: list[Group] = field(default_factory=list)
    dropped: list[Group] = field(default_factory=list)
    """Fresh groups too stale to train by the time the step took them."""

    @property
    def trained(self) -> list[Group]:
        return [*self.fresh, *self.replayed]

    @property
    def dropped_stale(self) -> int:
        return self.dropped_replay + len(self.dropped)


class Loop:
    """The training steps of one attempt, with the rollout fleet and the services."""

    def __init__(self, spec: WorkerSpec, model, tokenizer, optimizer, state: LoopState, logs: WorkerLogs,
                 checkpoints: CheckpointStore):
        cfg = spec.cfg
        self.spec, self.cfg, self.model, self.tokenizer = spec, cfg, model, tokenizer
        self.optimizer, self.state, self.logs, self.checkpoints = optimizer, state, logs, checkpoints
        self.total_steps = spec.planned_steps
        alg = cfg.algorithm
        self.updater = PolicyUpdate(model, optimizer, surrogate=Surrogate.of(alg), temperature=alg.temperature,
                                    micro_batch_size=cfg.trainer.micro_batch_size,
                                    pad_id=tokenizer.pad_token_id or 0)
        self.want_replay = replay_count(alg.train_batch_size, cfg.async_training.replay_share)
        self.max_uses = 1 + cfg.async_training.max_replays
        self.no_signal = NoSignalWatch.from_config(cfg)
        user = UserReward.of(cfg)  # the reward-server runs the user's function; a first step it failed on stops here
        self.reward_guard = FailureGuard(user, alg.train_batch_size * alg.rollouts) if user else None
        self.server_versions: dict[str, int] = {}
        self.pending_retire: set[int] = set()
        """Replay items to retire once the checkpoint holding the uses that retire them is committed (a killed
        attempt's retirements would otherwise outlive its rolled-back updates)."""

    def render(self, messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def run(self, start_model: Path | str) -> CheckpointRef | None:
        from verl_grpo.services.rollout_client import RouterClient
        from verl_grpo.services.rollout_fleet import start_rollout_fleet

        at = self.cfg.async_training
        services = self.services = Services.from_env()
        services.data.request("PUT", "/cursor", json={"split": "train", "epoch": self.state.cursor[0],
                                                      "position": self.state.cursor[1]})
        token_file = os.environ.get(token_file_env(self.cfg.services.token_env)) or os.environ.get(
            token_file_env(DEFAULT_TOKEN_ENV))
        t0 = time.perf_counter()
        fleet = start_rollout_fleet(start_model, at.rollout_servers, self.spec.workdir,
                                    threads_per_server=1, token_file=token_file,
                                    policy_version=self.state.policy_version,
                                    startup_timeout_s=self.cfg.services.startup_timeout_s)
        say(f"rollout fleet up in {time.perf_counter() - t0:.1f}s: router {fleet.router_url}, "
            f"{len(fleet.worker_urls)} server(s) at policy version {self.state.policy_version}")
        router = RouterClient(fleet.router_url)
        self.workers = router.workers()
        self.server_versions = {url: self.state.policy_version for url in self.workers}
        producer = RolloutProducer(self.cfg, services.data, router, services.reward, self.render,
                                   self.cfg.algorithm.train_batch_size - self.want_replay).start()
        last_ref = None
        try:
            while self.state.step < self.total_steps:
                last_ref = self.step(producer, services) or last_ref
        finally:
            producer.stop()
            router.close()
            fleet.stop()
            services.close()
        return last_ref

    def step(self, producer: RolloutProducer, services: Services) -> CheckpointRef | None:
        alg, at, state = self.cfg.algorithm, self.cfg.async_training, self.state
        current = state.policy_version
        times = StepTimes()
        t = time.perf_counter()
        replayed, retire, dropped_replay = self._replays(services, current)
        t = times.add("replay", t)
        taken: list[Group] = []
        batch = StepBatch(replayed=replayed, dropped_replay=dropped_replay)
        generate_s = reward_s = 0.0
        while len(replayed) + len(batch.fresh) < alg.train_batch_size:
            produced = producer.take()
            generate_s, reward_s = max(generate_s, produced.generate_s), max(reward_s, produced.reward_s)
            group = produced.group
            taken.append(group)
            stale = is_stale(group.policy_version, current, at.max_staleness)
            (batch.dropped if stale else batch.fresh).append(group)
        t = times.add("rollout_wait", t)
        if self.reward_guard is not None:
            self.reward_guard.check([r.components for g in batch.fresh for r in g.rollouts])
        groups = batch.trained
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = warmup_lr(alg.lr, alg.warmup_steps, state.step + 1)
        stats = self.updater.step(groups)
        t = times.add("update", t)
        state.record(groups, current)
        state.advance(taken)  # past every fresh prompt taken, dropped ones included, in the data-server's order
        state.dropped_stale_total += batch.dropped_stale
        state.step += 1
        state.updates_since_push += 1
        services.replay.post("/add", {"items": [{"data": g.payload(), "reward": g.mean_reward,
                                                  "policy_version": g.policy_version} for g in batch.fresh]})
        self.pending_retire.update(retire)
        t = times.add("replay", t)
        if state.updates_since_push >= at.trigger_parameter_sync_step:
            self._push_weights()
            t = times.add("weight_push", t)
        times.seconds["generate"], times.seconds["reward"] = generate_s, reward_s
        record = self._record(batch, current, stats, times)
        self.logs.metrics.append(record)
        if sampled_step(state.step, self.cfg.trainer.log_samples_every):
            self.logs.samples.append({"step": state.step, "samples": [s.record() for s in self._samples(groups)]})
        say(progress_line(record, self.total_steps) + f" version={state.policy_version} "
            f"replay={record['replay/share']:.3g} stale={record['staleness/max']} dropped={record['dropped_stale']}")
        if self.no_signal is not None and (warning := self.no_signal.observe(record)):
            say(warning)
        if state.step % alg.save_freq == 0 or state.step == self.total_steps:
            return self._checkpoint()
        return None

    def _replays(self, services: Services, current: int) -> tuple[list[Group], list[int], int]:
        if self.want_replay == 0:
            return [], [], 0
        size, candidates = self.want_replay * SAMPLE_OVERDRAW, []
        while True:
            try:
                # The buffer draws among items within the staleness bound that are not waiting to be retired, nor
                # drawn already by this step.
                drawn = services.replay.post("/sample", {
                    "size": size, "unique": True, "min_policy_version": current - self.cfg.async_training.max_staleness,
                    "exclude_ids": sorted(self.pending_retire | {g.replay_id for g in candidates})})["items"]
            except DataError as e:
                if "empty" in str(e):  # nothing trained yet: the step takes fresh groups only
                    return [], [], 0
                raise
            candidates += [Group.from_payload(item["data"], item["id"]) for item in drawn]
            # A group of a prompt this run has not trained fresh (stored by a killed attempt whose update was rolled
            # back) waits until that prompt is trained fresh again, so no prompt is used more than max_uses times.
            trained = [g for g in candidates if g.prompt_id in self.state.uses]
            choice = choose_replays(trained, self.want_replay, self.state.uses, current,
                                    self.cfg.async_training.max_staleness, self.max_uses)
            # Drawn again while the draws held too few usable groups and the buffer has items not drawn yet: what
            # a step replays depends on the buffer, never on the luck of one draw.
            if len(choice.chosen) >= self.want_replay or len(drawn) < size:
                return choice.chosen, choice.retire, choice.dropped_stale

    def _push_weights(self) -> None:
        from verl_grpo.services.rollout_client import RolloutClient

        version = self.state.policy_version + 1
        root = self.spec.workdir / WEIGHTS_DIR
        target = root / f"v{version}"
        shutil.rmtree(target, ignore_errors=True)
        self.model.save_pretrained(target, safe_serialization=True)
        self.tokenizer.save_pretrained(target)

        def push(url: str) -> tuple[str, int]:
            client = RolloutClient(url)
            try:
                return url, int(client.update_weights(str(target), version)["policy_version"])
            finally:
                client.close()

        with ThreadPoolExecutor(max_workers=len(self.workers)) as pool:
            self.server_versions = dict(pool.map(push, self.workers))
        if set(self.server_versions.values()) != {version}:
            raise InfraError(f"weight push of policy version {version} answered {self.server_versions}")
        self.state.policy_version = version
        self.state.updates_since_push = 0
        for old in root.glob("v*"):
            if old != target:
                shutil.rmtree(old, ignore_errors=True)

    def _record(self, batch: StepBatch, current: int, stats: UpdateStats, times: StepTimes) -> dict[str, Any]:
        groups, fresh, replayed, dropped = batch.trained, batch.fresh, batch.replayed, batch.dropped
        rewards = torch.tensor([g.rewards for g in groups], dtype=torch.float32)
        fresh_rewards = [r for g in fresh for r in g.rewards]
        lengths = [len(r.token_ids) for g in groups for r in g.rollouts]
        truncated = [r.finish_reason == "length" for g in groups for r in g.rollouts]
        tied = float((rewards.std(dim=1) == 0).float().mean()) if rewards.shape[1] > 1 else 1.0
        lags = [staleness(g.policy_version, current) for g in groups]
        record: dict[str, Any] = {
            "step": self.state.step,
            "reward": sum(fresh_rewards) / len(fresh_rewards) if fresh_rewards else float(rewards.mean()),
            "reward/trained": float(rewards.mean()),
            "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
            TIED_GROUP_SHARE: tied,
            MEAN_LENGTH: sum(lengths) / max(len(lengths), 1),
            CLIPPED_RATIO: sum(truncated) / max(len(truncated), 1),
            "loss": stats.loss,
            "clip_fraction": stats.clip_fraction,
            "ratio_mean": stats.ratio_mean,
            "ratio_max": stats.ratio_max,
            "grad_norm": stats.grad_norm,
            "policy_version": self.state.policy_version,
            "trained_on_version": current,
            "replay/groups": len(replayed),
            "fresh/groups": len(fresh),
            "replay/share": len(replayed) / max(len(groups), 1),
            "staleness/max": max(lags, default=0),
            "staleness/mean": sum(lags) / max(len(lags), 1),
            "dropped_stale": batch.dropped_stale,
            "dropped_stale_total": self.state.dropped_stale_total,
            "fresh_prompt_ids": [g.prompt_id for g in fresh],
            "replayed_prompt_ids": [g.prompt_id for g in replayed],
            "dropped_prompt_ids": [g.prompt_id for g in dropped],
        }
        record.update(step_metrics([r.components for g in fresh for r in g.rollouts],
                                   count_failures=self.reward_guard is not None))
        for i, url in enumerate(self.workers):
            record[f"policy_version/server_{i}"] = self.server_versions.get(url)
        for name, seconds in times.seconds.items():
            record[f"time/{name}"] = seconds
        record["step_time"] = sum(v for k, v in times.seconds.items() if k not in ("generate", "reward"))
        return record

    def _samples(self, groups: Sequence[Group]) -> list[Sample]:
        """The first trainer.samples_per_step rollouts of the step, whole groups first, decoded."""
        k, picked = self.cfg.trainer.samples_per_step, []
        for group in groups:
            prompt = self.tokenizer.decode(group.prompt_token_ids, skip_special_tokens=True)
            advantages = group_advantages(torch.tensor([group.rewards], dtype=torch.float32))[0].tolist()
            picked.append([Sample(prompt, self.tokenizer.decode(r.token_ids, skip_special_tokens=True), r.reward,
                                  advantage, r.finish_reason == "length", dict(r.components), group.policy_version,
                                  group.source) for r, advantage in zip(group.rollouts, advantages, strict=True)])
            if sum(map(len, picked)) >= k:
                break
        return first_groups(picked, k)

    def _checkpoint(self) -> CheckpointRef:
        state = self.state
        step_dir = LocalCheckpoints(self.spec.workdir / "checkpoints", STEP_PREFIX).step_dir(state.step)
        shutil.rmtree(step_dir, ignore_errors=True)
        self.model.save_pretrained(step_dir / MODEL_SUBDIR, safe_serialization=True)
        self.tokenizer.save_pretrained(step_dir / MODEL_SUBDIR)
        torch.save(self.optimizer.state_dict(), step_dir / OPTIMIZER_FILE)
        write_json_atomic(step_dir / STATE_FILE, state.to_json())
        self.logs.copy_into(step_dir)
        ref = self.checkpoints.save(self.spec.run_id, state.step, step_dir,
                                    {"policy_version": state.policy_version, "cursor": list(state.cursor)})
        say(f"checkpoint step {state.step} committed ({ref.uri})")
        if self.pending_retire:
            self.services.replay.post("/retire", {"ids": sorted(self.pending_retire)})
            self.pending_retire.clear()
        self.checkpoints.prune(self.spec.run_id, self.cfg.storage.keep_last)
        for old in LocalCheckpoints(self.spec.workdir / "checkpoints", STEP_PREFIX).steps():
            if old != state.step:
                shutil.rmtree(step_dir.parent / f"{STEP_PREFIX}{old}", ignore_errors=True)
        return ref


def warmup_lr(lr: float, warmup_steps: int, step: int) -> float:
    """algorithm.lr after a linear warm-up over the first warmup_steps steps (step counts from 1: the first step
    trains at lr / warmup_steps), then constant."""
    return lr if warmup_steps <= 0 else lr * min(1.0, step / warmup_steps)

