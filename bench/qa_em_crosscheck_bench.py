"""QA exact-match cross-check: our `rewards.qa` correctness verdicts vs verl's `search_r1_like_qa_em`.

A fixed set of (response, gold answers) cases over the normalisation corners (case, punctuation, articles,
whitespace, unicode), several answer blocks (agreeing and disagreeing), no answer block, more than 10 answer tags,
substring matches and multi-gold lists. For each: our verdict under em and subem vs verl's `compute_score` /
`compute_score_subem` (format_score=0, so a score > 0 is a correct verdict). Writes bench/results/qa_em_crosscheck.md
and prints it.

Run: `python bench/qa_em_crosscheck_bench.py` (seconds; most of it importing verl).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from verl.utils.reward_score import search_r1_like_qa_em as verl_qa

from verl_grpo.errors import DataError
from verl_grpo.rewards import qa

RESULTS = Path(__file__).resolve().parent / "results" / "qa_em_crosscheck.md"


def fmt(*answers: str, think: str = "Search, then read the passage.") -> str:
    return f"<think>{think}</think>\n" + "".join(f"<answer>{a}</answer>" for a in answers)


CASES: list[tuple[str, str, list[str]]] = [
    ("exact", fmt("Denver Broncos"), ["Denver Broncos"]),
    ("lowercase", fmt("denver broncos"), ["Denver Broncos"]),
    ("uppercase", fmt("DENVER BRONCOS"), ["Denver Broncos"]),
    ("leading article 'the'", fmt("The Denver Broncos"), ["Denver Broncos"]),
    ("article 'a' in gold", fmt("cat"), ["a cat"]),
    ("article 'an' mid-answer", fmt("an apple a day"), ["apple day"]),
    ("'the' inside a word", fmt("Theater"), ["ater"]),
    ("trailing full stop", fmt("Paris."), ["Paris"]),
    ("inner punctuation", fmt("U.S.A."), ["USA"]),
    ("apostrophe", fmt("ONeill"), ["O'Neill"]),
    ("hyphen dropped, not spaced", fmt("well known"), ["well-known"]),
    ("hyphen vs joined", fmt("wellknown"), ["well-known"]),
    ("comma in number", fmt("1,000"), ["1000"]),
    ("currency and percent", fmt("$50%"), ["50"]),
    ("extra whitespace", fmt("  Denver \n  Broncos  "), ["Denver Broncos"]),
    ("tab inside", fmt("Denver\tBroncos"), ["Denver Broncos"]),
    ("wrong answer", fmt("Carolina Panthers"), ["Denver Broncos"]),
    ("partial answer", fmt("Broncos"), ["Denver Broncos"]),
    ("multi-gold, second", fmt("Broncos"), ["Denver Broncos", "Broncos"]),
    ("multi-gold, none", fmt("Panthers"), ["Denver Broncos", "Broncos"]),
    ("subem: gold inside longer answer", fmt("the Denver Broncos football team"), ["Denver Broncos"]),
    ("subem: gold inside a word", fmt("party"), ["art"]),
    ("subem: prediction inside gold", fmt("Denver"), ["Denver Broncos"]),
    ("subem: multi-gold", fmt("Super Bowl 50 went to the Broncos"), ["Denver Broncos", "Broncos"]),
    ("unicode accent kept", fmt("Café"), ["Cafe"]),
    ("unicode same accent", fmt("café"), ["Café"]),
    ("unicode casefold İ", fmt("istanbul"), ["İstanbul"]),
    ("unicode CJK", fmt("北京"), ["北京"]),
    ("unicode curly quotes", fmt("“Paris”"), ["Paris"]),
    ("unicode em dash", fmt("1914—1918"), ["1914 1918"]),
    ("no answer block", "<think>t</think>\nThe answer is Denver Broncos.", ["Denver Broncos"]),
    ("unclosed answer block", "<think>t</think>\n<answer>Denver Broncos", ["Denver Broncos"]),
    ("empty answer block", fmt(""), ["Denver Broncos"]),
    ("no think block", "<answer>Denver Broncos</answer>", ["Denver Broncos"]),
    ("two blocks agree", fmt("Denver Broncos", "the denver broncos."), ["Denver Broncos"]),
    ("two blocks disagree, last right", fmt("Carolina Panthers", "Denver Broncos"), ["Denver Broncos"]),
    ("two blocks disagree, first right", fmt("Denver Broncos", "Carolina Panthers"), ["Denver Broncos"]),
    ("two blocks, both gold answers", fmt("Broncos", "Denver Broncos"), ["Denver Broncos", "Broncos"]),
    ("empty block then answer", fmt("", "Denver Broncos"), ["Denver Broncos"]),
    ("answer tried in think", fmt("Denver Broncos", think="<answer>Panthers</answer>? No."), ["Denver Broncos"]),
    ("only answer is in think", "<think>so <answer>Denver Broncos</answer></think>", ["Denver Broncos"]),
    ("11 agreeing answer tags", fmt(*["Denver Broncos"] * 11), ["Denver Broncos"]),
    ("11 answer tags, last right", fmt(*["Panthers"] * 10, "Denver Broncos"), ["Denver Broncos"]),
    ("10 answer tags, agreeing", fmt(*["Denver Broncos"] * 10), ["Denver Broncos"]),
    ("search-r1 multi-turn", "<think>who won</think><search>super bowl 50</search><information>Doc 1: Denver "
     "Broncos beat the Carolina Panthers.</information><think>found</think><answer>Denver Broncos</answer>",
     ["Denver Broncos"]),
    ("gold normalizes to nothing", fmt("a"), ["the"]),
]


def ours(response: str, golds: list[str], match: str) -> bool | None:
    """Our correctness verdict; None when our scorer rejects the gold answers (DataError)."""
    try:
        return qa.compute_score(response, {"target": golds}, match=match)["correctness"] == 1.0
    except DataError:
        return None


def verl_score(response: str, golds: list[str], match: str) -> float:
    score_fn = verl_qa.compute_score if match == "em" else verl_qa.compute_score_subem
    with contextlib.redirect_stdout(io.StringIO()):  # verl prints a debug dump on 1 call in 64
        return float(score_fn(response, {"target": golds}, format_score=0.0))


def disagreement_reason(response: str, golds: list[str]) -> str:
    if not any(qa.normalize_answer(g) for g in golds):
        return ("every gold answer normalizes to '': we reject the row (DataError, it would match anything under "
                "subem), verl compares normalized texts as they are")
    stated = {qa.normalize_answer(a) for a in qa.stated_answers(response)}
    if len(stated) > 1:
        return ("the answer blocks state different normalized answers (an empty block counts): we count the hedge "
                "incorrect, verl takes the last block")
    outside = qa.stated_answers(response)
    last = verl_qa.extract_solution(response)
    if outside and last is not None and qa.normalize_answer(outside[-1]) != qa.normalize_answer(last):
        return "an answer block inside <think> comes last: we read the blocks outside <think>, verl the last of all"
    return "unexplained"


def summary_line(agreeing: int, disagreements: list[tuple[str, str]]) -> str:
    by_reason: dict[str, list[str]] = {}
    for name, reason in disagreements:
        by_reason.setdefault(reason, []).append(name)
    parts = [f"{len(names)} × {reason} ({', '.join(repr(n) for n in names)})" for reason, names in by_reason.items()]
    return f"{agreeing} of {agreeing + len(disagreements)} agree" + (f"; disagreements: {'; '.join(parts)}."
                                                                     if parts else ".")


def verdict(value: bool | None) -> str:
    return {True: "✓", False: "✗", None: "DataError"}[value]


def verl_cell(score: float) -> str:
    return verdict(score > 0) + (f" ({score:g})" if score not in (0.0, 1.0) else "")


def cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "\\n").replace("\t", "\\t")


def main() -> None:
    rows, disagreements, quartered = [], [], []
    for name, response, golds in CASES:
        our_em, our_subem = ours(response, golds, "em"), ours(response, golds, "subem")
        verl_em, verl_subem = verl_score(response, golds, "em"), verl_score(response, golds, "subem")
        agree = our_em == (verl_em > 0) and our_subem == (verl_subem > 0)
        if not agree:
            disagreements.append((name, disagreement_reason(response, golds)))
        if agree and 0 < verl_em < 1:
            quartered.append((name, qa.compute_score(response, {"target": golds})["score"]))
        rows.append(f"| {name} | `{cell(response)}` | {cell(' / '.join(golds))} | {verdict(our_em)} | "
                    f"{verl_cell(verl_em)} | {verdict(our_subem)} | {verl_cell(verl_subem)} | "
                    f"{'yes' if agree else '**no**'} |")
    agreeing = len(CASES) - len(disagreements)
    out = [
        "# QA exact match: ours (`verl_grpo.rewards.qa`) vs verl (`search_r1_like_qa_em`)",
        "",
        f"{len(CASES)} fixed cases. Verdicts: ✓ correct, ✗ incorrect. verl's verdict is its score > 0 with "
        "format_score=0 (`compute_score` for em, `compute_score_subem` for subem); its score is shown when "
        "neither 0 nor 1. Ours is the `correctness` component with `match=\"em\"` / `\"subem\"`.",
        "",
        "| case | response | gold | our em | verl em | our subem | verl subem | agree? |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"**{summary_line(agreeing, disagreements)}**",
        "",
    ]
    out += [f"- {name}: verdicts agree, but verl quarters its score past 10 answer tags (em score 0.25) while we pay "
            f"full correctness and withhold answer_block and strict_format (our total {score:g})"
            for name, score in quartered]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(out) + "\n", encoding="utf-8")
    print("\n".join(out))


if __name__ == "__main__":
    main()
