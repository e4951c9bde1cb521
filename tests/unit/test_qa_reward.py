"""QA exact-match reward: SQuAD normalisation (checked against verl's), EM/subEM, gold forms, hedges, dispatch."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from verl_grpo.errors import DataError
from verl_grpo.rewards import WEIGHTS, compute_score as dispatch, dataset_of, qa
from verl_grpo.rewards.qa import compute_score, extract_answer, gold_answers, is_match, normalize_answer
from verl_grpo.rewards.trl_adapter import trl_reward_functions

REPO = Path(__file__).resolve().parents[2]
GOOD = "<think>The passage names the team.</think>\n<answer>Denver Broncos</answer>"
GOLD = {"target": ["Denver Broncos", "Broncos"]}


def fmt(answer: str) -> str:
    return f"<think>Look it up.</think>\n<answer>{answer}</answer>"


@pytest.fixture(scope="module")
def verl_qa():
    from verl.utils.reward_score import search_r1_like_qa_em

    return search_r1_like_qa_em


NORMALISATION_CASES = [
    "Denver Broncos",
    "the Denver Broncos",
    "THE DENVER BRONCOS.",
    "  Denver   Broncos \n",
    "A cat",
    "an apple a day",
    "The Theater",
    "anthem",
    "Thea the theologian",
    "a-b-c",
    "U.S.A.",
    "O'Neill",
    "$1,000,000",
    "3.14",
    "50%",
    "(a) the answer",
    "\"quoted\"",
    "semi;colon: separated",
    "tab\tseparated\twords",
    "new\nline",
    "Café",
    "naïve résumé",
    "Ümlaut ÄÖÜ",
    "İstanbul",
    "ß Straße",
    "Σίσυφος",
    "北京",
    "東京 タワー",
    "em—dash – en dash",
    "“curly quotes”",
    "‘single’",
    "non\u00a0breaking space",
    "zero\u200bwidth",
    "",
    "   ",
    "the",
    "a an the",
    "!!!",
    "A.N.T.H.E.",
    "The_underscore_case",
    "1st, 2nd & 3rd",
    "Ⅻ roman",
    "ﬁ ligature",
]


def test_normalisation_equals_verls(verl_qa):
    assert len(NORMALISATION_CASES) >= 30
    for text in NORMALISATION_CASES:
        assert normalize_answer(text) == verl_qa.normalize_answer(text), text


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("The  Denver Broncos!", "denver broncos"),
        ("an Apple, a day", "apple day"),
        ("U.S.A.", "usa"),
        ("Thea the theologian", "thea theologian"),
        ("“curly”", "“curly”"),  # only ASCII punctuation is dropped, as in SQuAD
    ],
)
def test_normalisation_values(text, normalized):
    assert normalize_answer(text) == normalized


@pytest.mark.parametrize(
    ("pred", "golds", "em", "subem"),
    [
        ("Denver Broncos", ["Denver Broncos"], True, True),
        ("the denver broncos.", ["Denver Broncos"], True, True),
        ("The Denver Broncos team", ["Denver Broncos"], False, True),
        ("Broncos", ["Denver Broncos"], False, False),
        ("Carolina Panthers", ["Denver Broncos", "Carolina Panthers"], True, True),
        ("1,000", ["1000"], True, True),
        ("party", ["art"], False, True),  # subem is a plain substring test, as verl's
        ("Paris", ["London"], False, False),
    ],
)
def test_em_and_subem_verdicts(pred, golds, em, subem):
    assert is_match(pred, golds, "em") is em
    assert is_match(pred, golds, "subem") is subem
    assert compute_score(fmt(pred), golds)["correctness"] == float(em)
    assert compute_score(fmt(pred), golds, match="subem")["correctness"] == float(subem)


@pytest.mark.parametrize(
    "ground_truth",
    [
        {"target": ["Denver Broncos", "Broncos"]},
        {"target": ("Denver Broncos",)},
        {"target": "Denver Broncos"},
        ["Broncos", "Denver Broncos"],
        json.dumps({"target": ["Denver Broncos"]}),
        json.dumps(["Denver Broncos"]),
        "Denver Broncos",
        "the denver broncos",
    ],
)
def test_accepted_ground_truth_forms(ground_truth):
    assert compute_score(GOOD, ground_truth)["correctness"] == 1.0


def test_gold_answers_values():
    assert gold_answers('{"target": ["a b", "", "c"]}') == ["a b", "c"]
    assert gold_answers('["x"]') == ["x"]
    assert gold_answers('"quoted"') == ['"quoted"']  # a JSON string scalar is a plain answer
    assert gold_answers("1984") == ["1984"]


class _FakeArray:
    """What pandas hands verl for a list cell: an object with tolist()."""

    def tolist(self):
        return ["Denver Broncos"]


def test_array_target_from_a_parquet_row():
    assert compute_score(GOOD, {"target": _FakeArray()})["correctness"] == 1.0


@pytest.mark.parametrize(
    "ground_truth",
    [None, 3, {"answers": ["x"]}, {"target": []}, [], ["", "  "], ["the"], {"target": [1, 2]}, '{"target": []}',
     "", {"target": None}],
)
def test_unusable_ground_truth_is_a_data_error(ground_truth):
    with pytest.raises(DataError, match=r"reward_model\.ground_truth.*accepted: a dict with 'target'.*list of answer "
                                        r"strings.*JSON string.*plain answer string"):
        compute_score(GOOD, ground_truth)


@pytest.mark.parametrize(
    ("response", "pred", "correct"),
    [
        ("<think>t</think><answer>Paris</answer><answer>London</answer>", "", 0.0),
        ("<think>t</think><answer>London</answer><answer>Paris</answer>", "", 0.0),
        ("<think>t</think><answer>Paris</answer> or maybe <answer>the paris.</answer>", "Paris", 1.0),
        ("<think>t</think><answer>Paris</answer><answer> </answer>", "", 0.0),
        ("<think>maybe <answer>London</answer>?</think><answer>Paris</answer>", "Paris", 1.0),
        ("<think>t</think>Paris", "", 0.0),
        ("<think>t</think><answer>The</answer>", "", 0.0),
    ],
)
def test_hedged_and_missing_answers(response, pred, correct):
    assert extract_answer(response) == (pred or None)
    result = compute_score(response, ["Paris"])
    assert (result["pred"], result["correctness"], result["acc"]) == (pred, correct, correct)
    assert compute_score(response, ["Paris"], match="subem")["correctness"] == correct


def test_weights_table():
    assert qa.WEIGHTS == {"correctness": 0.7, "strict_format": 0.15, "thinking": 0.1, "answer_block": 0.05}
    assert WEIGHTS["squad"] is qa.WEIGHTS and WEIGHTS["nq_hotpotqa"] is qa.WEIGHTS


def test_perfect_response_scores_one():
    assert compute_score(GOOD, GOLD) == {
        "score": 1.0, "correctness": 1.0, "strict_format": 1.0, "thinking": 1.0, "answer_block": 1.0, "acc": 1.0,
        "pred": "Denver Broncos",
    }


def test_correct_answer_without_think_block():
    # strict_format needs the <think>…</think><answer>…</answer> layout, so only correctness and answer_block pay.
    result = compute_score("<answer>Denver Broncos</answer>", GOLD)
    assert (result["score"], result["strict_format"], result["thinking"], result["answer_block"]) == (0.75, 0, 0, 1)


@pytest.mark.parametrize(
    ("answer", "strict", "score"),
    [
        ("Denver\nBroncos", 0.0, 0.15),
        (" ".join(["word"] * 20), 1.0, 0.3),
        (" ".join(["word"] * 21), 0.0, 0.15),
    ],
)
def test_strict_format_wants_one_short_line(answer, strict, score):
    result = compute_score(fmt(answer), ["something else"])
    assert (result["strict_format"], result["score"]) == (strict, score)


def test_multiline_correct_answer_pays_correctness_but_not_strict_format():
    result = compute_score(fmt("Denver\nBroncos"), GOLD)
    assert (result["correctness"], result["strict_format"], result["score"]) == (1.0, 0.0, 0.85)


def test_wrong_answer_in_perfect_layout():
    assert compute_score(fmt("Carolina Panthers"), GOLD)["score"] == 0.3


def test_bad_match_mode_is_a_value_error():
    with pytest.raises(ValueError, match=r"qa_match must be one of em, subem, got 'exact'"):
        compute_score(GOOD, GOLD, match="exact")
    with pytest.raises(ValueError, match="qa_match"):
        dispatch("squad", GOOD, GOLD, qa_match="")


@pytest.mark.parametrize(
    ("source", "dataset"),
    [
        ("squad", "squad"),
        ("rajpurkar/squad", "squad"),
        ("searchR1_nq", "nq_hotpotqa"),
        ("searchR1_hotpotqa", "nq_hotpotqa"),
        ("searchR1_triviaqa", "nq_hotpotqa"),
        ("searchR1_my_new_set", "nq_hotpotqa"),
        ("nq_hotpotqa", "nq_hotpotqa"),
    ],
)
def test_qa_data_sources(source, dataset):
    assert dataset_of(source) == dataset


def test_unknown_source_message_mentions_the_search_r1_prefix():
    with pytest.raises(ValueError, match=r"unknown data_source 'searchR1_'.*squad.*searchR1_<name>"):
        dataset_of("searchR1_")


def test_dispatch_searchr1_row_with_verls_ground_truth():
    result = dispatch("searchR1_nq", GOOD, {"target": ["denver broncos"]}, extra_info={"index": 0})
    assert (result["score"], result["pred"]) == (1.0, "Denver Broncos")
    hedge = "<think>t</think><answer>Broncos</answer><answer>Denver Broncos team</answer>"
    assert dispatch("searchR1_nq", hedge, GOLD)["correctness"] == 0.0


def test_match_mode_reaches_the_scorer_and_other_datasets_ignore_it():
    response = fmt("the Denver Broncos football team")
    assert dispatch("squad", response, GOLD)["correctness"] == 0.0
    assert dispatch("squad", response, GOLD, qa_match="em")["correctness"] == 0.0
    assert dispatch("squad", response, GOLD, qa_match="subem")["correctness"] == 1.0
    assert dispatch("gsm8k", "<think>t</think><answer>18</answer>", "18", qa_match="subem")["score"] == 1.0


def test_verl_entry_passes_reward_kwargs():
    spec = importlib.util.spec_from_file_location("verl_entry_file", REPO / "verl_grpo/rewards/verl_entry.py")
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    # verl's reward manager: compute_score(data_source=, solution_str=, ground_truth=, extra_info=, **reward_kwargs)
    result = entry.compute_score(data_source="searchR1_hotpotqa", solution_str=fmt("Broncos of Denver, Denver Broncos"),
                                 ground_truth={"target": ["Denver Broncos"]}, extra_info={"index": 1}, qa_match="subem")
    assert (result["correctness"], result["score"]) == (1.0, 1.0)
    result = entry.compute_score(data_source="searchR1_hotpotqa", solution_str=fmt("Broncos of Denver, Denver Broncos"),
                                 ground_truth={"target": ["Denver Broncos"]}, extra_info={"index": 1})
    assert (result["correctness"], result["score"]) == (0.0, 0.3)


def test_trl_functions_for_qa():
    funcs, weights = trl_reward_functions("searchR1_nq")
    assert [f.__name__ for f in funcs] == ["correctness", "strict_format", "thinking", "answer_block"]
    assert weights == [0.7, 0.15, 0.1, 0.05]
    completions = [[{"role": "assistant", "content": GOOD}], [{"role": "assistant", "content": fmt("Panthers")}]]
    per_func = [f(prompts=["q", "q"], completions=completions, data_source=["squad", "searchR1_nq"],
                  reward_model=[{"ground_truth": json.dumps(GOLD)}, {"ground_truth": GOLD}]) for f in funcs]
    assert per_func == [[1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]


def test_reward_modules_import_neither_torch_nor_verl():
    script = ("import sys, verl_grpo.rewards, verl_grpo.rewards.qa, verl_grpo.rewards.verl_entry, "
              "verl_grpo.rewards.trl_adapter\n"
              "print(sorted(m for m in ('torch', 'verl') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
