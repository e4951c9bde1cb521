"""The trainer loop of the CPU stand-in, mirroring verl 0.9.1's v1 `PPOTrainer` (verl/trainer/ppo/v1/trainer_base.py).

`fit` (resume, step numbering from 1, save at save_freq and the last step, log after the save),
`_save_checkpoint` (actor via FSDPCheckpointManager, then data.pt, then the tracker, then
`checkpoint_callback.on_save(trainer=self, ...)`) and `_load_checkpoint` (resume_mode auto/disable/resume_path)
follow verl's order and file names; the callback is built by verl's `build_checkpoint_callback` and the
loggers are verl's `Tracking`.
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

import numpy as np
import torch

from verl_grpo_rehearsal import ENV_DIR, ENV_FAIL_AT, ENV_PREEMPT_PENDING, PREEMPT_HOLD_S, uses_agent_loop
from verl_grpo_rehearsal.standin_actor import StandinActor
from verl_grpo_rehearsal.standin_data import StandinData

HEADLINE = ("critic/score/mean", "critic/rewards/mean", "actor/pg_loss", "actor/lr", "timing_s/step")
"""First keys of each step's metrics: verl's console line starts `step:k - critic/score/mean:… - …`."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def injected_failure(step: int) -> None:
    """VERL_GRPO_REHEARSAL_FAIL_AT=N: raise at step N, once per rehearsal job (marker in the store or dir)."""
    raw = os.environ.get(ENV_FAIL_AT, "").strip()
    if not raw.lstrip("-").isdigit() or int(raw) != step:
        return
    marker = f"rehearsal-failed-at-{step}"
    from verl_grpo.trainers.verl.settings import ENV_RUN_ID, ENV_STORE_ENDPOINT, ENV_STORE_URI

    if os.environ.get(ENV_STORE_URI) and os.environ.get(ENV_RUN_ID):
        from verl_grpo.store import Store

        store = Store(os.environ[ENV_STORE_URI], os.environ.get(ENV_STORE_ENDPOINT) or None)
        rel = f"runs/{os.environ[ENV_RUN_ID]}/{marker}"
        if store.exists(rel):
            return
        store.write_text(f"injected failure at step {step}\n", rel)
    elif os.environ.get(ENV_DIR):
        path = os.path.join(os.environ[ENV_DIR], marker)
        if os.path.exists(path):
            return
        os.makedirs(os.environ[ENV_DIR], exist_ok=True)
        with open(path, "w") as f:
            f.write(f"injected failure at step {step}\n")
    print(f"rehearsal: injected user-code failure at step {step}", flush=True)
    raise RuntimeError(f"rehearsal: injected user-code failure at step {step} ({ENV_FAIL_AT}={raw})")


def hold_for_preemption(step: int) -> None:
    """After a step with a preemption still to come, wait to be killed (see ENV_PREEMPT_PENDING); bounded."""
    pending = {int(s) for s in os.environ.get(ENV_PREEMPT_PENDING, "").split(",") if s.strip().isdigit()}
    if step not in pending:
        return
    print(f"rehearsal: step {step} carries an injected preemption; holding until the controller kills this node",
          flush=True)
    time.sleep(PREEMPT_HOLD_S)
    print(f"rehearsal: no preemption came within {PREEMPT_HOLD_S:.0f} s of step {step}; going on", flush=True)


def write_generations(inputs: list[str], outputs: list[str], gts: list[Any], scores: list[float],
                      reward_extra_infos_dict: dict[str, list], dump_path: str, global_steps: int) -> None:
    """`RayPPOTrainer._write_generations` of verl 0.9.1, line for line (importing verl's ray_trainer costs a node
    process ~40 s of CPU here; tests/unit/test_samples.py checks these fields against verl's source)."""
    os.makedirs(dump_path, exist_ok=True)
    n = len(inputs)
    base_data = {"input": inputs, "output": outputs, "gts": gts, "score": scores, "step": [global_steps] * n}
    for k, v in reward_extra_infos_dict.items():
        if len(v) == n:
            base_data[k] = v
    with open(os.path.join(dump_path, f"{global_steps}.jsonl"), "w") as f:
        for i in range(n):
            f.write(json.dumps({k: v[i] for k, v in base_data.items()}, ensure_ascii=False, default=str) + "\n")


