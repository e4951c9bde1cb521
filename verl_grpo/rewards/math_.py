"""MATH: LaTeX final answers, judged equivalent to the ground truth by Math-Verify (`parse` + `verify`).

The final answer is stated by the answer blocks and every `\\boxed{}` (see rewards.answers); a block's answer
is its last `\\boxed{}` when it has one, else its content, with outer `$`, `\\(`/`\\[` delimiters removed.
Every statement must be the same answer by Math-Verify (`\\frac12` and `0.5` are), so a response stating two
different answers is incorrect, whatever their formats and order. Answers and the ground truth are wrapped as
`\\boxed{...}`, the form Math-Verify extracts most reliably.

Math-Verify bounds its work with SIGALRM, which only works in the main thread. verl calls scorers
from executor threads, so off the main thread the check runs in a small process pool with a timeout.
"""

from __future__ import annotations

import multiprocessing
import re
import threading
from concurrent.futures import ProcessPoolExecutor, TimeoutError as FutureTimeout
from functools import lru_cache

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from verl_grpo.errors import DataError
from verl_grpo.latex import all_boxed, last_boxed
from verl_grpo.rewards.answers import answer_blocks, answer_regions
from verl_grpo.rewards.common import (
    Response,
    check_weights,
    no_trailing_score,
    parse_response,
    thinking_score,
    weighted_total,
)

WEIGHTS: dict[str, float] = {
    "correctness": 0.7,
    "answer_format": 0.15,
    "thinking": 0.1,
    "no_trailing": 0.05,
}
check_weights(WEIGHTS, "math")

MATH_VERIFY_TIMEOUT_S = 5
_OFF_THREAD_TIMEOUT_S = 15.0
_DELIMITERS = re.compile(r"^(?:\$\$(.*)\$\$|\$(.*)\$|\\\((.*)\\\)|\\\[(.*)\\\])$", re.S)
_GOLD_TARGETS = (LatexExtractionConfig(),)
_PRED_TARGETS = (LatexExtractionConfig(), ExprExtractionConfig())


def extract_answer(r: Response) -> str | None:
    """The one final answer as LaTeX (no delimiters, no `\\boxed`); None when it states none, an empty one,
    or two different ones."""
    answers = list(dict.fromkeys(stated_answers(r.text)))
    if not answers or None in answers:
        return None
    first = answers[0]
    return first if all(same_answer(first, other) for other in answers[1:]) else None


def stated_answers(text: str) -> list[str | None]:
    """Every final-answer statement, cleaned (None for an empty one), answer blocks first, from the first
    region of `text` that states any (see rewards.answers)."""
    for region in answer_regions(text):
        found = answer_blocks(region) + all_boxed(region)
        if found:
            return [_clean(t) for t in found]
    return []


def _clean(text: str) -> str | None:
    boxed = last_boxed(text)
    if boxed is not None:
        text = boxed
    text = text.strip()
    m = _DELIMITERS.match(text)
    if m:
        text = next(g for g in m.groups() if g is not None).strip()
    return text or None


def same_answer(a: str, b: str) -> bool:
    """Math-Verify equivalence either way round (it reads its first argument as the gold answer)."""
    return is_equivalent(a, b)[0] or is_equivalent(b, a)[0]


def boxed(latex: str) -> str:
    return "\\boxed{" + latex + "}"


def math_verify_equal(gold_latex: str, pred_latex: str, timeout_s: int = MATH_VERIFY_TIMEOUT_S) -> bool:
    """Math-Verify's verdict on `\\boxed{gold}` vs `\\boxed{pred}` (in the calling thread; main thread only)."""
    gold = _parse_gold(gold_latex, timeout_s)
    if not gold:
        return False
    pred = parse(boxed(pred_latex), _PRED_TARGETS, parsing_timeout=timeout_s)
    return bool(pred) and verify(gold, pred, timeout_seconds=timeout_s)


@lru_cache(maxsize=4096)
def _parse_gold(gold_latex: str, timeout_s: int) -> list:
    return parse(boxed(gold_latex), _GOLD_TARGETS, parsing_timeout=timeout_s)


_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()


def _off_thread_pool() -> ProcessPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn"))
        return _pool


def is_equivalent(gold_latex: str, pred_latex: str) -> tuple[bool, str]:
    """(equivalent, reason): Math-Verify with a timeout in any thread; a timeout counts as not equivalent."""
    if threading.current_thread() is threading.main_thread():
        return math_verify_equal(gold_latex, pred_latex), ""
    try:
        return _off_thread_pool().submit(math_verify_equal, gold_latex, pred_latex).result(_OFF_THREAD_TIMEOUT_S), ""
    except FutureTimeout:
        return False, f"math-verify timed out after {_OFF_THREAD_TIMEOUT_S:.0f}s"


def compute_score(solution_str: str, ground_truth: object) -> dict:
    """verl-style result: `score`, the components, `acc` and `pred`."""
    gold = str(ground_truth).strip()
    if not gold:
        raise DataError("math ground_truth is empty; reward_model.ground_truth must hold the LaTeX answer, e.g. "
                        "\\frac{1}{2}")
    r = parse_response(solution_str)
    pred = extract_answer(r)
    correct = is_equivalent(gold, pred)[0] if pred is not None else False
    components = {
        "correctness": 1.0 if correct else 0.0,
        "answer_format": 1.0 if r.layout_ok else 0.0,
        "thinking": thinking_score(r),
        "no_trailing": no_trailing_score(r),
    }
    return {
        "score": weighted_total(components, WEIGHTS),
        **components,
        "acc": components["correctness"],
        "pred": pred or "",
    }
