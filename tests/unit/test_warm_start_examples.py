"""The warm start's SFT examples: each dataset's reference solutions, rewritten, earn the rewards' full marks."""

from __future__ import annotations

import itertools

import pytest

from verl_grpo.data import gsm8k, math_, mbpp
from verl_grpo.data.schema import RowRejected, verl_row
from verl_grpo.data.warm_start import gsm8k_response, select_examples
from verl_grpo.errors import DataError
from verl_grpo.rewards.scoring import WEIGHTS, compute_scores

BUILDERS = {"gsm8k": gsm8k.BUILDER, "math": math_.BUILDER, "mbpp": mbpp.BUILDER}


def rows_of(dataset: str, mirror, n: int) -> list[dict]:
    builder = BUILDERS[dataset]
    rows = []
    for record in builder.read_mirror(mirror / dataset):
        try:
            problem = builder.to_problem(record)
        except RowRejected:
            continue
        rows.append(verl_row(dataset, builder.ability, [{"role": "user", "content": problem.question}], problem,
                             "train", len(rows)))
        if len(rows) == n:
            return rows
    return rows


@pytest.mark.parametrize("dataset", ["gsm8k", "math", "mbpp"])
def test_rewritten_solutions_earn_every_component(dataset, data_mirror):
    rows = rows_of(dataset, data_mirror, 40)
    picked = select_examples(dataset, rows, 12, fits=lambda text: True,
                             score=lambda texts, truths: compute_scores(dataset, texts, truths))
    assert len(picked) == 12
    truths = {r["extra_info"]["uid"]: r["reward_model"]["ground_truth"] for r in rows}
    for example, result in zip(picked, compute_scores(dataset, [e.response for e in picked],
                                                      [truths[e.uid] for e in picked])):
        assert result["score"] == pytest.approx(1.0)
        assert all(result[c] == pytest.approx(1.0) for c in WEIGHTS[dataset]), result
        assert example.response.startswith("<think>\n") and example.response.endswith("</answer>")


def test_most_gsm8k_solutions_qualify_and_lose_their_calculator_notes(data_mirror):
    rows = rows_of("gsm8k", data_mirror, 50)
    picked = select_examples("gsm8k", rows, 50, fits=lambda text: True,
                             score=lambda texts, truths: compute_scores("gsm8k", texts, truths))
    assert len(picked) >= 45  # the rewrite matches what the scorer asks for, not a lucky few
    assert not any("<<" in e.response for e in picked)
    assert "<<" in rows[0]["extra_info"]["answer"] and "<<" not in gsm8k_response(rows[0]["extra_info"], "72")


def test_the_length_budget_is_honoured_and_nothing_fitting_is_one_clear_error(data_mirror):
    rows = rows_of("gsm8k", data_mirror, 60)
    short = select_examples("gsm8k", rows, 10, fits=lambda text: len(text) <= 200,
                            score=lambda texts, truths: compute_scores("gsm8k", texts, truths))
    assert short and all(len(e.response) <= 200 for e in short)
    with pytest.raises(DataError, match="warm_start.max_response_tokens"):
        select_examples("gsm8k", rows, 10, fits=lambda text: False,
                        score=lambda texts, truths: compute_scores("gsm8k", texts, truths))


def test_examples_follow_the_given_order(data_mirror):
    rows = rows_of("gsm8k", data_mirror, 30)
    picked = select_examples("gsm8k", list(reversed(rows)), 5, fits=lambda text: True,
                             score=lambda texts, truths: compute_scores("gsm8k", texts, truths))
    order = [r["extra_info"]["uid"] for r in reversed(rows)]
    assert [order.index(e.uid) for e in picked] == sorted(order.index(e.uid) for e in picked)
    assert len(set(e.uid for e in picked)) == 5
    assert list(itertools.islice((e.prompt for e in picked), 1))[0][0]["role"] == "user"
