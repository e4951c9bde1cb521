"""The nq_hotpotqa dataset: Search-R1's hub parquet rows (PeterJinGo/nq_hotpotqa_train's schema) prepared from a
mirror and from a hub dataset dir alike, into verl rows tagged searchR1_<source> for the tool loop, scored by the
real reward dispatcher."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl_grpo.config import DatasetConfig, RunConfig
from verl_grpo.config.schema import ServicesConfig
from verl_grpo.data import load_split, prepare_dataset
from verl_grpo.data.schema import TOOL_AGENT
from verl_grpo.rewards import compute_score
from verl_grpo.store import Store, strip_scheme

RETRIEVER = "http://10.0.0.5:8000/retrieve"


def hub_row(i: int, question: str, source: str, target: list[str] | None, golden: list[str]) -> dict:
    """A row as the hub's parquet files hold it (verl's preprocess_search_r1_dataset.py reads these columns)."""
    truth = {"target": target} if target is not None else None
    return {"id": f"{source}_{i}", "question": question, "golden_answers": golden, "data_source": source,
            "prompt": [{"role": "user", "content": f"Answer the given question. Question: {question}"}],
            "ability": "fact-reasoning", "reward_model": {"ground_truth": truth, "style": "rule"},
            "extra_info": {"index": i, "split": "train"}, "metadata": None}


TRAIN = [
    hub_row(0, "who won super bowl 50", "nq", ["Denver Broncos"], ["Denver Broncos", "the Broncos"]),
    hub_row(1, "which city is the capital of poland", "hotpotqa", None, ["Warsaw"]),  # no target: golden_answers
    hub_row(2, "   ", "nq", ["Paris"], ["Paris"]),                                    # no question
    hub_row(3, "who wrote hamlet", "nq", [" "], ["", "the"]),                          # no answer the reward can match
    hub_row(4, "what river flows through cairo", "nq", ["Nile", "the Nile", "Nile"], ["Nile"]),
    hub_row(5, "who painted the mona lisa", "hotpotqa", ["Leonardo da Vinci"], []),
]
TEST = [hub_row(10, "what is the largest planet", "nq", ["Jupiter"], ["Jupiter"]),
        hub_row(11, "where was the 2012 summer olympics held", "hotpotqa", ["London"], ["London"])]


def nq_config(tool: bool = True, **dataset) -> RunConfig:
    services = ServicesConfig(enabled=["retrieval"], retrieval={"url": RETRIEVER}) if tool else ServicesConfig()
    return RunConfig(dataset=DatasetConfig(name="nq_hotpotqa", val_size=1, **dataset), services=services)


@pytest.fixture(scope="module")
def hub_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nq_hotpotqa")
    for split, rows in (("train", TRAIN), ("test", TEST)):
        pq.write_table(pa.Table.from_pylist(rows), folder / f"{split}.parquet")
    return folder


def _rows(version, store) -> dict[str, list[dict]]:
    return {split: load_split(version, split, store).to_dict("records") for split in ("train", "val", "test")}


def test_mirror_and_hub_dir_give_the_same_tool_agent_rows_and_quarantine_the_bad_ones(hub_files, tmp_path):
    store = Store(f"file://{tmp_path / 'store'}")
    mirrored = prepare_dataset(nq_config(mirror_dir=str(hub_files), source="mirror"), store)
    hub = prepare_dataset(nq_config(hub_id=str(hub_files), source="hub"), store)
    assert mirrored.source == f"mirror:{hub_files}" and hub.source == f"hub:{hub_files}"
    assert mirrored.counts == hub.counts == {"train": 3, "val": 1, "test": 2}
    rows = _rows(mirrored, store)
    assert rows == _rows(hub, store)  # the hub's rows and the downloaded files' are one dataset
    rejected = pq.read_table(strip_scheme(mirrored.uri) + "/rejected.parquet").to_pylist()
    assert sorted((r["uid"], r["reason"]) for r in rejected) == [("train/2", "missing_question"),
                                                                 ("train/3", "missing_answer")]

    by_id = {r["extra_info"]["id"]: r for split in rows.values() for r in split}
    assert sorted(by_id) == ["hotpotqa_1", "hotpotqa_11", "hotpotqa_5", "nq_0", "nq_10", "nq_4"]
    nq, hotpot = by_id["nq_0"], by_id["hotpotqa_1"]
    assert nq["data_source"] == "searchR1_nq" and hotpot["data_source"] == "searchR1_hotpotqa"
    assert nq["ability"] == "qa" and nq["agent_name"] == TOOL_AGENT
    assert nq["extra_info"]["tools_kwargs"] == {"search": {"create_kwargs": {"data_source": nq["data_source"]}}}
    assert json.loads(nq["reward_model"]["ground_truth"]) == {"target": ["Denver Broncos"]}  # target over golden
    assert json.loads(hotpot["reward_model"]["ground_truth"]) == {"target": ["Warsaw"]}  # golden when no target
    assert json.loads(by_id["nq_4"]["reward_model"]["ground_truth"]) == {"target": ["Nile", "the Nile"]}
    assert (nq["extra_info"]["source"], list(nq["extra_info"]["answers"])) == ("nq", ["Denver Broncos"])
    assert [m["role"] for m in nq["prompt"]] == ["system", "user"] and nq["prompt"][1]["content"] == TRAIN[0]["question"]
    assert "search tool" in nq["prompt"][0]["content"] and "Wikipedia" in nq["prompt"][0]["content"]
    assert {r["data_source"] for r in rows["test"]} == {"searchR1_nq", "searchR1_hotpotqa"}


def test_the_reward_dispatcher_scores_the_rows_gold_and_not_a_wrong_answer(hub_files, tmp_path):
    store = Store(f"file://{tmp_path / 'store'}")
    version = prepare_dataset(nq_config(tool=False, mirror_dir=str(hub_files)), store)
    assert pq.read_table(strip_scheme(version.splits["test"])).column_names == [
        "data_source", "prompt", "ability", "reward_model", "extra_info"]  # no tool: no agent fields
    for row in load_split(version, "test", store).to_dict("records"):
        truth = row["reward_model"]["ground_truth"]
        gold = json.loads(truth)["target"][0]
        right = compute_score(row["data_source"], f"<think>\nI looked it up.\n</think>\n<answer>{gold}</answer>", truth)
        wrong = compute_score(row["data_source"], "<think>\nI looked it up.\n</think>\n<answer>Mars</answer>", truth)
        assert right["score"] == 1.0 and right["correctness"] == 1.0
        assert wrong["correctness"] == 0.0 and wrong["score"] <= 0.3