class StandinTrainer:
    """What verl's driver holds: config, global_steps, total_training_steps, train_dataloader, callback, logger."""

    def __init__(self, config: Any, loggers: list[str]):
        from omegaconf import OmegaConf, open_dict
        from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback
        from verl.utils.tracking import Tracking

        self.config = config
        seed_everything(int(config.data.get("seed") or 0))
        self.checkpoint_callback = build_checkpoint_callback(config)
        self.data = StandinData(config)
        self.train_dataloader = self.data.train_dataloader
        self.steps_per_epoch = self.data.steps_per_epoch
        total = self.steps_per_epoch * int(config.trainer.total_epochs)
        if config.trainer.total_training_steps is not None:
            total = int(config.trainer.total_training_steps)
        self.total_training_steps = total
        with open_dict(config):
            config.actor_rollout_ref.actor.optim.total_training_steps = total
        self.actor = StandinActor(config, self.data.tokenizer)
        self.agent_loop = None
        if uses_agent_loop(config):
            from verl_grpo_rehearsal.standin_agent_loop import AgentLoopRollouts

            self.agent_loop = AgentLoopRollouts(config, self.actor.model, self.data.tokenizer, self.data.loop)
            rollout_cfg = config.actor_rollout_ref.rollout
            print(f"rehearsal: rollouts in verl's AgentLoopWorker ({rollout_cfg.agent.default_agent_loop} loop by "
                  f"default), tools {','.join(self.agent_loop.tool_names) or 'none'} loaded from "
                  f"{rollout_cfg.multi_turn.tool_config_path}; its LLM server stood in by HF generate", flush=True)
        self.global_steps = 0
        self.logger = Tracking(project_name=config.trainer.project_name,
                               experiment_name=config.trainer.experiment_name, default_backend=loggers,
                               config=OmegaConf.to_container(config, resolve=True))

    # ---- verl v1 PPOTrainer.fit ----------------------------------------------------------------------------

    def fit(self) -> None:
        self._load_checkpoint()
        current_epoch = self.global_steps // self.steps_per_epoch
        self.global_steps += 1
        trainer_cfg = self.config.trainer
        while current_epoch < trainer_cfg.total_epochs and self.global_steps <= self.total_training_steps:
            is_last_step = self.global_steps >= self.total_training_steps
            timing: dict[str, float] = {}
            started = time.perf_counter()
            metrics = self.step(timing)
            if trainer_cfg.save_freq > 0 and (is_last_step or self.global_steps % trainer_cfg.save_freq == 0):
                t = time.perf_counter()
                self._save_checkpoint()
                timing["save_checkpoint"] = time.perf_counter() - t
            timing["step"] = time.perf_counter() - started
            metrics.update({"training/global_step": self.global_steps, "training/epoch": current_epoch})
            metrics.update({f"timing_s/{k}": v for k, v in timing.items()})
            ordered = {k: metrics[k] for k in HEADLINE if k in metrics}
            ordered.update({k: v for k, v in metrics.items() if k not in ordered})
            self.logger.log(data=ordered, step=self.global_steps)
            if not is_last_step:
                hold_for_preemption(self.global_steps)
            self.global_steps += 1
            current_epoch = (self.global_steps - 1) // self.steps_per_epoch
            if is_last_step:
                return

    def step(self, timing: dict[str, float]) -> dict[str, float]:
        """One GRPO step: train_batch_size prompts, rollout.n samples each, verl reward, advantage, update."""
        batch = self.data.next_batch()
        print(f"rehearsal: step {self.global_steps} prompts {','.join(StandinData.prompt_ids(batch))}", flush=True)
        injected_failure(self.global_steps)
        n = int(self.config.actor_rollout_ref.rollout.n)
        t = time.perf_counter()
        seed = int(self.config.data.get("seed") or 0)
        max_response_length = int(self.config.data.max_response_length)
        with torch.random.fork_rng(devices=[]):
            # sampling is a function of (data.seed, step, weights): a resumed run samples as an uninterrupted one
            torch.manual_seed(seed * 1_000_003 + self.global_steps)
            if self.agent_loop is not None:
                rollout = self.agent_loop.rollout(batch, n, self.global_steps)
            else:
                rollout = self.actor.rollout(list(batch["raw_prompt"]), n, max_response_length)
        timing["gen"] = time.perf_counter() - t
        t = time.perf_counter()
        texts = self.actor.decode_responses(rollout)
        turns = rollout.get("num_turns")
        scored = [self.data.score(batch, i // n, text, None if turns is None else int(turns[i]))
                  for i, text in enumerate(texts)]
        scores = [score for score, _ in scored]
        timing["reward"] = time.perf_counter() - t
        if rollout_data_dir := self.config.trainer.get("rollout_data_dir"):
            self._dump_generations(batch, n, rollout, texts, scored, rollout_data_dir)
        advantages = self.actor.advantages(scores, rollout, np.repeat(batch["uid"], n))
        t = time.perf_counter()
        actor_metrics = self.actor.update(rollout, advantages)
        timing["update_actor"] = time.perf_counter() - t
        resp_len = StandinActor.attended(rollout).sum(dim=1).float()
        valid_adv = advantages[rollout["response_mask"].bool()]
        turn_metrics = {}
        if turns is not None:  # verl's compute_data_metrics
            turn_metrics = {"num_turns/min": float(turns.min()), "num_turns/max": float(turns.max()),
                            "num_turns/mean": float(turns.mean())}
            print(f"rehearsal: step {self.global_steps} agent loops: {len(texts)} rollouts, "
                  f"{self.agent_loop.client.requests} generate calls so far, turns per rollout "
                  f"{','.join(str(int(x)) for x in turns)}", flush=True)
        return {
            "critic/score/mean": float(np.mean(scores)),
            "critic/rewards/mean": float(np.mean(scores)),
            **actor_metrics,
            "critic/score/max": float(np.max(scores)),
            "critic/score/min": float(np.min(scores)),
            "critic/advantages/mean": float(valid_adv.mean()) if valid_adv.numel() else 0.0,
            "critic/advantages/max": float(valid_adv.max()) if valid_adv.numel() else 0.0,
            "critic/advantages/min": float(valid_adv.min()) if valid_adv.numel() else 0.0,
            "response_length/mean": float(resp_len.mean()),
            "response_length/max": float(resp_len.max()),
            "response_length/min": float(resp_len.min()),
            "response_length/clip_ratio": float(torch.eq(resp_len, max_response_length).float().mean()),
            "prompt_length/mean": float(rollout["prompt_mask"].sum(dim=1).float().mean()),
            **turn_metrics,
        }

    def _dump_generations(self, batch: dict[str, Any], n: int, rollout: dict[str, torch.Tensor], texts: list[str],
                          scored: list[tuple[float, dict[str, Any]]], dump_path: str) -> None:
        """verl's `_log_rollout_data`: decoded prompts and responses, ground truths, scores, and every key of the
        score dicts as NaiveRewardManager collects them into reward_extra_info."""
        inputs = self.data.tokenizer.batch_decode(rollout["prompts"], skip_special_tokens=True)
        gts = [batch["reward_model"][i // n]["ground_truth"] for i in range(len(texts))]
        extra: dict[str, list] = {}
        for _, info in scored:
            for key, value in info.items():
                extra.setdefault(key, []).append(value)
        write_generations(inputs, texts, gts, [score for score, _ in scored], extra, dump_path, self.global_steps)

    # ---- verl v1 PPOTrainer._save_checkpoint / _load_checkpoint --------------------------------------------

    def _save_checkpoint(self) -> None:
        from verl.utils.fs import local_mkdir_safe

        trainer_cfg = self.config.trainer
        local_global_step_folder = os.path.join(trainer_cfg.default_local_dir, f"global_step_{self.global_steps}")
        if trainer_cfg.get("remove_previous_ckpt_in_save", False):
            max_actor_ckpt_to_keep = 1
        else:
            max_actor_ckpt_to_keep = trainer_cfg.get("max_actor_ckpt_to_keep", None)
        self.actor.save_checkpoint(os.path.join(local_global_step_folder, "actor"), self.global_steps,
                                   max_actor_ckpt_to_keep)
        local_mkdir_safe(local_global_step_folder)
        torch.save(self.train_dataloader.state_dict(), os.path.join(local_global_step_folder, "data.pt"))
        actor_ckpt_cfg = self.config.actor_rollout_ref.actor.get("checkpoint", {})
        if actor_ckpt_cfg.get("async_save", False):
            self.checkpoint_callback.on_save(trainer=self, global_step=self.global_steps,
                                             checkpoint_dir=local_global_step_folder, async_save=True)
            return
        with open(os.path.join(trainer_cfg.default_local_dir, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(self.global_steps))
        self.checkpoint_callback.on_save(trainer=self, global_step=self.global_steps,
                                         checkpoint_dir=local_global_step_folder, async_save=False)

    def _load_checkpoint(self) -> None:
        from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

        self.global_steps = 0
        trainer_cfg = self.config.trainer
        if trainer_cfg.resume_mode == "disable":
            print("rehearsal: resume_mode=disable, training from scratch", flush=True)
            return
        if trainer_cfg.resume_mode == "auto":
            folder = trainer_cfg.default_local_dir
            if not os.path.isabs(folder):
                folder = os.path.join(os.getcwd(), folder)
            global_step_folder = find_latest_ckpt_path(folder)
            if global_step_folder is None:
                print("rehearsal: no checkpoint tracker, training from scratch", flush=True)
                return
        elif trainer_cfg.resume_mode == "resume_path":
            global_step_folder = trainer_cfg.resume_from_path
            assert isinstance(global_step_folder, str), "resume ckpt must be str type"
            assert "global_step_" in global_step_folder, "resume ckpt must specify the global_steps"
            if not os.path.isabs(global_step_folder):
                global_step_folder = os.path.join(os.getcwd(), global_step_folder)
        else:
            raise ValueError(f"Unknown resume mode {trainer_cfg.resume_mode}")
        self.global_steps = int(global_step_folder.split("global_step_")[-1])
        self.actor.load_checkpoint(os.path.join(global_step_folder, "actor"),
                                   del_local_after_load=trainer_cfg.get("del_local_ckpt_after_load", False))
        dataloader_local_path = os.path.join(global_step_folder, "data.pt")
        if os.path.exists(dataloader_local_path):
            self.train_dataloader.load_state_dict(torch.load(dataloader_local_path, weights_only=False))
        else:
            print(f"Warning: No dataloader state found at {dataloader_local_path}, will start from scratch")
        print(f"rehearsal: resumed from {global_step_folder}, continuing at step {self.global_steps + 1}",
              flush=True)
