"""GSM8K: numeric final answers, compared exactly as rationals (2.50 == 2.5, 3/4 == 0.75, 1,000 == 1000).

The final answer is stated by the answer blocks, `#### n` lines, `\\boxed{}`, "the answer is n" phrases and a
final line holding exactly one number or ending an equation with one (`49 - 10 = 39`; see rewards.answers); every
statement must give the same value (1,000, 1000 and 1000.0 are the same), so a response stating two different
answers is incorrect, whatever their formats and order. Never "the last number anywhere". A statement of several
different numbers ("12 or 18") has no single value and makes the response incorrect too; a "the answer is" phrase
without any number states nothing.
"""

from __future__ import annotations

import re
from fractions import Fraction

from verl_grpo.errors import DataError
from verl_grpo.latex import all_boxed, last_boxed
from verl_grpo.rewards.answers import answer_blocks, answer_is_phrases, answer_regions, final_line, hash_answers
from verl_grpo.rewards.common import (
    Response,
    check_weights,
    layout_components,
    parse_response,
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
    """The response's one final numeric answer; None when it states none, or two different ones."""
    values = set(stated_values(r.text))
    return values.pop() if len(values) == 1 else None


def stated_values(text: str) -> list[Fraction | None]:
    """The value of every final-answer statement (None for one without a single value), from the first
    region of `text` that states any (see rewards.answers)."""
    for region in answer_regions(text):
        values = _values_in(region)
        if values:
            return values
    return []


def _values_in(text: str) -> list[Fraction | None]:
    explicit = answer_blocks(text) + hash_answers(text) + all_boxed(text)
    values = [single_value(t) for t in explicit]
    values += [single_value(t) for t in answer_is_phrases(text) if numbers_in(t)]
    line = final_line(text)
    if line is not None and (value := _final_line_value(line)) is not None:
        values.append(value)
    return values


def _final_line_value(line: str) -> Fraction | None:
    """A final line states an answer when it holds one number, or ends an equation with one (`49 - 10 = 39`)."""
    numbers = numbers_in(line)
    if len(numbers) == 1:
        return numbers[0]
    after = numbers_in(line.rsplit("=", 1)[1]) if len(numbers) > 1 and "=" in line else []
    return after[0] if len(after) == 1 else None


def parse_ground_truth(ground_truth: object) -> Fraction:
    """The numeric ground truth; DataError when it is not a number."""
    text = str(ground_truth).strip().replace(",", "")
    if not _PLAIN_NUMBER.fullmatch(text):
        raise DataError(
            f"gsm8k ground_truth {ground_truth!r} is not a number; reward_model.ground_truth must be the value after "
            "'####'"
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
        **layout_components(r, answer_fits=bool(_PLAIN_NUMBER.fullmatch(r.answer or ""))),
    }
    return {
        "score": weighted_total(components, WEIGHTS),
        **components,
        "acc": components["correctness"],
        "pred": format_value(pred),
    }
