"""Format components shared by every dataset: the `<think>…</think><answer>…</answer>` layout.

Each component is a float in [0, 1]; a dataset's total is the weighted sum of its components with
the weights of its table (see gsm8k.WEIGHTS, math_.WEIGHTS, mbpp.WEIGHTS).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from verl_grpo.formats import ANSWER_CLOSE, ANSWER_OPEN, THINK_CLOSE, THINK_OPEN

_THINK_RE = re.compile(re.escape(THINK_OPEN) + r"(.*?)" + re.escape(THINK_CLOSE), re.S)
_ANSWER_RE = re.compile(re.escape(ANSWER_OPEN) + r"(.*?)" + re.escape(ANSWER_CLOSE), re.S)
_LAYOUT_RE = re.compile(
    r"\s*" + re.escape(THINK_OPEN) + r"(?P<think>.*?)" + re.escape(THINK_CLOSE)
    + r"\s*" + re.escape(ANSWER_OPEN) + r"(?P<answer>.*?)" + re.escape(ANSWER_CLOSE) + r"\s*",
    re.S,
)  # fmt: skip


@dataclass(frozen=True)
class Response:
    """The parts of one response that the scorers look at."""

    text: str
    thinking: str | None
    """Content of the first <think> block (None without one)."""
    answer: str | None
    """Content of the answer block when there is exactly one (None for zero or several)."""
    answer_blocks: int
    trailing: str
    """Text after the last </answer> (the whole response when there is no answer block)."""
    layout_ok: bool
    """Exactly `<think>…</think><answer>…</answer>` with only whitespace around, one block each."""


def parse_response(text: str) -> Response:
    think = _THINK_RE.search(text)
    answers = list(_ANSWER_RE.finditer(text))
    trailing = text[answers[-1].end() :] if answers else text
    layout = _LAYOUT_RE.fullmatch(text)
    layout_ok = bool(
        layout
        and text.count(THINK_OPEN) == 1
        and text.count(ANSWER_OPEN) == 1
        and layout.group("think").strip()
        and layout.group("answer").strip()
    )
    return Response(
        text=text,
        thinking=think.group(1) if think else None,
        answer=answers[0].group(1).strip() if len(answers) == 1 else None,
        answer_blocks=len(answers),
        trailing=trailing,
        layout_ok=layout_ok,
    )


def thinking_score(r: Response) -> float:
    """1 when a non-empty <think> block comes before the answer block (or exists, without one)."""
    if r.thinking is None or not r.thinking.strip():
        return 0.0
    think_end = r.text.find(THINK_CLOSE)
    answer_start = r.text.find(ANSWER_OPEN)
    return 1.0 if answer_start < 0 or think_end < answer_start else 0.0


def answer_block_score(r: Response) -> float:
    """1 for exactly one non-empty answer block."""
    return 1.0 if r.answer else 0.0


def no_trailing_score(r: Response) -> float:
    """1 when an answer block exists and nothing but whitespace follows the last one."""
    return 1.0 if r.answer_blocks >= 1 and not r.trailing.strip() else 0.0


def layout_components(r: Response, answer_fits: bool) -> dict[str, float]:
    """The format components of the think-then-answer layout (GSM8K's table, which reasoning-gym's rows share):
    `strict_format` (the whole layout, its answer as the task wants it: `answer_fits`), `thinking`, `answer_block`,
    `no_trailing`."""
    return {
        "strict_format": 1.0 if r.layout_ok and answer_fits else 0.0,
        "thinking": thinking_score(r),
        "answer_block": answer_block_score(r),
        "no_trailing": no_trailing_score(r),
    }


def weighted_total(components: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """Σ weight·component, clipped to [0, 1] against float rounding."""
    total = sum(weights[name] * float(components[name]) for name in weights)
    return min(1.0, max(0.0, round(total, 10)))


def check_weights(weights: Mapping[str, float], dataset: str) -> None:
    """Weights tables must sum to 1 so that `score` is in [0, 1] (checked at import time)."""
    if abs(sum(weights.values()) - 1.0) > 1e-9:
        raise ValueError(f"{dataset} reward weights sum to {sum(weights.values())}, not 1: {dict(weights)}")
