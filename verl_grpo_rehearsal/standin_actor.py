"""The actor of the CPU stand-in: a real GRPO optimisation of actor_rollout_ref.model.path on CPU.

What is verl's own: FSDP2 wrapping (`apply_fsdp2`, world size 1 on a gloo process group), the optimizer
(`build_optimizer`) and LR schedule of verl's FSDP engine, `FSDPCheckpointManager` (so the actor checkpoint
files, `fsdp_config.json`, `huggingface/` and the max_actor_ckpt_to_keep rotation are verl's), GRPO advantages
(`compute_grpo_outcome_advantage`), the policy loss (`get_policy_loss_fn(actor.policy_loss.loss_mode)`),
log-probs/entropy (torch's grad clipping: verl's FSDP2 variant moves the norm to CUDA). What stands in: HF `generate`
for vLLM rollouts, and one process instead of Ray worker groups.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import numpy as np
import torch

from verl_grpo.errors import ConfigError


def init_single_process_group() -> None:
    """A world-size-1 gloo process group: what verl's FSDP code and checkpoint manager expect, on CPU."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


VERL_DEFAULT_ATTENTION = "flash_attention_2"
"""What verl 0.9.1 loads a model with when `model.override_config` names no attn_implementation."""


def node_attention(model_cfg: Any) -> str:
    """The attention a GPU node would load the model with, as run here: flash_attention_2 needs flash-attn
    installed by the node's setup (stood in by sdpa on a CPU, said in a `rehearsal:` line); without it this raises
    transformers' own error, as the node would. remove-padding with anything but flash-attn is refused: verl packs
    the micro-batch into one row, and sdpa would attend across its sequences."""
    from verl_grpo_rehearsal.shims import stood_in_packages

    attn = str(model_cfg.get("override_config", {}).get("attn_implementation", VERL_DEFAULT_ATTENTION))
    if model_cfg.get("use_remove_padding", True) and attn != "flash_attention_2":
        raise ConfigError(f"actor_rollout_ref.model.use_remove_padding=True with attn_implementation={attn}: verl "
                          "packs each micro-batch into one row, which only flash-attn's varlen kernel keeps apart; "
                          "set use_remove_padding=False (verl.attn_implementation=sdpa renders it)")
    if attn != "flash_attention_2":
        return attn
    if "flash-attn" not in stood_in_packages():
        raise ImportError("FlashAttention2 has been toggled on, but it cannot be used due to the following error: the "
                          "package flash_attn seems to be not installed (verl's default attn_implementation; the "
                          "node's setup installs no flash-attn: set verl.attn_implementation=sdpa or add flash-attn "
                          "to skypilot.node_packages)")
    print("rehearsal: flash_attention_2 stood in by sdpa (setup installed flash-attn, which needs a GPU)", flush=True)
    return "sdpa"


