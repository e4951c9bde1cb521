"""SFT examples for the warm start: the train split's reference solutions rewritten into the response format.

Each dataset's reference solution becomes `<think>reasoning</think>\n<answer>final answer</answer>` (GSM8K's
calculator annotations `<<48/2=24>>` dropped, MATH's solution as the reasoning, MBPP's reference program as the
answer block, SQuAD's and NQ/HotpotQA's first gold answer). Every rewritten response is scored by the dataset's own
reward before it is used, and only those scoring full marks are kept: the examples teach exactly what the rewards
score, never a variant of it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from verl_grpo.errors import DataError
from verl_grpo.formats import ANSWER_CLOSE, ANSWER_OPEN, THINK_CLOSE, THINK_OPEN

_CALCULATOR = re.compile(r"<<[^<>]*>>")


@dataclass(frozen=True)
class SftExample:
    """One prompt (the row's chat messages) and the assistant response to learn."""

    prompt: list[dict[str, str]]
    response: str
    uid: str


def respond(reasoning: str, answer: str) -> str:
    return f"{THINK_OPEN}\n{reasoning.strip()}\n{THINK_CLOSE}\n{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


def gsm8k_response(extra: dict[str, Any], ground_truth: str) -> str:
    worked = str(extra["answer"]).rsplit("####", 1)[0]
    return respond(_CALCULATOR.sub("", worked), str(ground_truth))


def math_response(extra: dict[str, Any], ground_truth: str) -> str:
    return respond(str(extra["solution"]), str(extra.get("answer") or ground_truth))


def mbpp_response(extra: dict[str, Any], ground_truth: str) -> str:
    task = str(extra["text"]).strip()
    code = str(extra["code"]).replace("\r\n", "\n").strip()
    return respond(f"The function `{extra['entry_point']}` must: {task}", f"\n```python\n{code}\n```\n")


def squad_response(extra: dict[str, Any], ground_truth: str) -> str:
    """An answer without a search (the warm start's search trajectories show the look-up; see data.search_r1)."""
    return respond(f"The question is about {extra['title']}.", str(extra["answers"][0]))


def nq_hotpotqa_response(extra: dict[str, Any], ground_truth: str) -> str:
    """An answer without a search: the format only (no search trajectories without a corpus of the retriever's)."""
    return respond(f"The question asks: {str(extra['question']).strip()}", str(extra["answers"][0]))


REWRITERS: dict[str, Callable[[dict[str, Any], str], str]] = {
    "gsm8k": gsm8k_response, "math": math_response, "mbpp": mbpp_response, "squad": squad_response,
    "nq_hotpotqa": nq_hotpotqa_response,
}


def _mapping(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return json.loads(value)
    return dict(value)


def select_examples(dataset: str, rows: Sequence[dict[str, Any]], count: int, fits: Callable[[str], bool],
                    score: Callable[[Sequence[str], Sequence[Any]], Sequence[dict]]) -> list[SftExample]:
    """The first `count` rows (in the given order) whose rewritten solution fits the length budget and scores
    full marks with the dataset's reward. Raises DataError naming the fix when none qualifies."""
    rewrite = REWRITERS[dataset]
    picked: list[SftExample] = []
    for start in range(0, len(rows), max(count, 16)):
        chunk = rows[start:start + max(count, 16)]
        candidates = []
        for row in chunk:
            truth = _mapping(row["reward_model"])["ground_truth"]
            try:
                response = rewrite(_mapping(row["extra_info"]), truth)
            except (KeyError, TypeError, ValueError):
                continue
            if fits(response):
                candidates.append((row, truth, response))
        if not candidates:
            continue
        results = score([c[2] for c in candidates], [c[1] for c in candidates])
        for (row, _, response), result in zip(candidates, results, strict=True):
            if float(result["score"]) >= 1.0 - 1e-9:
                picked.append(SftExample(list(row["prompt"]), response, str(_mapping(row["extra_info"]).get(
                    "uid", row.get("uid", len(picked))))))
                if len(picked) == count:
                    return picked
    if not picked:
        raise DataError(f"no {dataset} train solution fits warm_start.max_response_tokens once rewritten; raise "
                        "warm_start.max_response_tokens (or algorithm.max_response_length)")
    return picked
