"""The squad dataset: SQuAD v1.1 dev split by article, verl rows for the tool loop, Search-R1 ground truths, and the
warm start's search trajectories drawn from train articles only."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from verl_grpo.config import DatasetConfig, RunConfig
from verl_grpo.config.schema import ServicesConfig
from verl_grpo.data import load_split, prepare_dataset
from verl_grpo.data.schema import TOOL_AGENT
from verl_grpo.errors import DataError
from verl_grpo.rewards import compute_score
from verl_grpo.services.retrieval_index import load_squad
from verl_grpo.store import Store, strip_scheme

SQUAD_TRAIN_QUESTIONS, SQUAD_TEST_QUESTIONS = 8595, 1975


def squad_config(**dataset) -> RunConfig:
    return RunConfig(dataset=DatasetConfig(name="squad", **dataset), services=ServicesConfig(enabled=["retrieval"]))


@pytest.fixture(scope="module")
def prepared(data_mirror, tmp_path_factory):
    store = Store(f"file://{tmp_path_factory.mktemp('squad') / 'store'}")
    version = prepare_dataset(squad_config(val_size=100), store)
    return store, version, {split: load_split(version, split, store) for split in ("train", "val", "test")}


def test_split_by_article_counts_and_tool_agent_rows(prepared, data_mirror):
    store, version, splits = prepared
    assert version.counts == {"train": SQUAD_TRAIN_QUESTIONS - 100, "val": 100, "test": SQUAD_TEST_QUESTIONS}
    assert version.rejected == 0
    titles = {split: set(rows["extra_info"].map(lambda e: e["title"])) for split, rows in splits.items()}
    assert len(titles["test"]) == 9 and len(titles["train"]) == 39
    assert not titles["test"] & (titles["train"] | titles["val"])  # no question about a test article is trained on
    table = pq.read_table(strip_scheme(version.splits["test"]))
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info", "agent_name"]
    row = splits["test"].iloc[0]
    assert row["data_source"] == "squad" and row["ability"] == "qa" and row["agent_name"] == TOOL_AGENT
    assert row["extra_info"]["tools_kwargs"] == {"search": {"create_kwargs": {"data_source": "squad"}}}
    assert [m["role"] for m in row["prompt"]] == ["system", "user"] and "search" in row["prompt"][0]["content"]


def test_ground_truths_are_search_r1_targets_found_in_the_indexed_passage(prepared, data_mirror):
    _, _, splits = prepared
    passages = {p.id: p for p in load_squad(data_mirror / "squad" / "dev-v1.1.json")[0]}
    for rows in splits.values():
        for truth, extra in zip(rows["reward_model"].map(lambda r: json.loads(r["ground_truth"])), rows["extra_info"]):
            assert truth == {"target": list(extra["answers"])} and truth["target"]
            # each gold answer is a span of the paragraph the retrieval index holds under the row's passage_id
            assert all(gold in passages[extra["passage_id"]].text for gold in truth["target"]), extra
    # what the rows hold is what the reward reads: the first gold answer scores full marks
    row = splits["test"].iloc[3]
    gold = json.loads(row["reward_model"]["ground_truth"])["target"][0]
    response = f"<think>\nThe passage says so.\n</think>\n<answer>{gold}</answer>"
    assert compute_score(row["data_source"], response, row["reward_model"]["ground_truth"])["score"] == 1.0


def test_without_the_tool_rows_have_no_agent_fields(data_mirror, tmp_path):
    version = prepare_dataset(RunConfig(dataset=DatasetConfig(name="squad")), Store(f"file://{tmp_path}"))
    assert pq.read_table(strip_scheme(version.splits["val"])).column_names == [
        "data_source", "prompt", "ability", "reward_model", "extra_info"]


def test_bad_questions_are_quarantined_and_the_hub_is_refused(tmp_path):
    mirror = tmp_path / "squad"
    mirror.mkdir()
    paragraph = {"context": "Paris is the capital of France.", "qas": [
        {"id": "a", "question": "What is the capital of France?", "answers": [{"text": "Paris", "answer_start": 0}]},
        {"id": "b", "question": "  ", "answers": [{"text": "Paris", "answer_start": 0}]},
        {"id": "c", "question": "Which country?", "answers": []},
        {"id": "a", "question": "Again?", "answers": [{"text": "France", "answer_start": 24}]},
    ]}
    articles = [{"title": f"Article_{i}", "paragraphs": [paragraph]} for i in range(5)]
    (mirror / "dev-v1.1.json").write_text(json.dumps({"data": articles}))
    store = Store(f"file://{tmp_path / 'store'}")
    version = prepare_dataset(RunConfig(dataset=DatasetConfig(name="squad", mirror_dir=str(mirror), val_size=0)),
                              store)
    rejected = pq.read_table(strip_scheme(version.uri) + "/rejected.parquet").to_pylist()
    # article 0: b, c, the second a; articles 1-4 repeat all four (both a's are duplicates there)
    assert sorted(r["reason"] for r in rejected) == sorted(
        ["missing_question"] * 5 + ["missing_answer"] * 5 + ["duplicate_id"] * 9)
    assert version.counts == {"train": 1, "val": 0, "test": 0}  # the fifth article (the test one) held only repeats
    assert load_split(version, "train", store)["extra_info"][0]["title"] == "Article 0"

    with pytest.raises(DataError, match="dev-v1.1.json"):
        prepare_dataset(RunConfig(dataset=DatasetConfig(name="squad", source="hub")), store)


def test_warm_start_trajectories_come_from_train_articles_only(prepared):
    from verl_grpo.trainers.trl.warm_start import search_examples

    store, version, splits = prepared
    cfg = squad_config(val_size=100)
    spec = SimpleNamespace(cfg=cfg, dataset=version, store=store)
    examples = search_examples(spec, 400)
    train = set(splits["train"]["extra_info"].map(lambda e: e["question"].strip()))
    questions = {ex.prompt[-1]["content"].strip() for ex in examples if ex.completion.get("tool_calls")}
    assert len(questions) == 200 and questions <= train
