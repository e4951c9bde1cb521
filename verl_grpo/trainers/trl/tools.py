"""The Search-R1 tool on the TRL backend: TRL's GRPOTrainer runs the multi-turn rollouts itself (`tools=`), calling
our `search` function, which asks the run's retrieval-server.

TRL parses tool calls with a response schema it knows for a few chat templates, and renders the tool list through
the chat template. The tiny model and SmolLM2 speak ChatML without tools; ChatML is what Qwen2.5's template writes
too, with Hermes `<tool_call>{json}</tool_call>` calls (the format verl's `hermes` tool parser reads), so a ChatML
tokenizer gets TRL's copy of that template. Any other template without tool support is a ConfigError.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from verl_grpo.config import RunConfig
from verl_grpo.errors import ConfigError

CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
CALL_RATE = "tools/call_frequency"
"""TRL's per-step tool metric: tool calls per completion (train: per rollout)."""
FAILURE_RATE = "tools/failure_frequency"
"""TRL's per-step tool metric: share of tool calls that raised or named an unknown tool."""
CHARS_PER_TOKEN = 3
"""A safe bound for passages: English Wikipedia text runs about 4 characters per token in the Qwen2.5 and SmolLM2
vocabularies, so a result of N characters takes fewer than N / 3 tokens."""
RESULT_WRAPPING_TOKENS = 32
"""The chat template's wrapping of one result: the tool turn's markers and `<tool_response>` tags, and the next
assistant header."""


def uses_search(cfg: RunConfig) -> bool:
    return "retrieval" in cfg.services.enabled


def tool_functions(cfg: RunConfig) -> list[Callable[..., str]]:
    """The tools of a run: `search` (its results cut at services.retrieval.max_result_chars) when the run has the
    search tool, none otherwise. It asks the run's retrieval-server, or the Search-R1 retriever at
    services.retrieval.url in its own API (without the services' token: that retriever is none of the run's)."""
    if not uses_search(cfg):
        return []
    from verl_grpo.services.search import bound_search

    r = cfg.services.retrieval
    if r.url:  # that retriever has a default of its own: ask ours
        return [bound_search(r.max_result_chars, r.url, token="", api="search_r1", default_top_k=r.default_top_k)]
    return [bound_search(r.max_result_chars)]


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


def tool_schemas(tools: list[Callable[..., Any]]) -> str:
    """The tools as the chat template receives them (transformers' JSON schema of each function), as JSON text."""
    from transformers.utils import get_json_schema

    return json.dumps([get_json_schema(t) for t in tools])


def with_tool_template(tokenizer: Any, model_name: str) -> Any:
    """The tokenizer, given Qwen2.5's ChatML template with tool calls when its own template cannot render them."""
    from trl.chat_template_utils import qwen2_5_chat_template, supports_tool_calling

    if supports_tool_calling(tokenizer):
        return tokenizer
    vocab = tokenizer.get_vocab()
    if not all(t in vocab for t in CHATML_TOKENS):
        raise ConfigError(f"model.name {model_name!r}: its chat template cannot render tool calls and it is no ChatML "
                          "model; the search tool (services.enabled: retrieval) needs a chat model with tool calling")
    tokenizer.chat_template = qwen2_5_chat_template
    return tokenizer
