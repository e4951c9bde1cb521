"""Where a response states its final answer: every statement, in every format the scorers accept.

A response can state a final answer in several places: `<answer>` blocks, `#### n` lines, `\\boxed{}`,
"the answer is …" and its final line. The dataset scorers read all of them (each keeps the formats it accepts)
and count the response correct only when every statement gives the same answer and it matches the ground truth:
stating two different answers is never rewarded, whatever their formats and order.

Closed `<think>` blocks are left out: reasoning may try a candidate and reject it. When nothing is stated
outside them, the whole response is read (a response whose only answer sits in its reasoning scores as before).
"""

from __future__ import annotations

import re

from verl_grpo.formats import ANSWER_CLOSE, ANSWER_OPEN, THINK_CLOSE, THINK_OPEN

_THINKING = re.compile(re.escape(THINK_OPEN) + r".*?" + re.escape(THINK_CLOSE), re.S)
_BLOCK = re.compile(re.escape(ANSWER_OPEN) + r"(.*?)" + re.escape(ANSWER_CLOSE), re.S)
_HASHES = re.compile(r"####\s*([^\n]*)")
# `is\b`: "the answer isn't 12" states no answer.
_ANSWER_IS = re.compile(r"(?:the\s+)?(?:final\s+)?answer\s*(?:is\b|:)\s*([^\n]*)", re.I)


def answer_regions(text: str) -> list[str]:
    """Texts to read statements from, in order: the response without its closed <think> blocks, then the
    whole response (only when that differs); a scorer uses the first region that states anything."""
    outside = _THINKING.sub("\n", text)
    return [outside] if outside == text else [outside, text]


def answer_blocks(text: str) -> list[str]:
    """Contents of every `<answer>…</answer>` block, unstripped."""
    return _BLOCK.findall(text)


def hash_answers(text: str) -> list[str]:
    """The rest of the line after every `####`."""
    return _HASHES.findall(text)


def answer_is_phrases(text: str) -> list[str]:
    """The rest of the line after every "the (final) answer is" / "answer:"."""
    return _ANSWER_IS.findall(text)


def final_line(text: str) -> str | None:
    """The last non-blank line, stripped; None for a blank text."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None
