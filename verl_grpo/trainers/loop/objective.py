"""The GRPO objective of the loop, as pure tensor functions: group advantages and the clipped surrogate loss with
an importance ratio against the behaviour policy (the log-probs the rollout server generated with)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from verl_grpo.config.schema import AlgorithmConfig

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages of a [groups, rollouts] reward matrix: (r - group mean) / (group std + eps), with verl's
    unbiased std; a group whose rollouts tie (or a group of one) has advantage 0."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, rollouts], got shape {tuple(rewards.shape)}")
    if rewards.shape[1] < 2:
        return torch.zeros_like(rewards)
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + eps)


@dataclass(frozen=True)
class LossStats:
    clip_fraction: float
    """Share of active tokens whose ratio the clip bounded (the clipped term won)."""
    ratio_mean: float
    """Mean importance ratio exp(logp_new - logp_behaviour) over active tokens."""
    ratio_max: float


def aggregate(token_loss: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: int | None = None) -> torch.Tensor:
    """verl's `agg_loss`: token-mean (÷ active tokens of the batch), seq-mean-token-mean (mean per sequence, then
    over sequences), seq-mean-token-sum (sum per sequence, then mean), seq-mean-token-sum-norm (sum per sequence
    ÷ norm_length, default the padded length, then mean)."""
    mask = mask.to(token_loss.dtype)
    if mode == "token-mean":
        return (token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    per_seq = (token_loss * mask).sum(dim=-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / mask.sum(dim=-1).clamp(min=1.0)
    elif mode == "seq-mean-token-sum-norm":
        per_seq = per_seq / float(norm_length or mask.shape[-1])
    elif mode != "seq-mean-token-sum":
        raise ValueError(f"unknown loss_agg_mode {mode!r}; one of {', '.join(LOSS_AGG_MODES)}")
    return per_seq.mean()


@dataclass(frozen=True)
class Surrogate:
    """The clipped surrogate's settings (`algorithm.*` of the run)."""

    clip_low: float
    clip_high: float
    loss_agg_mode: str = "token-mean"
    norm_length: int | None = None
    """seq-mean-token-sum-norm's divisor (the run's max_response_length); None: the padded length."""

    @classmethod
    def of(cls, algorithm: AlgorithmConfig) -> Surrogate:
        """The run's algorithm.clip_low, .clip_high, .loss_agg_mode and .max_response_length."""
        return cls(algorithm.clip_low, algorithm.clip_high, algorithm.loss_agg_mode, algorithm.max_response_length)


def clipped_surrogate(logp_new: torch.Tensor, logp_behaviour: torch.Tensor, advantages: torch.Tensor,
                      mask: torch.Tensor, settings: Surrogate) -> tuple[torch.Tensor, LossStats]:
    """PPO's clipped surrogate with DAPO's asymmetric clip, per token:
    max(-A·ratio, -A·clamp(ratio, 1 - clip_low, 1 + clip_high)), ratio = exp(logp_new - logp_behaviour), aggregated
    over the `mask`ed response tokens by `loss_agg_mode`. All tensors are [sequences, tokens] except advantages
    ([sequences] or [sequences, tokens]). The behaviour log-probs make replayed and stale samples off-policy
    corrected (the ratio is the importance weight, clipped)."""
    clip_low, clip_high = settings.clip_low, settings.clip_high
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logp_new)
    log_ratio = (logp_new - logp_behaviour).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    token_loss = torch.maximum(unclipped, clipped)
    loss = aggregate(token_loss, mask, settings.loss_agg_mode, settings.norm_length)
    with torch.no_grad():
        active = mask.bool()
        n = max(int(active.sum()), 1)
        stats = LossStats(
            clip_fraction=float(((clipped > unclipped) & active).sum()) / n,
            ratio_mean=float(ratio[active].sum()) / n,
            ratio_max=float(ratio[active].max()) if active.any() else 0.0,
        )
    return loss, stats


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature) of each target token: the same quantity the rollout server reports as a
    token's behaviour log-prob (no top-k / top-p renormalisation)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
