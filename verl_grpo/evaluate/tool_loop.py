"""Evaluation with tools: the model may call the run's tools (the Search-R1 `search`) while it answers, as it may in
training, where TRL's GRPOTrainer runs the same loop (`GRPOTrainer._tool_call_loop`, trl 1.x).

The prompt is rendered with the tool list; a response that calls tools (parsed with TRL's `parse_response`, the
parser training used) gets their results appended the way the chat template renders tool messages, and generation
goes on from there, up to `max_turns` rounds of calls and the eval's token budget: `result_room` of it is for the
tool results (they count against it, as TRL counts them against max_completion_length), the rest for the model's own
tokens, so a response that never calls a tool stops where the model's own budget ends. The scored text is what the
rewards saw in training: the assistant turns, each with its <think> block (`trl_adapter.message_text`); the whole
exchange, tool results included, is the generation's `transcript`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from verl_grpo.evaluate.generation import Generation, GenerationParams, Progress, render_prompts


@dataclass
class _Exchange:
    """One response being generated: the prompt so far, the assistant messages, the budget spent."""

    prompt: str
    start: int
    """Where the exchange begins in `prompt` (after the original prompt)."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    spent: int = 0
    """Generated tokens plus tool-result tokens."""
    generated: int = 0
    calls: int = 0
    last: Generation | None = None
    cut: bool = False
    """The tool results used up the budget: the response ends with them, unanswered."""


class ToolLoopGenerator:
    """A Generator whose responses may call `tools` (plain functions returning text, as TRL takes them)."""

    def __init__(self, inner: Any, tools: Sequence[Callable[..., str]], max_turns: int, model_name: str = "",
                 result_room: int = 0):
        from transformers.utils import get_json_schema
        from trl.chat_template_utils import add_response_schema

        from verl_grpo.trainers.trl.tools import with_tool_template

        self.inner = inner
        self.tokenizer = add_response_schema(with_tool_template(inner.tokenizer, model_name))
        self.tools = {tool.__name__: tool for tool in tools}
        self.schemas = [get_json_schema(tool) for tool in tools]
        self.max_turns = max_turns
        self.result_room = result_room

    def render_prompts(self, conversations: Sequence[list[dict[str, str]]]) -> list[str]:
        return render_prompts(self.tokenizer, conversations, tools=self.schemas)

    def generate(self, prompts: Sequence[str], params: GenerationParams,
                 progress: Progress | None = None) -> list[list[Generation]]:
        own = max(1, params.max_new_tokens - self.result_room)
        first = self.inner.generate(prompts, replace(params, max_new_tokens=own), progress)
        exchanges = [[self._take(_Exchange(p, len(p)), g) for g in gens] for p, gens in zip(prompts, first)]
        flat = [x for per_prompt in exchanges for x in per_prompt]
        for _ in range(self.max_turns):
            calling = [x for x in flat if x.generated < own and self._call_tools(x, params.max_new_tokens)]
            by_budget: dict[int, list[_Exchange]] = {}
            for x in calling:
                by_budget.setdefault(min(own - x.generated, params.max_new_tokens - x.spent), []).append(x)
            for budget, group in by_budget.items():
                more = self.inner.generate([x.prompt for x in group],
                                           replace(params, max_new_tokens=budget, samples=1))
                for x, gens in zip(group, more):
                    self._take(x, gens[0])
            if not calling:
                break
        return [[self._result(x) for x in per_prompt] for per_prompt in exchanges]

    def _take(self, x: _Exchange, gen: Generation) -> _Exchange:
        """Add one generated turn to the exchange."""
        from trl.chat_template_utils import parse_response

        x.messages.append(parse_response(self.tokenizer, list(gen.ids)) if gen.ids else
                          {"role": "assistant", "content": gen.text})
        x.prompt += self.tokenizer.decode(list(gen.ids), skip_special_tokens=False) if gen.ids else gen.text
        x.spent += gen.tokens
        x.generated += gen.tokens
        x.last = gen
        return x

    def _call_tools(self, x: _Exchange, budget: int) -> bool:
        """Run the last turn's tool calls and append their results; False when it made none or the budget is gone."""
        calls = x.messages[-1].get("tool_calls") or []
        if not calls or not (x.last and x.last.finished) or x.spent >= budget:
            return False
        results = [{"role": "tool", "name": name, "content": self._run(name, arguments)}
                   for name, arguments in (_name_and_arguments(c) for c in calls)]
        suffix = self._tool_suffix(results)
        tokens = len(self.tokenizer(suffix, add_special_tokens=False)["input_ids"])
        x.calls += len(calls)
        x.spent += tokens
        x.prompt += suffix
        x.cut = x.spent >= budget
        return not x.cut

    def _run(self, name: str, arguments: Any) -> str:
        """The tool's text, or the error TRL hands the model in training ({'error': ...})."""
        try:
            if name not in self.tools:
                raise ValueError(f"Tool {name} not found.")
            return str(self.tools[name](**arguments))
        except Exception as e:  # any failure of a tool is the model's to see, as in training
            return str({"error": str(e)})

    def _tool_suffix(self, tool_messages: list[dict[str, Any]]) -> str:
        """The chat template's rendering of tool results plus the next assistant header (TRL's
        `_get_tool_suffix_ids`, as text): a dummy exchange with and without them, the prefix cut at its last EOS."""
        dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]}]
        prefix = self.tokenizer.apply_chat_template(dummy, add_generation_prompt=False, tokenize=False)
        full = self.tokenizer.apply_chat_template(dummy + tool_messages, add_generation_prompt=True, tokenize=False)
        eos = self.tokenizer.eos_token
        if eos and eos in prefix:
            prefix = prefix[: prefix.rindex(eos) + len(eos)]
        if not full.startswith(prefix):
            raise ValueError("the chat template renders tool results in a way the eval cannot append to a response")
        return full[len(prefix):]

    def _result(self, x: _Exchange) -> Generation:
        from verl_grpo.rewards.trl_adapter import message_text

        return Generation(text="".join(message_text(m) for m in x.messages), tokens=x.generated,
                          finished=bool(x.last and x.last.finished) and not x.cut, tool_calls=x.calls,
                          transcript=x.prompt[x.start:])


def _name_and_arguments(call: dict[str, Any]) -> tuple[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = {}
    return str(function.get("name", call.get("name", "unknown"))), arguments if isinstance(arguments, dict) else {}

