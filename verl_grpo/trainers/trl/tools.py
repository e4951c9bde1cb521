"""The Search-R1 tool on the TRL backend: TRL's GRPOTrainer runs the multi-turn rollouts itself (`tools=`), calling
our `search` function, which asks the run's retrieval-server.

TRL parses tool calls with a response schema it knows for a few chat templates, and renders the tool list through
the chat template. The tiny model and SmolLM2 speak ChatML without tools; ChatML is what Qwen2.5's template writes
too, with Hermes `<tool_call>{json}</tool_call>` calls (the format verl's `hermes` tool parser reads), so a ChatML
tokenizer gets TRL's copy of that template. Any other template without tool support is a ConfigError.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from verl_grpo.config import RunConfig
from verl_grpo.config.search import uses_search
from verl_grpo.errors import ConfigError

CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
CALL_RATE = "tools/call_frequency"
"""TRL's per-step tool metric: tool calls per completion (train: per rollout)."""
FAILURE_RATE = "tools/failure_frequency"
"""TRL's per-step tool metric: share of tool calls that raised or named an unknown tool."""


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
