"""Evaluation with the search tool (evaluate.tool_loop): a response that calls `search` gets the results the way the
chat template renders tool messages and goes on answering, as in TRL's training rollouts; the scored text keeps each
turn's <think> block; the eval table and metrics show who searched."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from verl_grpo.evaluate.generation import Generation, GenerationParams, HFGenerator
from verl_grpo.evaluate.metrics import aggregate
from verl_grpo.evaluate.tool_loop import ToolLoopGenerator
from verl_grpo.rewards import compute_score

CALL = ('<think>Look it up.</think><tool_call>\n{"name": "search", "arguments": {"query": "Super Bowl 50"}}\n'
        "</tool_call>")
ANSWER = "<think>Doc 1 says the Broncos won.</think><answer>Denver Broncos</answer>"
PASSAGE = "Doc 1(Title: Super Bowl 50) The Denver Broncos defeated the Carolina Panthers."


def search(query: str, top_k: int = 3) -> str:
    """Search the passage corpus and return the most relevant passages.

    Args:
        query: What to look up, as a question or keywords.
        top_k: How many passages to return (1 to 10).
    """
    search.queries.append(query)
    return PASSAGE


class Scripted:
    """An inner generator answering from a script: a call first, the answer once a tool result is in the prompt."""

    def __init__(self, tokenizer, first: str = CALL, then: str = ANSWER):
        self.tokenizer, self.first, self.then, self.prompts = tokenizer, first, then, []

    def generate(self, prompts, params, progress=None):
        self.prompts.append((list(prompts), params))
        out = []
        for prompt in prompts:
            text = self.then if "<tool_response>" in prompt else self.first
            ids = self.tokenizer(text + self.tokenizer.eos_token, add_special_tokens=False)["input_ids"]
            finished = len(ids) <= params.max_new_tokens
            ids = ids[:params.max_new_tokens]
            out.append([Generation(self.tokenizer.decode(ids, skip_special_tokens=True), len(ids), finished,
                                   ids=tuple(ids))] * params.samples)
        return out


@pytest.fixture
def tokenizer(tiny_model_dir):
    search.queries = []
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_a_call_gets_the_passages_and_the_answer_is_scored_with_every_think_block(tokenizer):
    inner = Scripted(tokenizer)
    loop = ToolLoopGenerator(inner, [search], max_turns=2, model_name="tiny")
    [prompt] = loop.render_prompts([[{"role": "user", "content": "Who won Super Bowl 50?"}]])
    assert '"name": "search"' in prompt and "<tool_call>" in prompt  # the tool list, as training rendered it

    [[gen]] = loop.generate([prompt], GenerationParams(max_new_tokens=400))

    assert search.queries == ["Super Bowl 50"] and gen.tool_calls == 1 and gen.finished
    second_prompt = inner.prompts[1][0][0]
    assert second_prompt.startswith(prompt) and second_prompt.endswith("<|im_start|>assistant\n")
    assert f"<tool_response>\n{PASSAGE}\n</tool_response>" in second_prompt
    assert gen.transcript == second_prompt[len(prompt):] + ANSWER + "<|im_end|>"
    assert gen.text == "<think>Look it up.</think>" + ANSWER  # the assistant turns, as the rewards saw them in training
    assert gen.tokens == sum(len(tokenizer(t + "<|im_end|>", add_special_tokens=False)["input_ids"])
                             for t in (CALL, ANSWER))
    truth = json.dumps({"target": ["Denver Broncos"]})
    assert compute_score("squad", gen.text, truth)["correctness"] == 1.0


def test_the_budget_counts_tool_results_and_max_turns_bounds_the_rounds(tokenizer):
    call_tokens = len(tokenizer(CALL + "<|im_end|>", add_special_tokens=False)["input_ids"])
    inner = Scripted(tokenizer)
    loop = ToolLoopGenerator(inner, [search], max_turns=2, model_name="tiny")
    prompts = loop.render_prompts([[{"role": "user", "content": "Who won?"}]])
    [[gen]] = loop.generate(prompts, GenerationParams(max_new_tokens=call_tokens + 5))
    assert gen.tool_calls == 1 and len(inner.prompts) == 1  # the passages used up the budget: no second turn
    assert not gen.finished and PASSAGE in gen.transcript

    always = Scripted(tokenizer, then=CALL)  # a model that never stops searching
    [[gen]] = ToolLoopGenerator(always, [search], max_turns=2, model_name="tiny").generate(
        prompts, GenerationParams(max_new_tokens=2000))
    assert gen.tool_calls == 2 and len(always.prompts) == 3 and len(search.queries) == 3


def test_result_room_is_for_tool_results_only_the_models_own_tokens_keep_their_budget(tokenizer):
    """max_new_tokens = the model's own budget + result_room (runner: tool_result_tokens): an answer without a call
    gets only its own budget, and one that calls gets the room for the passages on top."""
    call_tokens = len(tokenizer(CALL + "<|im_end|>", add_special_tokens=False)["input_ids"])
    answer_tokens = len(tokenizer(ANSWER + "<|im_end|>", add_special_tokens=False)["input_ids"])
    own = call_tokens + answer_tokens
    rambling = Scripted(tokenizer, first=ANSWER * 6)  # answers at length, never searches
    loop = ToolLoopGenerator(rambling, [search], max_turns=1, model_name="tiny", result_room=300)
    prompts = loop.render_prompts([[{"role": "user", "content": "Who won?"}]])
    [[gen]] = loop.generate(prompts, GenerationParams(max_new_tokens=own + 300))
    assert [params.max_new_tokens for _, params in rambling.prompts] == [own]
    assert gen.tokens == own and not gen.finished and gen.tool_calls == 0

    searching = Scripted(tokenizer)
    loop = ToolLoopGenerator(searching, [search], max_turns=1, model_name="tiny", result_room=300)
    [[gen]] = loop.generate(prompts, GenerationParams(max_new_tokens=own + 300))
    assert [params.max_new_tokens for _, params in searching.prompts] == [own, answer_tokens]
    assert gen.finished and gen.tool_calls == 1 and gen.tokens == own


def test_a_failing_or_unknown_tool_answers_with_its_error_as_in_training(tokenizer):
    def broken(query: str) -> str:
        """Search.

        Args:
            query: What to look up.
        """
        raise ConnectionError("retrieval-server unreachable")

    broken.__name__ = "search"
    inner = Scripted(tokenizer)
    prompts = ToolLoopGenerator(inner, [broken], 1, "tiny").render_prompts([[{"role": "user", "content": "q"}]])
    [[gen]] = ToolLoopGenerator(inner, [broken], 1, "tiny").generate(prompts, GenerationParams(max_new_tokens=400))
    assert "{'error': 'retrieval-server unreachable'}" in gen.transcript and gen.tool_calls == 1
    other = Scripted(tokenizer, first=CALL.replace('"search"', '"browse"'))
    [[gen]] = ToolLoopGenerator(other, [search], 1, "tiny").generate(prompts, GenerationParams(max_new_tokens=400))
    assert "Tool browse not found." in gen.transcript and search.queries == []


def test_the_real_model_renders_and_generates_through_the_loop(tiny_model_dir):
    loop = ToolLoopGenerator(HFGenerator(tiny_model_dir, threads=1), [search], 1, "tiny")
    prompts = loop.render_prompts([[{"role": "user", "content": "Who won Super Bowl 50?"}]] * 2)
    gens = loop.generate(prompts, GenerationParams(max_new_tokens=8, batch_size=2))
    assert [len(g) for g in gens] == [1, 1]
    assert all(g[0].tool_calls == 0 and 0 < g[0].tokens <= 8 and g[0].transcript for g in gens)


def test_metrics_report_the_share_of_answers_that_searched():
    rows = [{"correct": c, "score": float(c), "response_tokens": 5, "pred": "x", "tool_calls": n}
            for c, n in ((True, 1), (False, 0), (True, 2), (False, 0))]
    metrics = aggregate(rows)
    assert metrics["tool_use_rate"] == 0.5 and metrics["tool_calls_per_response"] == 0.75
    assert "tool_use_rate" not in aggregate([{k: v for k, v in r.items() if k != "tool_calls"} for r in rows])