class StandinActor:
    """Policy, optimizer, LR scheduler and verl's FSDP checkpoint manager for one run's config."""

    def __init__(self, config: Any, tokenizer: Any):
        from omegaconf import OmegaConf
        from torch.distributed.device_mesh import init_device_mesh
        from transformers import AutoModelForCausalLM
        from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
        from verl.utils.config import omega_conf_to_dataclass
        from verl.utils.fsdp_utils import apply_fsdp2
        from verl.workers.config.optimizer import build_optimizer

        init_single_process_group()
        self.config = config
        self.tokenizer = tokenizer
        self.actor_cfg = config.actor_rollout_ref.actor
        self.rollout_cfg = config.actor_rollout_ref.rollout
        model = AutoModelForCausalLM.from_pretrained(config.actor_rollout_ref.model.path, dtype=torch.float32,
                                                     attn_implementation=node_attention(config.actor_rollout_ref.model))
        model.config.name_or_path = str(config.actor_rollout_ref.model.path)
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))  # verl create_device_mesh, world size 1
        apply_fsdp2(model, {"mesh": mesh, "reshard_after_forward": True},
                    self.actor_cfg.get("fsdp_config", {}))
        self.model = model
        optim_cfg = omega_conf_to_dataclass(self.actor_cfg.optim)
        self.optim_cfg = optim_cfg
        self.optimizer = build_optimizer(model.parameters(), optim_cfg)
        self.lr_scheduler = self._build_lr_scheduler()
        self.checkpoint_manager = FSDPCheckpointManager(
            model=model, optimizer=self.optimizer, lr_scheduler=self.lr_scheduler, processing_class=tokenizer,
            checkpoint_config=self.actor_cfg.checkpoint,
            trust_remote_code=config.actor_rollout_ref.model.get("trust_remote_code", False))
        self.loss_cfg = OmegaConf.create({
            "clip_ratio": self.actor_cfg.clip_ratio, "clip_ratio_low": self.actor_cfg.clip_ratio_low,
            "clip_ratio_high": self.actor_cfg.clip_ratio_high, "clip_ratio_c": self.actor_cfg.get("clip_ratio_c", 3.0),
            "policy_loss": OmegaConf.to_container(self.actor_cfg.policy_loss), "global_batch_info": {}})

    def _build_lr_scheduler(self):
        """verl FSDP engine `_build_lr_scheduler`: constant or cosine with warmup."""
        from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

        c = self.optim_cfg
        total, warmup = c.total_training_steps, c.lr_warmup_steps
        if warmup <= 0:
            warmup = int(c.lr_warmup_steps_ratio * total)
        if c.lr_scheduler_type == "constant":
            return get_constant_schedule_with_warmup(optimizer=self.optimizer, num_warmup_steps=warmup)
        if c.lr_scheduler_type == "cosine":
            return get_cosine_schedule_with_warmup(optimizer=self.optimizer, num_warmup_steps=warmup,
                                                   num_training_steps=total, min_lr_ratio=c.min_lr_ratio,
                                                   num_cycles=c.num_cycles, zero_indexed_step=c.zero_indexed_step)
        # verl's FSDP engine knows these two as well, and fails the same way on the cluster.
        raise ConfigError(f"actor_rollout_ref.actor.optim.lr_scheduler_type={c.lr_scheduler_type!r} is not one verl "
                          "0.9.1 builds; use constant or cosine")

    # ---- rollout -------------------------------------------------------------------------------------------

    def rollout(self, raw_prompts: list[Any], n: int, max_new_tokens: int) -> dict[str, torch.Tensor]:
        """n sampled responses per prompt (interleaved, as verl's `repeat(n, interleave=True)`), HF generate."""
        from verl.utils.tokenizer import normalize_token_ids

        kwargs = dict(self.config.data.get("apply_chat_template_kwargs", {}) or {})
        ids = [self.tokenizer.apply_chat_template(list(p), add_generation_prompt=True, tokenize=True, **kwargs)
               for p in raw_prompts]
        ids = [list(normalize_token_ids(x)) for x in ids]
        ids = [x for x in ids for _ in range(n)]
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        width = max(len(x) for x in ids)
        prompts = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
        prompt_mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        top_k = int(self.rollout_cfg.top_k)
        self.model.eval()
        with torch.no_grad():
            out = self.model.generate(
                input_ids=prompts, attention_mask=prompt_mask, do_sample=True,
                temperature=float(self.rollout_cfg.temperature), top_p=float(self.rollout_cfg.top_p),
                top_k=top_k if top_k > 0 else 0, max_new_tokens=max_new_tokens, pad_token_id=pad,
                eos_token_id=self.tokenizer.eos_token_id)
        responses = out[:, width:]
        if responses.shape[1] == 0:
            responses = torch.full((len(ids), 1), pad)
        is_eos = responses == self.tokenizer.eos_token_id
        after_eos = (torch.cumsum(is_eos.long(), dim=1) - is_eos.long()) > 0  # tokens after the first eos
        response_mask = (~after_eos).long()
        return {"prompts": prompts, "prompt_mask": prompt_mask, "responses": responses,
                "response_mask": response_mask}

    @staticmethod
    def attended(rollout: dict[str, torch.Tensor]) -> torch.Tensor:
        """The response tokens the model attends to: its own and, in a multi-turn rollout, the tool results too
        (`response_mask`, the loss mask, holds only its own)."""
        return rollout.get("response_attention", rollout["response_mask"])

    def decode_responses(self, rollout: dict[str, torch.Tensor]) -> list[str]:
        """Each response as verl's reward manager decodes it: every attended token (tool results included)."""
        out = []
        for resp, mask in zip(rollout["responses"], self.attended(rollout), strict=True):
            out.append(self.tokenizer.decode(resp[: int(mask.sum())], skip_special_tokens=True))
        return out

    def _log_probs(self, rollout: dict[str, torch.Tensor], rows: slice, with_entropy: bool = False):
        from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

        prompts, responses = rollout["prompts"][rows], rollout["responses"][rows]
        mask = torch.cat([rollout["prompt_mask"][rows], self.attended(rollout)[rows]], dim=1)
        input_ids = torch.cat([prompts, responses], dim=1)
        position_ids = (torch.cumsum(mask, dim=1) - 1).clamp(min=0)
        logits = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids).logits
        logits = logits[:, prompts.shape[1] - 1: -1, :] / float(self.rollout_cfg.temperature)
        log_probs = logprobs_from_logits(logits, responses)
        entropy = entropy_from_logits(logits) if with_entropy else None
        return log_probs, entropy

    # ---- training ------------------------------------------------------------------------------------------

    def advantages(self, scores: list[float], rollout: dict[str, torch.Tensor], uids: np.ndarray) -> torch.Tensor:
        """verl's GRPO outcome advantage: the score sits on each response's last valid token."""
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

        mask = rollout["response_mask"]
        token_level_rewards = torch.zeros(mask.shape, dtype=torch.float32)
        last = (self.attended(rollout).sum(dim=1) - 1).clamp(min=0)
        token_level_rewards[torch.arange(mask.shape[0]), last] = torch.tensor(scores, dtype=torch.float32)
        adv, _ = compute_grpo_outcome_advantage(
            token_level_rewards=token_level_rewards, response_mask=mask, index=uids,
            norm_adv_by_std_in_grpo=bool(self.config.algorithm.get("norm_adv_by_std_in_grpo", True)))
        return adv

    def update(self, rollout: dict[str, torch.Tensor], advantages: torch.Tensor) -> dict[str, float]:
        """verl's PPO actor update: ppo_epochs × mini-batches (ppo_mini_batch_size prompts × n) of
        micro-batches, the configured policy loss, grad clipping, one optimizer and LR-scheduler step each."""
        from verl.trainer.ppo.core_algos import get_policy_loss_fn

        n_rows = rollout["responses"].shape[0]
        n = int(self.rollout_cfg.n)
        mini = min(int(self.actor_cfg.ppo_mini_batch_size) * n, n_rows)
        micro = max(1, int(self.actor_cfg.get("ppo_micro_batch_size_per_gpu") or mini))
        loss_fn = get_policy_loss_fn(self.actor_cfg.policy_loss.get("loss_mode", "vanilla"))
        loss_agg_mode = self.actor_cfg.loss_agg_mode
        self.model.eval()
        with torch.no_grad():
            old_log_probs = torch.cat([self._log_probs(rollout, slice(i, i + micro))[0]
                                       for i in range(0, n_rows, micro)])
        self.model.train()
        stats: dict[str, list[float]] = {"pg_loss": [], "clipfrac": [], "ppo_kl": [], "entropy": [], "grad_norm": []}
        for _ in range(int(self.actor_cfg.get("ppo_epochs", 1))):
            for start in range(0, n_rows, mini):
                end = min(start + mini, n_rows)
                mask_all = rollout["response_mask"][start:end]
                self.loss_cfg.global_batch_info = {"dp_size": 1, "batch_num_tokens": int(mask_all.sum()),
                                                   "global_batch_size": end - start}
                self.optimizer.zero_grad()
                pg_loss_total = 0.0
                for i in range(start, end, micro):
                    rows = slice(i, min(i + micro, end))
                    log_probs, entropy = self._log_probs(rollout, rows, with_entropy=True)
                    mask = rollout["response_mask"][rows]
                    pg_loss, pg_metrics = loss_fn(old_log_prob=old_log_probs[rows], log_prob=log_probs,
                                                  advantages=advantages[rows], response_mask=mask,
                                                  loss_agg_mode=loss_agg_mode, config=self.loss_cfg)
                    pg_loss.backward()
                    pg_loss_total += float(pg_loss.detach())
                    stats["clipfrac"].append(pg_metrics.get("actor/pg_clipfrac", 0.0))
                    stats["ppo_kl"].append(pg_metrics.get("actor/ppo_kl", 0.0))
                    stats["entropy"].append(float((entropy.detach() * mask).sum() / mask.sum().clamp(min=1)))
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=self.optim_cfg.clip_grad)
                grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
                if np.isfinite(grad_norm):
                    self.optimizer.step()
                self.lr_scheduler.step()
                stats["pg_loss"].append(pg_loss_total)
                stats["grad_norm"].append(grad_norm)
        return {
            "actor/pg_loss": float(np.mean(stats["pg_loss"])),
            "actor/lr": float(self.lr_scheduler.get_last_lr()[0]),
            "actor/entropy": float(np.mean(stats["entropy"])),
            "actor/pg_clipfrac": float(np.mean(stats["clipfrac"])),
            "actor/ppo_kl": float(np.mean(stats["ppo_kl"])),
            "actor/grad_norm": float(np.mean(stats["grad_norm"])),
        }

    # ---- checkpoints (verl's FSDPCheckpointManager) --------------------------------------------------------

    def save_checkpoint(self, local_path: str, global_step: int, max_ckpt_to_keep: int | None) -> float:
        started = time.perf_counter()
        self.checkpoint_manager.save_checkpoint(local_path=local_path, hdfs_path=None, global_step=global_step,
                                                max_ckpt_to_keep=max_ckpt_to_keep)
        return time.perf_counter() - started

    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False) -> None:
        self.checkpoint_manager.load_checkpoint(local_path=local_path, hdfs_path=None,
                                                del_local_after_load=del_local_after_load)
