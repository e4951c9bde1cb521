"""The loop's policy update with plain torch: recompute each response's log-probs under the current weights, the
clipped importance-ratio GRPO loss against the behaviour log-probs, one AdamW step per training step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verl_grpo.errors import TrainingError
from verl_grpo.trainers.loop.batch import Group
from verl_grpo.trainers.loop.objective import Surrogate, clipped_surrogate, group_advantages, token_logprobs


@dataclass(frozen=True)
class Sequences:
    """Prompt + response token ids of a step's rollouts, right-padded, with the response mask and behaviour
    log-probs aligned to the predicted positions (position t predicts token t + 1)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor
    response_mask: torch.Tensor
    behaviour: torch.Tensor
    advantages: torch.Tensor
    first_predicting: int
    """The first position whose logits predict a response token (in any row): the LM head runs from there on."""


def build_sequences(groups: Sequence[Group], pad_id: int = 0) -> Sequences:
    rewards = torch.tensor([g.rewards for g in groups], dtype=torch.float32)
    advantages = group_advantages(rewards).reshape(-1)
    rows = [(g.prompt_token_ids, r.token_ids, r.logprobs) for g in groups for r in g.rollouts]
    width = max(len(p) + len(t) for p, t, _ in rows)
    n = len(rows)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    resp_mask = torch.zeros((n, width - 1), dtype=torch.float32)
    behaviour = torch.zeros((n, width - 1), dtype=torch.float32)
    for i, (prompt, tokens, logprobs) in enumerate(rows):
        if len(logprobs) != len(tokens):
            raise TrainingError(f"a rollout has {len(tokens)} tokens but {len(logprobs)} behaviour log-probs; the "
                                "rollout server must report one log-prob per generated token")
        seq = list(prompt) + list(tokens)
        input_ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[i, : len(seq)] = 1
        start = len(prompt) - 1  # the position whose logits predict the first response token
        resp_mask[i, start : start + len(tokens)] = 1.0
        behaviour[i, start : start + len(tokens)] = torch.tensor(logprobs, dtype=torch.float32)
    first = min(len(p) - 1 for p, _, _ in rows)
    return Sequences(input_ids, attention, input_ids[:, 1:], resp_mask, behaviour, advantages, max(first, 0))


@dataclass(frozen=True)
class UpdateStats:
    loss: float
    clip_fraction: float
    ratio_mean: float
    ratio_max: float
    grad_norm: float


class PolicyUpdate:
    """One optimizer step over a step's groups, in micro-batches whose losses add up to the whole step's loss."""

    def __init__(self, model, optimizer: torch.optim.Optimizer, *, surrogate: Surrogate, temperature: float,
                 micro_batch_size: int | None, max_grad_norm: float = 1.0, pad_id: int = 0):
        self.model, self.optimizer, self.surrogate = model, optimizer, surrogate
        self.temperature, self.micro_batch_size, self.max_grad_norm, self.pad_id = (temperature, micro_batch_size,
                                                                                   max_grad_norm, pad_id)

    def step(self, groups: Sequence[Group]) -> UpdateStats:
        seqs = build_sequences(groups, self.pad_id)
        n = seqs.input_ids.shape[0]
        micro = self.micro_batch_size or n
        total_tokens = float(seqs.response_mask.sum().clamp(min=1.0))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, clip, ratio, ratio_max = 0.0, 0.0, 0.0, 0.0
        for lo in range(0, n, micro):
            part = slice(lo, min(lo + micro, n))
            # Logits of the prompt positions are never used: HF's logits_to_keep runs the LM head (a 49k-vocab
            # matmul per token for SmolLM2) only over the positions from the first one predicting a response token.
            keep = seqs.input_ids.shape[1] - seqs.first_predicting
            logits = self.model(input_ids=seqs.input_ids[part], attention_mask=seqs.attention_mask[part],
                                logits_to_keep=keep).logits
            cols = slice(seqs.first_predicting, None)
            mask = seqs.response_mask[part, cols]
            logp = token_logprobs(logits[:, :-1], seqs.targets[part, cols], self.temperature)
            loss, stats = clipped_surrogate(logp, seqs.behaviour[part, cols], seqs.advantages[part], mask,
                                            self.surrogate)
            # token-mean divides by the step's active tokens, the seq-mean modes by its sequences
            token_mean = self.surrogate.loss_agg_mode == "token-mean"
            share = float(mask.sum()) / total_tokens if token_mean else (part.stop - lo) / n
            (loss * share).backward()
            loss_sum += float(loss.detach()) * share
            clip += stats.clip_fraction * share
            ratio += stats.ratio_mean * share
            ratio_max = max(ratio_max, stats.ratio_max)
        if not torch.isfinite(torch.tensor(loss_sum)):
            raise TrainingError(f"the loop's loss is not finite ({loss_sum}); lower algorithm.lr")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        return UpdateStats(loss_sum, clip, ratio, ratio_max, float(grad_norm))
