"""GSM8K: numeric final answers, compared exactly as rationals (2.50 == 2.5, 3/4 == 0.75, 1,000 == 1000).

Where the final answer comes from, in order: the answer block; else `#### n`, the last `\\boxed{}`,
"the answer is n", or a final line holding exactly one number. Never "the last number anywhere".
An answer that states several different numbers ("12 or 18") has no single value and is incorrect.
"""

from __future__ import annotations

import re
from fractions import Fraction

from verl_grpo.errors import DataError
from verl_grpo.latex import last_boxed
from verl_grpo.rewards.common import (
    Response,
    answer_block_score,
    check_weights,
    no_trailing_score,
    parse_response,
    thinking_score,
    weighted_total,
)

WEIGHTS: dict[str, float] = {
    "correctness": 0.6,
    "strict_format": 0.15,
    "thinking": 0.1,
    "answer_block": 0.1,
    "no_trailing": 0.05,
}
check_weights(WEIGHTS, "gsm8k")

_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>-\s?)?"
    r"(?P<num>(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:\s*/\s*(?P<den>\d+(?:\.\d+)?))?"
)
_PLAIN_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")
_HASHES = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS = re.compile(r"(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)\s*([^\n]*)", re.I)
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_LATEX_WRAPPERS = re.compile(r"\\(?:text|mathrm|textbf|mathbf)\s*\{([^{}]*)\}")


def _normalise(text: str) -> str:
    text = text.replace("\u2212", "-").replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    text = text.replace("\\,", "").replace("\\!", "").replace("\\ ", " ")
    text = _LATEX_FRAC.sub(r"\1/\2", text)
    return _LATEX_WRAPPERS.sub(r"\1", text)


def numbers_in(text: str) -> list[Fraction]:
    """Every number in `text`, as exact rationals (commas, $, %, units and LaTeX fractions tolerated)."""
    values = []
    for m in _NUMBER.finditer(_normalise(text)):
        value = Fraction(m.group("num").replace(",", ""))
        if m.group("den"):
            den = Fraction(m.group("den"))
            if den == 0:
                continue
            value /= den
        values.append(-value if m.group("sign") else value)
    return values


def single_value(text: str) -> Fraction | None:
    """The one number a final-answer text states; None when it states none or several different ones."""
    boxed = last_boxed(text)
    if boxed is not None:
        text = boxed
    distinct = set(numbers_in(text))
    if len(distinct) == 1:
        return distinct.pop()
    if len(distinct) > 1 and "=" in text:  # "3 * 6 = 18": the value after the last '='
        after = set(numbers_in(text.rsplit("=", 1)[1]))
        if len(after) == 1:
            return after.pop()
    return None


def extract_answer(r: Response) -> Fraction | None:
    """The response's final numeric answer (see the module docstring for the order of sources)."""
    if r.answer_blocks:
        blocks = re.findall(r"<answer>(.*?)</answer>", r.text, re.S)
        values = {single_value(b) for b in blocks}
        return values.pop() if len(values) == 1 else None
    text = r.text
    for source in (_last_match(_HASHES, text), last_boxed(text), _last_match(_ANSWER_IS, text)):
        if source is not None:
            return single_value(source)
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if lines:
        found = numbers_in(lines[-1])
        if len(found) == 1:
            return found[0]
    return None


def _last_match(pattern: re.Pattern[str], text: str) -> str | None:
    matches = pattern.findall(text)
    return matches[-1] if matches else None


def parse_ground_truth(ground_truth: object) -> Fraction:
    """The numeric ground truth; DataError when it is not a number."""
    text = str(ground_truth).strip().replace(",", "")
    if not _PLAIN_NUMBER.fullmatch(text):
        raise DataError(
            f"gsm8k ground_truth {ground_truth!r} is not a number; reward_model.ground_truth must be the value after '####'"
        )
    num, _, den = text.partition("/")
    return Fraction(num) / (Fraction(den) if den else 1)


def format_value(value: Fraction | None) -> str:
    """Canonical text of an extracted answer ('' when none), e.g. 18, 2.5, 1/3."""
    if value is None:
        return ""
    if value.denominator == 1:
        return str(value.numerator)
    as_float = float(value)
    return repr(as_float) if Fraction(repr(as_float)) == value else f"{value.numerator}/{value.denominator}"


def compute_score(solution_str: str, ground_truth: object) -> dict:
    """verl-style result: `score`, the components, `acc` and `pred`."""
    truth = parse_ground_truth(ground_truth)
    r = parse_response(solution_str)
    pred = extract_answer(r)
    components = {
        "correctness": 1.0 if pred is not None and pred == truth else 0.0,
        "strict_format": 1.0 if r.layout_ok and _PLAIN_NUMBER.fullmatch(r.answer or "") else 0.0,
        "thinking": thinking_score(r),
        "answer_block": answer_block_score(r),
        "no_trailing": no_trailing_score(r),
    }
    return {
        "score": weighted_total(components, WEIGHTS),
        **components,
        "acc": components["correctness"],
        "pred": format_value(pred),
    }
