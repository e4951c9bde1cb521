"""Search-R1 warm-start trajectories and the TRL tool wiring: pure parts."""

from __future__ import annotations

import pytest

from verl_grpo.config import load_config
from verl_grpo.data.search_r1 import answer_sentence, trajectories
from verl_grpo.rewards.scoring import compute_scores
from verl_grpo.services.retrieval_index import Passage, Question
from verl_grpo.services.search import format_passages

PASSAGES = [Passage("0-0", "Super Bowl 50", "Super Bowl 50 was an American football game. The Denver Broncos won it."),
            Passage("0-1", "Warsaw", "Warsaw is the capital of Poland. It has 1.7 million people.")]
QUESTIONS = [Question("Who won Super Bowl 50?", "0-0", "Denver Broncos"),
             Question("How many people live in Warsaw?", "0-1", "1.7 million"),
             Question("Unanswered?", "0-1", "")]


def test_answer_sentence_is_the_one_holding_the_span():
    assert answer_sentence(PASSAGES[0].text, "Denver Broncos") == "The Denver Broncos won it."
    assert answer_sentence(PASSAGES[1].text, "absent") == "Warsaw is the capital of Poland."


def test_trajectory_is_a_search_call_then_an_answer_from_the_returned_passage():
    examples = trajectories(PASSAGES, QUESTIONS, 4, "SYS", format_passages, seed=0)
    assert len(examples) == 4  # two answered questions, both turns each; the unanswered one is never used
    call, answer = examples[0], examples[1]
    assert [m["role"] for m in call.prompt] == ["system", "user"]
    (tool_call,) = call.completion["tool_calls"]
    assert tool_call["function"]["name"] == "search"
    question = call.prompt[1]["content"]
    title = next(p.title for p in PASSAGES if any(q.question == question and q.passage_id == p.id for q in QUESTIONS))
    assert tool_call["function"]["arguments"] == {"query": question}  # the question finds its paragraph best
    assert [m["role"] for m in answer.prompt] == ["system", "user", "assistant", "tool"]
    assert answer.prompt[3]["content"].startswith(f"Doc 1(Title: {title}) ")
    truth = next(q.answer for q in QUESTIONS if q.question == question)
    # The answer turn is in the response format the rewards score, with the reference span as the answer.
    assert answer.completion["content"].endswith(f"<answer>{truth}</answer>")
    assert trajectories(PASSAGES, QUESTIONS, 3, "SYS", format_passages, seed=0) == examples[:3]
    by_title = trajectories(PASSAGES, QUESTIONS, 4, "SYS", format_passages, seed=0, query="title")
    assert by_title[0].completion["tool_calls"][0]["function"]["arguments"] == {"query": title}
    assert by_title[1].prompt[3] == answer.prompt[3]  # the same passage comes back either way
    assert trajectories(PASSAGES, QUESTIONS, 4, "", format_passages)[0].prompt[0]["role"] == "user"


def test_answer_turn_has_the_layout_the_rewards_score():
    """SQuAD answers are spans, not numbers: gsm8k's number check aside, the layout components score full marks."""
    (_, answer) = trajectories(PASSAGES, QUESTIONS, 2, "SYS", format_passages, seed=1)
    result = compute_scores("gsm8k", [answer.completion["content"]], ["0"])[0]
    assert result["thinking"] == result["answer_block"] == result["no_trailing"] == 1.0


def test_tools_only_with_retrieval_and_chatml_gets_a_tool_template(tiny_model_dir):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    from verl_grpo.errors import ConfigError
    from verl_grpo.trainers.trl.backend import grpo_args
    from verl_grpo.trainers.trl.tools import tool_functions, with_tool_template

    plain = load_config(["gsm8k"], ["model.name=tiny"], env={})
    assert tool_functions(plain) == [] and grpo_args(plain, "o", use_cpu=True).max_tool_calling_iterations is None
    tools_cfg = load_config(["gsm8k"], ["model.name=tiny", "services.enabled=[retrieval]",
                                        "services.retrieval.max_tool_turns=3"], env={})
    assert [t.__name__ for t in tool_functions(tools_cfg)] == ["search"]
    assert grpo_args(tools_cfg, "o", use_cpu=True).max_tool_calling_iterations == 3

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert not supports_tool_calling(tokenizer)
    with_tool_template(tokenizer, "tiny")
    assert supports_tool_calling(tokenizer)
    parsed = add_response_schema(tokenizer).parse_response(
        '<tool_call>\n{"name": "search", "arguments": {"query": "Super Bowl 50"}}\n</tool_call><|im_end|>')
    assert parsed["tool_calls"][0]["function"] == {"name": "search", "arguments": {"query": "Super Bowl 50"}}

    class NoChatML:
        chat_template = "{{ messages[0]['content'] }}"

        def get_vocab(self):
            return {"<s>": 0}

        def apply_chat_template(self, *args, **kwargs):
            return "hi"

    with pytest.raises(ConfigError, match="no ChatML model"):
        with_tool_template(NoChatML(), "gpt2")
