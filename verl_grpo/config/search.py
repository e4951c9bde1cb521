"""The search tool as the run's config decides it: whether the run has it, and the room its results take in a rollout.

Predicates on the RunConfig alone, in the config package so that every layer that asks (the trainers, the evals,
the SkyPilot templates, the flow's eval plan) imports them downward; the tool itself (the function a rollout calls,
its chat template) lives with the TRL backend (trainers/trl/tools.py).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verl_grpo.config.schema import RunConfig

CHARS_PER_TOKEN = 3
"""A safe bound for passages: English Wikipedia text runs about 4 characters per token in the Qwen2.5 and SmolLM2
vocabularies, so a result of N characters takes fewer than N / 3 tokens."""
RESULT_WRAPPING_TOKENS = 32
"""The chat template's wrapping of one result: the tool turn's markers and `<tool_response>` tags, and the next
assistant header."""


def uses_search(cfg: RunConfig) -> bool:
    """The run has the search tool: `retrieval` is among its services."""
    return "retrieval" in cfg.services.enabled


def tool_result_tokens(cfg: RunConfig) -> int:
    """Room a rollout needs for its tool results: max_tool_turns results of max_result_chars characters each, with
    the chat template's wrapping; 0 without the tool. TRL (max_completion_length), verl (response_length) and the
    evaluation (max_new_tokens) count tool results against a rollout's length, so each adds this to the model's own
    algorithm.max_response_length (or eval.max_new_tokens)."""
    if not uses_search(cfg):
        return 0
    r = cfg.services.retrieval
    return r.max_tool_turns * (math.ceil(r.max_result_chars / CHARS_PER_TOKEN) + RESULT_WRAPPING_TOKENS)


def rollout_tokens(cfg: RunConfig) -> int:
    """A rollout's whole length: the model's own tokens plus its tool results."""
    return cfg.algorithm.max_response_length + tool_result_tokens(cfg)
