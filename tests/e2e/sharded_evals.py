"""The sharded-eval check of the flow tests: a flow run's eval tables and metrics equal one unsharded eval of the
same models (the base model, the run's warm start when it had one, and the model the run trained).

Base and trained model are evaluated at once; on threads that once loaded corrupted models (transformers'
from_pretrained is not thread-safe), which these exact comparisons caught."""

from __future__ import annotations

import pandas as pd

from verl_grpo.config import load_config
from verl_grpo.contracts import EvalReport
from verl_grpo.evaluate import evaluate_model
from verl_grpo.held_out import warm_start_model
from verl_grpo.models import resolve_model
from verl_grpo.plain_steps import prepare
from verl_grpo.store import Store
from verl_grpo.store_layout import eval_report


def check_sharded_evals(summary: dict, overrides: list[str]) -> None:
    """The flow run `summary` (run with `overrides`, eval.shards=2) has the eval tables and metrics of one unsharded
    eval of its base, warm-start (a run with one) and trained models."""
    sharded_cfg = load_config(["gsm8k"], overrides)
    assert sharded_cfg.eval.shards == 2
    cfg = load_config(["gsm8k"], [*overrides, "eval.shards=1", "orchestration.task_runner=thread"])
    store = Store.from_config(cfg.storage)
    dataset = prepare(cfg)  # content-hashed: the flow's dataset version, found again
    assert summary["dataset"] == f"{dataset.name}@{dataset.hash}"
    base = evaluate_model(cfg, str(resolve_model(cfg.model.name)), dataset, store, out_rel="check/base.parquet",
                          progress=lambda *_: None)
    trained = evaluate_model(cfg, summary["model_uri"], dataset, store, out_rel="check/trained.parquet",
                             progress=lambda *_: None)

    assert (summary["accuracy"], summary["base_accuracy"]) == (trained.metrics["accuracy"], base.metrics["accuracy"])
    flow_trained = EvalReport.model_validate_json(store.read_text(eval_report(summary["run_id"], "test")))
    assert (flow_trained.metrics, flow_trained.settings_key) == (trained.metrics, trained.settings_key)
    pd.testing.assert_frame_equal(_table(store, flow_trained.table_uri), _table(store, trained.table_uri))
    cached = [rel for rel in _files(store, "eval-cache") if rel.endswith(".parquet")]
    assert all(rel.endswith(f"-{base.settings_key}.parquet") for rel in cached)  # shards do not change the cache key
    [cached_base] = [rel for rel in cached if not rel.startswith("eval-cache/warm_start-")]
    pd.testing.assert_frame_equal(_table(store, store.url(cached_base)), _table(store, base.table_uri))
    warm_uri = warm_start_model(cfg, summary["run_id"])
    assert (warm_uri is not None) == ("warm_start_accuracy" in summary)
    if warm_uri:
        warm = evaluate_model(cfg, warm_uri, dataset, store, out_rel="check/warm.parquet", progress=lambda *_: None)
        assert summary["warm_start_accuracy"] == warm.metrics["accuracy"]
        [cached_warm] = [rel for rel in cached if rel.startswith("eval-cache/warm_start-")]
        pd.testing.assert_frame_equal(_table(store, store.url(cached_warm)), _table(store, warm.table_uri))
    else:
        assert cached == [cached_base]


def _table(store: Store, uri: str) -> pd.DataFrame:
    with store.fs.open(uri.removeprefix("file://"), "rb") as f:
        return pd.read_parquet(f)


def _files(store: Store, prefix: str) -> list[str]:
    root = store.path(prefix)
    return [f"{prefix}/{path.removeprefix(root).lstrip('/')}" for path in store.fs.find(root)]
