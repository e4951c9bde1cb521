"""MBPP: the answer block's ```python block is run against the task's assert lines in the sandbox pool.

Ground truth is the JSON text (or dict) `{"test_list": [...], "test_setup_code": "...",
"challenge_test_list": [...]}`; the pass rate is over `test_list` (MBPP's standard tests).
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from verl_grpo.errors import DataError
from verl_grpo.rewards.common import Response, check_weights, parse_response, thinking_score, weighted_total
from verl_grpo.rewards.sandbox import ExecResult, ExecutionPool, get_pool

WEIGHTS: dict[str, float] = {
    "test_pass_rate": 0.7,
    "syntax": 0.1,
    "format": 0.1,
    "thinking": 0.1,
}
check_weights(WEIGHTS, "mbpp")

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.S | re.I)
_ONLY_FENCE = re.compile(r"\s*```[ \t]*(?:python3?|py)[ \t]*\n(.*?)```\s*", re.S | re.I)


@dataclass(frozen=True)
class Tests:
    test_list: list[str]
    setup_code: str
    challenge_test_list: list[str]


def parse_ground_truth(ground_truth: object) -> Tests:
    """Decode the MBPP ground truth; DataError naming the field when it is unusable."""
    data = ground_truth
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except ValueError as e:
            raise DataError(
                f"mbpp ground_truth is not valid JSON ({e}); it must be a JSON object with test_list, "
                "test_setup_code and challenge_test_list"
            ) from None
    if not isinstance(data, dict):
        raise DataError(f"mbpp ground_truth must be a JSON object or dict with test_list, got {type(data).__name__}")
    tests = data.get("test_list")
    if tests is None or isinstance(tests, str) or not all(isinstance(t, str) for t in tests) or not len(tests):
        raise DataError("mbpp ground_truth.test_list must be a non-empty list of assert lines (strings)")
    setup = data.get("test_setup_code") or ""
    if not isinstance(setup, str):
        raise DataError("mbpp ground_truth.test_setup_code must be a string")
    return Tests(list(tests), setup, [str(t) for t in (data.get("challenge_test_list") or [])])


def extract_code(r: Response) -> str | None:
    """The program: the first fenced block of the answer block (its raw text when unfenced); without an
    answer block, the last fenced block of the response."""
    if r.answer is not None:
        m = _FENCE.search(r.answer)
        return (m.group(1) if m else r.answer).strip() or None
    if r.answer_blocks:
        return None
    blocks = _FENCE.findall(r.text)
    return (blocks[-1].strip() or None) if blocks else None


def syntax_ok(code: str | None) -> bool:
    if not code:
        return False
    try:
        with warnings.catch_warnings():  # e.g. invalid escape sequences: legal, but noisy
            warnings.simplefilter("ignore")
            ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class _Prepared:
    response: Response
    code: str | None
    syntax: bool
    tests: Tests


def _prepare(solution_str: str, ground_truth: object) -> _Prepared:
    tests = parse_ground_truth(ground_truth)
    r = parse_response(solution_str)
    code = extract_code(r)
    return _Prepared(r, code, syntax_ok(code), tests)


def _result(p: _Prepared, run: ExecResult | None) -> dict:
    total = len(p.tests.test_list)
    if run is None:
        run = ExecResult(0, total, "no code in the response" if not p.code else "code does not parse")
    components = {
        "test_pass_rate": run.pass_rate,
        "syntax": 1.0 if p.syntax else 0.0,
        "format": 1.0 if p.response.layout_ok and _ONLY_FENCE.fullmatch(p.response.answer or "") else 0.0,
        "thinking": thinking_score(p.response),
    }
    return {
        "score": weighted_total(components, WEIGHTS),
        **components,
        "acc": 1.0 if run.passed == run.total and run.total else 0.0,
        "passed": float(run.passed),
        "total": float(run.total),
        "reason": run.reason,
    }


def compute_score(solution_str: str, ground_truth: object, pool: ExecutionPool | None = None) -> dict:
    """verl-style result: `score`, the components, `acc`, test counts and why the run ended."""
    p = _prepare(solution_str, ground_truth)
    run = (pool or get_pool()).run(p.code, p.tests.test_list, p.tests.setup_code) if p.syntax else None
    return _result(p, run)


def compute_scores(
    solution_strs: Sequence[str], ground_truths: Sequence[object], pool: ExecutionPool | None = None
) -> list[dict]:
    """Batch form of `compute_score`: programs run in parallel across the pool's workers."""
    prepared = [_prepare(s, g) for s, g in zip(solution_strs, ground_truths, strict=True)]
    runnable = [i for i, p in enumerate(prepared) if p.syntax]
    runs = (pool or get_pool()).map(
        [(prepared[i].code, prepared[i].tests.test_list, prepared[i].tests.setup_code) for i in runnable]
    ) if runnable else []
    by_index = dict(zip(runnable, runs))
    return [_result(p, by_index.get(i)) for i, p in enumerate(prepared)]
