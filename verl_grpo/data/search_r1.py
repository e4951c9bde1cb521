"""Search-R1 style warm-start trajectories over the retrieval corpus (SQuAD paragraphs with their questions).

One trajectory is a question, a `search` call, the passage the call returns (rendered as the tool renders
retrieval hits) and the answer in the response format the rewards score. It becomes two SFT examples, one per
assistant turn, so the loss falls only on what the model says (never on the tool's text):

    [system, user: question]                                  → assistant: search(query=<the question>)
    [system, user, assistant: search(...), tool: Doc 1(...)]  → assistant: <think>…</think><answer>…</answer>

The query is the question itself: over the 2,067 SQuAD paragraphs it finds the paragraph the question was written
about first in 63 % of questions and among the first five in 87 % (bench/results/services.md), where the article's
title finds the article but rarely the paragraph. The tool's text is that paragraph as the tool renders a hit (cut
as the run cuts results); the reasoning quotes the passage's sentence that holds the answer span.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from verl_grpo.data.schema import SEARCH_TOOL
from verl_grpo.data.warm_start import respond

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
MAX_REASONING_CHARS = 160


@dataclass(frozen=True)
class ToolSftExample:
    """One assistant turn to learn: the conversation so far and the assistant message that follows it."""

    prompt: list[dict[str, Any]]
    completion: dict[str, Any]
    uid: str


def search_call(query: str) -> dict[str, Any]:
    """The assistant message that calls the tool, as chat templates and TRL's response parser write it."""
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": SEARCH_TOOL, "arguments": {"query": query}}}]}


def answer_sentence(passage: str, answer: str) -> str:
    """The passage's sentence that contains the answer (the passage's first sentence when none does)."""
    sentences = [s for s in _SENTENCE_END.split(passage.strip()) if s]
    for sentence in sentences:
        if answer and answer in sentence:
            return sentence[:MAX_REASONING_CHARS]
    return (sentences[0] if sentences else passage)[:MAX_REASONING_CHARS]


def trajectories(passages: Sequence[Any], questions: Sequence[Any], count: int, system_prompt: str,
                 render_hits, seed: int = 0, query: str = "question") -> list[ToolSftExample]:
    """`count` SFT examples (count // 2 trajectories, both turns of each; one more first turn when count is odd)
    from seeded-random answered questions. `passages`/`questions` as `retrieval_index.load_squad` returns them;
    `render_hits` turns a list of {title, text} hits into the tool's text (`search.format_passages`); `query`
    (warm_start.search_query) is what the call looks up, the question or the article title."""
    by_id = {p.id: p for p in passages}
    answered = [q for q in questions if q.answer and q.passage_id in by_id]
    random.Random(seed).shuffle(answered)
    out: list[ToolSftExample] = []
    for i, q in enumerate(answered):
        if len(out) >= count:
            break
        passage = by_id[q.passage_id]
        head = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
            {"role": "user", "content": q.question}]
        call = search_call(q.question if query == "question" else passage.title)
        out.append(ToolSftExample(head, call, f"squad/{i}/call"))
        if len(out) >= count:
            break
        tool = {"role": "tool", "name": SEARCH_TOOL,
                "content": render_hits([{"title": passage.title, "text": passage.text}])}
        reasoning = f"Doc 1 ({passage.title}) says: {answer_sentence(passage.text, q.answer)}"
        out.append(ToolSftExample([*head, call, tool], {"role": "assistant", "content": respond(reasoning, q.answer)},
                                  f"squad/{i}/answer"))
    return out
