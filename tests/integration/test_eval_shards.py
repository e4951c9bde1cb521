"""Sharded evaluation (eval.shards) on the tiny model gives exactly the unsharded per-problem table and metrics."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_grpo.config import RunConfig, load_config
from verl_grpo.data import prepare_dataset
from verl_grpo.errors import ConfigError
from verl_grpo.evaluate import EvalShard, evaluate_cached, evaluate_model, evaluate_shard, plan_eval, runner
from verl_grpo.store import Store

LIMIT = 10


def shard_cfg(store_uri: str, shards: int = 1) -> RunConfig:
    # batch_size 3 over 10 problems: 4 batches, the last one short.
    return RunConfig.model_validate({
        "storage": {"uri": store_uri}, "trainer": {"threads": 1},
        "eval": {"limit": LIMIT, "batch_size": 3, "max_new_tokens": 24, "shards": shards},
    })


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, data_mirror):
    store = Store(f"file://{tmp_path_factory.mktemp('shard-store')}")
    return store, prepare_dataset(shard_cfg(store.uri), store)


@pytest.fixture(scope="module")
def varied_model(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model with large seeded random weights: 24 varied tokens per prompt (the tiny model's small
    init answers every prompt with newlines), so a batch padded differently would show in the text."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0, 0.3)
    out = tmp_path_factory.mktemp("varied")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


def read_table(store: Store, uri: str) -> pd.DataFrame:
    with store.fs.open(uri.removeprefix("file://"), "rb") as f:
        return pd.read_parquet(f)


def all_shards(cfg: RunConfig, model: str, dataset, store: Store, **kwargs) -> list[EvalShard | None]:
    return [evaluate_shard(cfg, model, dataset, store, i, progress=lambda *_: None, **kwargs)
            for i in range(cfg.eval.shards)]


@pytest.mark.parametrize("shards", [2, 3])
def test_sharded_eval_equals_unsharded(prepared, varied_model, shards):
    store, dataset = prepared
    whole = evaluate_model(shard_cfg(store.uri), str(varied_model), dataset, store, out_rel="t/whole.parquet",
                           progress=lambda *_: None)
    cfg = shard_cfg(store.uri, shards)
    parts = all_shards(cfg, str(varied_model), dataset, store)
    sharded = evaluate_model(cfg, str(varied_model), dataset, store, out_rel=f"t/sharded-{shards}.parquet",
                             shards=parts)

    assert sorted(p for part in parts for p in part.positions) == list(range(LIMIT))
    assert all(part.positions for part in parts)  # every shard got work
    assert (sharded.metrics, sharded.settings_key, sharded.n) == (whole.metrics, whole.settings_key, whole.n)
    whole_table, sharded_table = read_table(store, whole.table_uri), read_table(store, sharded.table_uri)
    assert whole_table["response"].nunique() == LIMIT  # the comparison is between varied responses
    pd.testing.assert_frame_equal(sharded_table, whole_table)


def test_shard_order_and_count_do_not_matter(prepared, varied_model):
    store, dataset = prepared
    cfg = shard_cfg(store.uri, 2)
    parts = all_shards(cfg, str(varied_model), dataset, store)
    forward = evaluate_model(cfg, str(varied_model), dataset, store, out_rel="t/fwd.parquet", shards=parts)
    backward = evaluate_model(cfg, str(varied_model), dataset, store, out_rel="t/bwd.parquet", shards=parts[::-1])
    pd.testing.assert_frame_equal(read_table(store, forward.table_uri), read_table(store, backward.table_uri))

    with pytest.raises(ConfigError, match="cover 6 of 10 problems"):
        evaluate_model(cfg, str(varied_model), dataset, store, out_rel="t/x.parquet", shards=parts[:1])
    with pytest.raises(ConfigError, match="overlap"):
        evaluate_model(cfg, str(varied_model), dataset, store, out_rel="t/x.parquet", shards=[*parts, parts[0]])


def test_sharded_base_eval_fills_the_cache_and_then_skips_generation(prepared, varied_model, monkeypatch):
    store, dataset = prepared
    cfg = shard_cfg(store.uri, 2)
    parts = all_shards(cfg, str(varied_model), dataset, store, cached=True)
    first = evaluate_cached(cfg, str(varied_model), dataset, store, shards=parts)
    assert first.table_uri.startswith(store.url("eval-cache/"))
    plain = evaluate_cached(shard_cfg(store.uri), str(varied_model), dataset, store)  # shards: same cache entry
    assert (plain.table_uri, plain.metrics) == (first.table_uri, first.metrics)

    def no_generation(*args, **kwargs):
        raise AssertionError("a cache hit must not generate")

    monkeypatch.setattr(runner, "generate", no_generation)
    assert all_shards(cfg, str(varied_model), dataset, store, cached=True) == [None, None]
    again = evaluate_cached(cfg, str(varied_model), dataset, store, shards=[None, None])
    assert (again.table_uri, again.metrics) == (first.table_uri, first.metrics)


def test_shard_positions_deal_whole_longest_first_batches():
    lengths = [5, 9, 7, 9, 1, 3, 8]  # longest first, ties by position: 1, 3, 6, 2, 0, 5, 4
    assert runner.shard_positions(lengths, 2, 0, 2) == [1, 3, 0, 5]
    assert runner.shard_positions(lengths, 2, 1, 2) == [6, 2, 4]
    assert runner.shard_positions(lengths, 2, 3, 4) == [4]
    assert runner.shard_positions(lengths, 4, 1, 2) == [0, 5, 4] and runner.shard_positions(lengths, 8, 1, 2) == []
    with pytest.raises(ConfigError, match="0..shards-1"):
        runner.shard_positions(lengths, 2, 2, 2)


def test_shards_and_runner_settings_are_checked():
    with pytest.raises(ConfigError, match=r"eval: shards=2 needs samples=0.*eval.shards=1 or eval.samples=0"):
        load_config([], ["eval.shards=2", "eval.samples=4"], env={})
    named = r"orchestration.ray_address \(override 'orchestration.ray_address=head:6379'\)"
    with pytest.raises(ConfigError, match=named + r": must be `auto` or .*ray://"):
        load_config([], ["orchestration.task_runner=ray", "orchestration.ray_address=head:6379"], env={})
    with pytest.raises(ConfigError, match="only used with task_runner=ray"):
        load_config([], ["orchestration.ray_address=auto"], env={})
    cfg = load_config([], ["orchestration.task_runner=ray", "orchestration.ray_address=ray://head:10001",
                           "eval.shards=4"], env={})
    assert (cfg.orchestration.ray_address, cfg.eval.shards) == ("ray://head:10001", 4)


def test_plan_and_cache_key_ignore_shards(prepared):
    store, dataset = prepared
    keys = {plan_eval(shard_cfg(store.uri, n), dataset, store).settings_key for n in (1, 2, 5)}
    assert len(keys) == 1
