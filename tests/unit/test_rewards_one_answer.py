"""One final answer, as properties: a true answer and a different wrong one, each rendered through random answer
formats (and random forms of the same value), mixed in random orders with reasoning text that holds no answer
markers. One statement of the truth is correct; any mix of two different answers is incorrect; the truth stated
several times, in several formats and forms, is correct. Derandomized, so every run checks the same examples."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from verl_grpo.rewards import compute_score
from verl_grpo.rewards.gsm8k import format_value

PROPERTY = settings(max_examples=80, derandomize=True, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
# Shrinking through Math-Verify takes minutes; a failing MATH example is reported as found (its response is in
# the assertion message).
MATH_PROPERTY = settings(PROPERTY, max_examples=40, phases=[Phase.explicit, Phase.generate])
WORDS = ["she", "buys", "eggs", "then", "adds", "the", "total", "so", "we", "get", "each", "week", "half", "of",
         "it", "left", "now", "apples", "cost", "more", "x", "divide", "both", "sides", "simplify"]

reasoning = st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map(" ".join)
"""A line of reasoning without digits or answer markers (so it is never a final line holding a number)."""
thinking = st.lists(st.one_of(st.sampled_from(WORDS), st.integers(0, 500).map(str)), min_size=1, max_size=12).map(
    " ".join)
"""Reasoning inside <think>: numbers allowed, they are no final answer."""


def assemble(data: st.DataObject, statements: list[str], final_line: str | None = None) -> str:
    """The statements in the given order, each on its own line with optional reasoning before it, after an
    optional <think> block; `final_line` (a bare answer) ends the response when given."""
    lines = []
    if data.draw(st.booleans(), label="think"):
        lines.append(f"<think>{data.draw(thinking, label='thinking')}</think>")
    for statement in statements:
        if data.draw(st.booleans(), label="reasoning before"):
            lines.append(data.draw(reasoning, label="reasoning"))
        lines.append(statement)
    if final_line is not None:
        lines.append(final_line)
    elif data.draw(st.booleans(), label="reasoning after"):
        lines.append(data.draw(reasoning, label="reasoning"))
    return "\n".join(lines)


# ---------------------------------------------------------------- GSM8K: numbers, equal as rationals

gsm8k_values = st.builds(Fraction, st.integers(0, 5_000_000), st.sampled_from([1, 1, 1, 2, 4, 10, 100]))


def decimal_text(value: Fraction, commas: bool, extra_zeros: int) -> str:
    text = f"{Decimal(value.numerator) / Decimal(value.denominator):{',' if commas else ''}f}"
    if extra_zeros:
        text += ("" if "." in text else ".") + "0" * extra_zeros
    return text


@st.composite
def gsm8k_form(draw: st.DrawFn, value: Fraction) -> str:
    """One way to write the number: 1000, 1,000, 1000.0, $1,000.00, 1000 dollars."""
    text = decimal_text(value, draw(st.booleans()), draw(st.integers(0, 2)))
    return draw(st.sampled_from(["{}", "${}", "\\${}", "{} dollars"])).format(text)


GSM8K_FORMATS = ["<answer>{}</answer>", "#### {}", "\\boxed{{{}}}", "So the total is $\\boxed{{{}}}$.",
                 "The answer is {}.", "The final answer is {}", "Answer: {}"]


@st.composite
def gsm8k_statement(draw: st.DrawFn, value: Fraction) -> str:
    return draw(st.sampled_from(GSM8K_FORMATS)).format(draw(gsm8k_form(value)))


def gsm8k_truth(value: Fraction) -> str:
    return decimal_text(value, commas=False, extra_zeros=0)


@PROPERTY
@given(st.data(), gsm8k_values, st.booleans())
def test_gsm8k_one_statement_of_the_truth_is_correct(data, truth, as_final_line):
    form = data.draw(gsm8k_form(truth))
    if as_final_line:
        response = assemble(data, [], final_line=form)
    else:
        response = assemble(data, [data.draw(gsm8k_statement(truth))])
    result = compute_score("gsm8k", response, gsm8k_truth(truth))
    assert result["acc"] == 1.0, response
    assert result["pred"] == format_value(truth)


@PROPERTY
@given(st.data(), st.lists(gsm8k_values, min_size=2, max_size=2, unique=True), st.integers(0, 2))
def test_gsm8k_two_different_answers_are_incorrect_in_any_formats_and_order(data, values, extra):
    truth, wrong = values
    stated = [truth, wrong] + data.draw(st.lists(st.sampled_from(values), min_size=extra, max_size=extra))
    stated = data.draw(st.permutations(stated), label="order")
    statements = [data.draw(gsm8k_statement(v)) for v in stated]
    final = data.draw(st.none() | gsm8k_form(data.draw(st.sampled_from(values))), label="final line")
    response = assemble(data, statements, final_line=final)
    result = compute_score("gsm8k", response, gsm8k_truth(truth))
    assert result["acc"] == 0.0 and result["correctness"] == 0.0, response
    assert result["pred"] == ""


@PROPERTY
@given(st.data(), gsm8k_values, st.integers(2, 4))
def test_gsm8k_the_truth_stated_several_times_is_correct(data, truth, times):
    statements = [data.draw(gsm8k_statement(truth)) for _ in range(times)]
    final = data.draw(st.none() | gsm8k_form(truth), label="final line")
    response = assemble(data, statements, final_line=final)
    assert compute_score("gsm8k", response, gsm8k_truth(truth))["acc"] == 1.0, response


# ---------------------------------------------------------------- MATH: LaTeX, equal by Math-Verify

rationals = st.builds(Fraction, st.integers(-30, 30), st.integers(1, 12)).map(lambda v: ("rational", v))
surds = st.tuples(st.integers(1, 6), st.sampled_from([2, 3, 5, 6, 7])).map(lambda ab: ("surd", ab))
math_values = rationals | surds
"""("rational", p/q) or ("surd", (a, b)) for a·√b with b square-free: different tuples are different numbers."""


def math_truth(value: tuple) -> str:
    """The ground truth as the MATH data writes it."""
    kind, v = value
    if kind == "surd":
        return f"{v[0]}\\sqrt{{{v[1]}}}" if v[0] != 1 else f"\\sqrt{{{v[1]}}}"
    if v.denominator == 1:
        return str(v.numerator)
    sign = "-" if v < 0 else ""
    return f"{sign}\\frac{{{abs(v.numerator)}}}{{{v.denominator}}}"


def _terminates(q: int) -> bool:
    while q % 2 == 0:
        q //= 2
    while q % 5 == 0:
        q //= 5
    return q == 1


@st.composite
def math_form(draw: st.DrawFn, value: tuple) -> str:
    """One way to write the value: \\frac{1}{2}, \\dfrac12-style, 1/2, 0.5, \\frac{2}{4}; 2\\sqrt{3}, \\sqrt{12}."""
    kind, v = value
    if kind == "surd":
        a, b = v
        return draw(st.sampled_from([math_truth(value), f"\\sqrt{{{a * a * b}}}"]))
    p, q = abs(v.numerator), v.denominator
    sign = "-" if v < 0 else ""
    k = draw(st.integers(1, 3))
    forms = [math_truth(value), f"{sign}\\dfrac{{{p}}}{{{q}}}", f"{sign}{p}/{q}", f"{sign}\\frac{{{k * p}}}{{{k * q}}}"]
    if _terminates(q):
        forms.append(str(Decimal(v.numerator) / Decimal(v.denominator)))
    return draw(st.sampled_from(forms))


MATH_FORMATS = ["<answer>{}</answer>", "<answer>${}$</answer>", "<answer>\\boxed{{{}}}</answer>", "\\boxed{{{}}}",
                "so we get $\\boxed{{{}}}$.", "\\[\\boxed{{{}}}\\]"]


@st.composite
def math_statement(draw: st.DrawFn, value: tuple) -> str:
    return draw(st.sampled_from(MATH_FORMATS)).format(draw(math_form(value)))


@MATH_PROPERTY
@given(st.data(), math_values)
def test_math_one_statement_of_the_truth_is_correct(data, truth):
    response = assemble(data, [data.draw(math_statement(truth))])
    result = compute_score("math", response, math_truth(truth))
    assert result["acc"] == 1.0, response
    assert result["pred"]


@MATH_PROPERTY
@given(st.data(), st.lists(math_values, min_size=2, max_size=2, unique=True), st.integers(0, 1))
def test_math_two_different_answers_are_incorrect_in_any_formats_and_order(data, values, extra):
    truth, wrong = values
    stated = [truth, wrong] + data.draw(st.lists(st.sampled_from(values), min_size=extra, max_size=extra))
    stated = data.draw(st.permutations(stated), label="order")
    response = assemble(data, [data.draw(math_statement(v)) for v in stated])
    result = compute_score("math", response, math_truth(truth))
    assert result["acc"] == 0.0 and result["correctness"] == 0.0, response
    assert result["pred"] == ""


@MATH_PROPERTY
@given(st.data(), math_values, st.integers(2, 3))
def test_math_the_truth_stated_several_times_is_correct(data, truth, times):
    response = assemble(data, [data.draw(math_statement(truth)) for _ in range(times)])
    assert compute_score("math", response, math_truth(truth))["acc"] == 1.0, response
