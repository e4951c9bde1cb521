"""reasoning-gym tasks: the library's own `score_answer` on the response's final answer, under the format rules of
every task here.

The final answer is read as for the other tasks (rewards.answers): a numeric oracle answer (chain_sum, basic
arithmetic, gsm_symbolic, ...) as GSM8K's, every statement (answer blocks, `####`, `\\boxed{}`, "the answer is",
a final line with one number) giving the same value; any other answer from the answer blocks (all the same text),
else the "the answer is" phrase, else the final line. `score_answer(answer, entry)` of the row's generator judges
it (1.0 right; some generators give partial credit); `acc` is 1 only for full credit. The format components and
their weights are GSM8K's.

The ground truth is the generator's entry as JSON, `{"answer", "metadata"}` (verl_grpo.data.reasoning_gym).
"""

from __future__ import annotations

import json
import re
import warnings
from functools import cache
from typing import Any

from verl_grpo.errors import DataError
from verl_grpo.rewards import gsm8k
from verl_grpo.rewards.answers import answer_blocks, answer_is_phrases, answer_regions, final_line
from verl_grpo.rewards.common import Response, layout_components, parse_response, weighted_total

WEIGHTS: dict[str, float] = dict(gsm8k.WEIGHTS)
"""GSM8K's table: the same response layout (reasoning, then one answer block, nothing after it) scored the same way."""

LIBRARY = "reasoning-gym"
"""The PyPI distribution that generates and scores these tasks."""


def library():
    """reasoning_gym, imported on first use (a few seconds); DataError naming the package when it is not installed."""
    try:
        with warnings.catch_warnings():  # one of its dependencies (cellpylib) trips SyntaxWarnings when compiled
            warnings.simplefilter("ignore", SyntaxWarning)
            import reasoning_gym
    except ImportError:
        raise DataError(f"dataset.name=reasoning_gym needs the package {LIBRARY}; install it (pip install "
                        f"{LIBRARY}) or train on another dataset.name") from None
    return reasoning_gym


_NUMERIC = re.compile(r"-?\d+(?:\.\d+)?")


def parse_entry(ground_truth: Any) -> dict[str, Any]:
    """The generator's entry (`answer`, `metadata.source_dataset`); DataError for anything else."""
    entry = ground_truth
    if isinstance(ground_truth, str):
        try:
            entry = json.loads(ground_truth)
        except json.JSONDecodeError:
            entry = None
    if not isinstance(entry, dict) or "answer" not in entry or not isinstance(entry.get("metadata"), dict):
        raise DataError(f"reasoning_gym ground_truth must be the generator's entry as JSON "
                        f"({{\"answer\", \"metadata\"}}), got {str(ground_truth)[:80]!r}; prepare the dataset again")
    return entry


@cache
def score_answer_of(generator: str):
    """The generator's `score_answer` (made once per process: some generators load word lists)."""
    library()  # first: its import keeps the library's compile warnings quiet
    from reasoning_gym.factory import get_score_answer_fn

    try:
        return get_score_answer_fn(generator)
    except ValueError:
        raise DataError(f"reasoning_gym row names generator {generator!r}, which this reasoning-gym has not; "
                        "install the version the dataset was generated with") from None


def final_answer(r: Response, oracle: str) -> str | None:
    """The response's one final answer as text; None when it states none or two different ones."""
    text = r.text
    if _NUMERIC.fullmatch(oracle.strip().replace(",", "")):
        return gsm8k.format_value(gsm8k.extract_answer(r)) or None
    for region in answer_regions(text):
        blocks = {b.strip() for b in answer_blocks(region)}
        if blocks:
            return blocks.pop() if len(blocks) == 1 else None
        phrases = {p.strip().rstrip(".") for p in answer_is_phrases(region) if p.strip()}
        if phrases:
            return phrases.pop() if len(phrases) == 1 else None
    return final_line(text)


def compute_score(solution_str: str, ground_truth: Any) -> dict:
    """verl-style result: `score`, the components, `acc` and `pred`."""
    entry = parse_entry(ground_truth)
    generator = str(entry["metadata"].get("source_dataset") or "")
    r = parse_response(solution_str)
    pred = final_answer(r, str(entry["answer"]))
    try:
        judged = float(score_answer_of(generator)(pred, entry)) if pred is not None else 0.0
    except Exception:  # noqa: BLE001 - a generator's scorer may choke on an odd answer: that answer is wrong
        judged = 0.0
    correctness = min(1.0, max(0.0, judged))
    components = {"correctness": correctness, **layout_components(r, answer_fits=True)}
    return {"score": weighted_total(components, WEIGHTS), **components, "acc": 1.0 if correctness >= 1.0 else 0.0,
            "pred": pred or ""}
