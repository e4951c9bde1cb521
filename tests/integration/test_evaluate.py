"""Held-out evaluation end to end on real prepared GSM8K data and the tiny model.

A copy of the tiny model is fine-tuned in-process to reproduce the gold responses of the eval subset,
so greedy evaluation must score exactly 1.0; the untrained model scores exactly 0.0.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_grpo.config import RunConfig
from verl_grpo.data import prepare_dataset
from verl_grpo.errors import ConfigError, DataError
from verl_grpo.evaluate import evaluate_cached, evaluate_model, plan_eval, runner
from verl_grpo.store import Store
from verl_grpo.store_layout import eval_table, model_dir

LIMIT = 6
SYSTEM = "Reason inside <think></think>, then answer inside <answer></answer>."


def eval_cfg(store_uri: str, endpoint_url: str | None = None, **eval_overrides) -> RunConfig:
    return RunConfig.model_validate({
        "storage": {"uri": store_uri, "endpoint_url": endpoint_url},
        "dataset": {"name": "gsm8k", "system_prompt": SYSTEM},
        "eval": {"limit": LIMIT, "batch_size": 4, "max_new_tokens": 24, **eval_overrides},
    })


def gold_response(ground_truth: str) -> str:
    return f"<think>I work it out.</think><answer>{ground_truth}</answer>"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, data_mirror):
    store = Store(f"file://{tmp_path_factory.mktemp('eval-store')}")
    cfg = eval_cfg(store.uri)
    return cfg, store, prepare_dataset(cfg, store)


@pytest.fixture(scope="module")
def memorized_model(prepared, tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model after supervised training on the eval subset's gold responses (loss < 0.005)."""
    cfg, store, dataset = prepared
    problems = plan_eval(cfg, dataset, store).problems
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    pairs = []
    for p in problems:
        prompt = tokenizer.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=False)
        pairs.append((tokenizer(prompt, add_special_tokens=False)["input_ids"],
                      tokenizer(gold_response(p.ground_truth) + tokenizer.eos_token,
                                add_special_tokens=False)["input_ids"]))
    width = max(len(a) + len(b) for a, b in pairs)
    ids = torch.full((len(pairs), width), tokenizer.pad_token_id)
    labels = torch.full((len(pairs), width), -100)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for i, (prompt_ids, response_ids) in enumerate(pairs):
        n = len(prompt_ids) + len(response_ids)
        ids[i, :n] = torch.tensor(prompt_ids + response_ids)
        labels[i, len(prompt_ids) : n] = torch.tensor(response_ids)
        mask[i, :n] = 1
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model on a shared 2-core machine: more threads only contend
    try:
        torch.manual_seed(0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(400):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if loss.item() < 0.005:
                break
    finally:
        torch.set_num_threads(threads)
    assert loss.item() < 0.005, f"memorization did not converge (loss {loss.item():.4f})"
    out = tmp_path_factory.mktemp("memorized")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def read_table(store: Store, uri: str) -> pd.DataFrame:
    with store.fs.open(uri.removeprefix("file://").removeprefix("s3://"), "rb") as f:
        return pd.read_parquet(f)


def test_memorized_model_scores_one_and_untrained_model_zero(prepared, memorized_model, tiny_model_dir):
    cfg, store, dataset = prepared
    calls = []
    report = evaluate_model(cfg, str(memorized_model), dataset, store, out_rel="t/memorized.parquet",
                            progress=lambda done, total: calls.append((done, total)))

    assert (report.n, report.split, report.metrics["accuracy"], report.metrics["format_rate"]) == (6, "test", 1.0, 1.0)
    assert report.metrics["reward/correctness"] == 1.0 and report.metrics["truncated_rate"] == 0.0
    assert calls == [(4, 6), (6, 6)]
    table = read_table(store, report.table_uri)
    problems = plan_eval(cfg, dataset, store).problems
    assert table["id"].tolist() == [p.id for p in problems]  # original order despite length-sorted batches
    assert table["response"].tolist() == [gold_response(p.ground_truth) for p in problems]
    assert table["pred"].tolist() == table["ground_truth"].tolist()
    assert {"prompt", "score", "correct", "reward/strict_format", "response_tokens"} <= set(table.columns)

    base = evaluate_model(cfg, str(tiny_model_dir), dataset, store, out_rel="t/untrained.parquet",
                          progress=lambda *_: None)
    assert base.metrics["accuracy"] == 0.0 and base.settings_key == report.settings_key


def test_batched_generation_matches_one_at_a_time(prepared, memorized_model):
    cfg, store, dataset = prepared
    one = evaluate_model(eval_cfg(store.uri, batch_size=1), str(memorized_model), dataset, store,
                         out_rel="t/bs1.parquet", progress=lambda *_: None)
    many = evaluate_model(eval_cfg(store.uri, batch_size=6), str(memorized_model), dataset, store,
                          out_rel="t/bs6.parquet", progress=lambda *_: None)
    assert one.settings_key == many.settings_key  # batch size changes speed, not the result
    responses = [read_table(store, r.table_uri)["response"].tolist() for r in (one, many)]
    assert responses[0] == responses[1]


def test_near_greedy_sampling_gives_pass_and_majority_at_k(prepared, memorized_model):
    cfg, store, dataset = prepared
    sampled_cfg = eval_cfg(store.uri, samples=4, temperature=0.01)
    report = evaluate_model(sampled_cfg, str(memorized_model), dataset, store, out_rel="t/sampled.parquet",
                            progress=lambda *_: None)
    assert {k: report.metrics[k] for k in ("pass@1", "pass@2", "pass@4", "maj@4")} == dict.fromkeys(
        ("pass@1", "pass@2", "pass@4", "maj@4"), 1.0)
    assert read_table(store, report.table_uri)["sampled_correct"].tolist() == [4] * LIMIT
    plain = plan_eval(cfg, dataset, store)
    assert plan_eval(sampled_cfg, dataset, store).settings_key != plain.settings_key


def test_cached_eval_is_reused_without_generating(prepared, tiny_model_dir, monkeypatch):
    cfg, store, dataset = prepared
    first = evaluate_cached(cfg, "tiny", dataset, store, progress=lambda *_: None)
    assert first.table_uri.startswith(store.url("eval-cache/tiny-"))
    report_json = first.table_uri.removesuffix(".parquet") + ".json"
    assert json.loads(Path(report_json.removeprefix("file://")).read_text())["metrics"] == first.metrics

    def no_generation(*args, **kwargs):
        raise AssertionError("a cache hit must not generate")

    monkeypatch.setattr(runner, "generate", no_generation)
    again = evaluate_cached(cfg, str(tiny_model_dir), dataset, store)  # same files by path: same key
    assert (again.metrics, again.table_uri, again.settings_key) == (first.metrics, first.table_uri, first.settings_key)
    with pytest.raises(AssertionError, match="must not generate"):  # other settings: a miss
        evaluate_cached(eval_cfg(store.uri, limit=5), "tiny", dataset, store)


def test_model_in_s3_store_is_downloaded_and_table_written_beside_the_run(memorized_model, s3_bucket, data_mirror):
    uri, endpoint = s3_bucket
    store = Store(uri, endpoint)
    cfg = eval_cfg(uri, endpoint)
    dataset = prepare_dataset(cfg, store)
    model_uri = store.put_dir(memorized_model, model_dir("run-1"))

    report = evaluate_model(cfg, model_uri, dataset, store)  # no callback: a tqdm bar

    assert report.metrics["accuracy"] == 1.0
    assert report.table_uri == store.url(eval_table("run-1", "test")) and store.exists(eval_table("run-1", "test"))


def test_bad_inputs_name_the_fix(prepared, tmp_path):
    cfg, store, dataset = prepared
    with pytest.raises(DataError, match="eval.split"):
        evaluate_model(eval_cfg(store.uri, split="val"), "tiny",
                       dataset.model_copy(update={"splits": {"test": dataset.splits["test"]}}), store, out_rel="x")
    with pytest.raises(ConfigError, match="no config.json"):
        evaluate_model(cfg, f"file://{tmp_path}", dataset, store, out_rel="x")
    with pytest.raises(ConfigError, match="pass run_id or out_rel"):
        evaluate_model(cfg, "tiny", dataset, store)


def test_a_store_model_is_cached_once_per_version_of_its_files(s3_bucket, tmp_path):
    """The local copy of a store model follows the store: a model published again under the same URI (a store reset,
    a run id reused) is downloaded again, never answered from the copy of the earlier files."""
    uri, endpoint = s3_bucket
    store = Store(uri, endpoint)
    files = tmp_path / "model"
    files.mkdir()
    (files / "config.json").write_text('{"model_type": "qwen2"}')
    (files / "model.safetensors").write_bytes(b"first weights")
    model_uri = store.put_dir(files, model_dir("run-1"))

    first = runner.resolve_model_dir(model_uri, Store(uri, endpoint))
    assert (first / "model.safetensors").read_bytes() == b"first weights"
    assert runner.resolve_model_dir(model_uri, Store(uri, endpoint)) == first  # unchanged files: the same copy

    (files / "model.safetensors").write_bytes(b"other weights")  # same size, other bytes
    store.put_dir(files, model_dir("run-1"))
    again = runner.resolve_model_dir(model_uri, Store(uri, endpoint))
    assert again != first and (again / "model.safetensors").read_bytes() == b"other weights"


def test_a_store_download_fetches_the_files_of_the_listing_it_fingerprinted(s3_bucket, tmp_path):
    """One listing names the copy's version and its files: a file written after it is not in that copy (the next
    resolve lists again and gets it), and a listing of another path is refused."""
    uri, endpoint = s3_bucket
    store = Store(uri, endpoint)
    files = tmp_path / "model"
    files.mkdir()
    (files / "config.json").write_text('{"model_type": "qwen2"}')
    store.put_dir(files, model_dir("run-2"))
    listing = store.listing(model_dir("run-2"))
    store.write_text("late", model_dir("run-2"), "extra.txt")

    copy = store.get_dir(tmp_path / "copy", model_dir("run-2"), listing=listing)
    assert sorted(p.name for p in copy.iterdir()) == ["config.json"]
    assert listing.fingerprint() != store.listing(model_dir("run-2")).fingerprint()
    with pytest.raises(ValueError, match="listing of"):
        store.get_dir(tmp_path / "other", model_dir("run-1"), listing=listing)
