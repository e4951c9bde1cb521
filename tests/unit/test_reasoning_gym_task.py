"""dataset.name=reasoning_gym: generators and their knobs, disjoint held-out rows, and the score_answer reward."""

from __future__ import annotations

import json
from functools import partial

import pytest
from run_configs import build_config

from verl_grpo.data import builder_for
from verl_grpo.data.prepare import build_rows
from verl_grpo.data.reasoning_gym import load_source
from verl_grpo.errors import ConfigError, DataError
from verl_grpo.rewards import compute_score, dataset_of
from verl_grpo.rewards.common import parse_response
from verl_grpo.rewards.reasoning_gym import WEIGHTS, final_answer

RG = ["dataset.name=reasoning_gym", "warm_start.enabled=false"]


rg_config = partial(build_config, *RG, env={})


def built(cfg):
    return build_rows(builder_for(cfg.dataset), load_source(cfg.dataset).read_records(), "SYS", "{question}", cfg)


def test_the_default_is_chain_sum_named_rg_and_test_seeds_are_disjoint_from_train():
    cfg = rg_config()
    rg = cfg.dataset.reasoning_gym
    assert [t.name for t in rg.tasks] == ["chain_sum"] and cfg.task == "rg-chain-sum"
    assert rg.held_out_seed >= rg.seed + rg.train_size
    with pytest.raises(ConfigError, match="test_seed=100 makes held-out rows reuse the train rows' seeds 0..2001"):
        rg_config("dataset.reasoning_gym.test_seed=100")
    with pytest.raises(ConfigError, match="seed, size come from dataset.reasoning_gym"):
        rg_config("dataset.reasoning_gym.tasks=[{name: chain_sum, config: {seed: 3, size: 9}}]")
    with pytest.raises(ConfigError, match="names a generator twice"):
        rg_config("dataset.reasoning_gym.tasks=[chain_sum, chain_sum]")
    assert rg_config("dataset.reasoning_gym.tasks=[leg_counting]").task == "rg-leg-counting"


def test_rows_are_the_generators_entries_and_a_held_out_row_never_asks_a_train_question():
    cfg = rg_config("dataset.reasoning_gym.train_size=300", "dataset.reasoning_gym.test_size=200",
                    "dataset.val_size=20")
    out = built(cfg)
    train_questions = {r["prompt"][-1]["content"] for r in out.splits["train"] + out.splits["val"]}
    test_questions = [r["prompt"][-1]["content"] for r in out.splits["test"]]
    assert not train_questions & set(test_questions)
    in_train = [r for r in out.rejected if r["reason"] == "in_train"]
    repeated = [r for r in out.rejected if r["reason"] == "duplicate_question"]
    assert in_train and len(in_train) + len(repeated) + len(test_questions) == 200
    assert {r["split"] for r in in_train + repeated} == {"test"} and len(set(test_questions)) == len(test_questions)
    row = out.splits["test"][0]
    entry = json.loads(row["reward_model"]["ground_truth"])
    assert row["data_source"] == "reasoning_gym/chain_sum" and entry["metadata"]["source_dataset"] == "chain_sum"
    assert row["extra_info"]["answer"] == entry["answer"]
    assert compute_score(row["data_source"], f"<think>x</think><answer>{entry['answer']}</answer>",
                         row["reward_model"]["ground_truth"])["score"] == 1.0


def test_a_weighted_mixture_draws_rows_from_each_generator():
    cfg = rg_config("dataset.reasoning_gym.tasks=[{name: chain_sum, weight: 3}, {name: leg_counting, weight: 1}]",
                    "dataset.reasoning_gym.train_size=200", "dataset.reasoning_gym.test_size=40", "dataset.val_size=0")
    sources = [r["data_source"] for r in built(cfg).splits["train"]]
    counts = {s: sources.count(s) for s in set(sources)}
    assert set(counts) == {"reasoning_gym/chain_sum", "reasoning_gym/leg_counting"}
    assert counts["reasoning_gym/chain_sum"] > 2 * counts["reasoning_gym/leg_counting"]
    assert cfg.task == "rg-chain-sum-leg-counting"


@pytest.mark.parametrize("override, message", [
    ("dataset.reasoning_gym.tasks=[chain_summ]", r"tasks\[0\].name='chain_summ' is no reasoning-gym generator"),
    ("dataset.reasoning_gym.tasks=[{name: chain_sum, config: {max_term: 3}}]",
     r"tasks\[0\].config: chain_sum has no knob max_term \(its knobs: min_terms, max_terms"),
    ("dataset.reasoning_gym.tasks=[{name: chain_sum, config: {min_terms: 5, max_terms: 2}}]",
     r"reasoning-gym rejects the config .*fix the generator's knobs"),
])
def test_an_unknown_generator_or_knob_fails_in_one_line(override, message):
    with pytest.raises(DataError, match=message):
        load_source(rg_config(override).dataset)


GT = json.dumps({"answer": "28", "metadata": {"source_dataset": "chain_sum"}})


@pytest.mark.parametrize("response, correct, block", [
    ("<think>69 - 41</think><answer>28</answer>", 1.0, 1.0),
    ("28", 1.0, 0.0),                             # a final line with one number states the answer
    ("The answer is 28.", 1.0, 0.0),
    ("<answer>27</answer>", 0.0, 1.0),
    ("<answer>28</answer> or <answer>27</answer>", 0.0, 0.0),  # two different answers: never rewarded
    ("69 - 41 = 28", 1.0, 0.0),                    # a final line ending an equation states its result
    ("69 - 41 = 27 + 1", 0.0, 0.0),                # ... an expression states none
])
def test_chain_sum_is_scored_by_its_score_answer_under_the_shared_answer_rules(response, correct, block):
    result = compute_score("reasoning_gym/chain_sum", response, GT)
    assert (result["correctness"], result["answer_block"], result["acc"]) == (correct, block, correct)
    assert set(WEIGHTS) <= set(result) and dataset_of("reasoning_gym/chain_sum") == "reasoning_gym"


def test_a_text_answer_is_read_from_the_block_or_the_final_line():
    assert final_answer(parse_response("<think>a</think><answer> Paris </answer>"), "Paris") == "Paris"
    assert final_answer(parse_response("It is\nParis"), "Paris") == "Paris"
    assert final_answer(parse_response("<answer>Paris</answer><answer>Rome</answer>"), "Paris") is None
    gt = json.dumps({"answer": "4", "metadata": {"source_dataset": "leg_counting"}})
    assert compute_score("reasoning_gym/leg_counting", "<answer>4</answer>", gt)["acc"] == 1.0
    with pytest.raises(DataError, match="generator's entry as JSON"):
        compute_score("reasoning_gym/chain_sum", "<answer>4</answer>", "4")
