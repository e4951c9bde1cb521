"""Open-domain QA (SQuAD, Search-R1's NQ/HotpotQA/...): the final answer against the gold answers, exact match.

Normalisation is SQuAD's, as verl's `search_r1_like_qa_em` has it: lowercase, drop ASCII punctuation, drop the
articles a/an/the, collapse whitespace. `match="em"` wants the normalized answer to equal a normalized gold answer;
`match="subem"` wants a normalized gold answer to occur in it (verl's `compute_score_subem`).

The final answer is stated by the answer blocks (closed <think> blocks left out, see rewards.answers). When they
state different normalized answers the response is incorrect, so hedging over several blocks never pays. verl
instead takes the last block and quarters the score past 10 answer tags; here repeating an agreeing block gains
nothing (it costs answer_block and strict_format), so no such cap is needed.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping
from typing import Any

from verl_grpo.errors import DataError
from verl_grpo.rewards.answers import answer_blocks, answer_regions
from verl_grpo.rewards.common import (
    answer_block_score,
    check_weights,
    parse_response,
    thinking_score,
    weighted_total,
)

WEIGHTS: dict[str, float] = {
    "correctness": 0.7,
    "strict_format": 0.15,
    "thinking": 0.1,
    "answer_block": 0.05,
}
check_weights(WEIGHTS, "qa")

MATCH_MODES = ("em", "subem")
MAX_ANSWER_WORDS = 20
"""strict_format wants a short answer: one line of at most this many words."""

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
_ACCEPTED_GOLD = (
    "a dict with 'target' (a list of answer strings, or one string), a list of answer strings, a JSON string of "
    "either, or a plain answer string"
)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation, step for step as verl's `normalize_answer`."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def check_match(match: str) -> None:
    if match not in MATCH_MODES:
        raise ValueError(f"qa_match must be one of {', '.join(MATCH_MODES)}, got {match!r}")


def gold_answers(ground_truth: Any) -> list[str]:
    """The gold answers in any accepted form; DataError naming reward_model.ground_truth otherwise.

    Gold answers that normalize to nothing ('', 'the', '...') are dropped: under subem they would match anything.
    """
    value = _decode_json(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if isinstance(value, Mapping):
        if "target" not in value:
            raise _gold_error(ground_truth, "the dict has no 'target'")
        value = value["target"]
    if isinstance(value, str):
        value = [value]
    elif hasattr(value, "tolist") and not isinstance(value, (list, tuple)):  # a numpy array from a parquet row
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(isinstance(g, str) for g in value):
        raise _gold_error(ground_truth, "not a list of strings")
    golds = [g for g in value if normalize_answer(g)]
    if not golds:
        raise _gold_error(ground_truth, "no non-empty gold answer")
    return golds


def _decode_json(text: str) -> Any:
    """A JSON dict or list in the string, else the string itself (a plain answer)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, (dict, list)) else text


def _gold_error(ground_truth: Any, why: str) -> DataError:
    return DataError(f"qa reward_model.ground_truth {ground_truth!r:.120} is unusable ({why}); accepted: "
                     f"{_ACCEPTED_GOLD}")


def stated_answers(text: str) -> list[str]:
    """Every answer block's content, stripped, from the first region of `text` that has any (see rewards.answers)."""
    for region in answer_regions(text):
        blocks = answer_blocks(region)
        if blocks:
            return [b.strip() for b in blocks]
    return []


def extract_answer(text: str) -> str | None:
    """The one final answer (the first block's text); None when there is none, an empty one, or two different ones
    after normalisation."""
    answers = stated_answers(text)
    normalized = {normalize_answer(a) for a in answers}
    if len(normalized) != 1 or "" in normalized:
        return None
    return answers[0]


def is_match(prediction: str, golds: list[str], match: str = "em") -> bool:
    """verl's em_check / subem_check verdict."""
    check_match(match)
    pred = normalize_answer(prediction)
    if match == "em":
        return any(normalize_answer(g) == pred for g in golds)
    return any(normalize_answer(g) in pred for g in golds)


def is_short_line(answer: str | None) -> bool:
    return bool(answer) and "\n" not in answer and len(answer.split()) <= MAX_ANSWER_WORDS


def compute_score(solution_str: str, ground_truth: Any, match: str = "em") -> dict:
    """verl-style result: `score`, the components, `acc` and `pred`."""
    check_match(match)
    golds = gold_answers(ground_truth)
    r = parse_response(solution_str)
    pred = extract_answer(solution_str)
    components = {
        "correctness": 1.0 if pred is not None and is_match(pred, golds, match) else 0.0,
        "strict_format": 1.0 if r.layout_ok and is_short_line(r.answer) else 0.0,
        "thinking": thinking_score(r),
        "answer_block": answer_block_score(r),
    }
    return {
        "score": weighted_total(components, WEIGHTS),
        **components,
        "acc": components["correctness"],
        "pred": pred or "",
    }
