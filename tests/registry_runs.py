"""Finished runs in a store, registered against a real MLflow (SQLite in tmp_path), for the registry tests."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from verl_grpo.chain import Evals, Outcome, ResolvedRun
from verl_grpo.config import RunConfig
from verl_grpo.contracts import CheckpointRef, DatasetVersion, EvalReport, TrainResult
from verl_grpo.registry import register_run
from verl_grpo.store import Store
from verl_grpo.store_layout import eval_table, model_dir

SPLIT, SETTINGS, N = "test", "settings-a", 40


def make_env(tmp_path: Path) -> tuple[RunConfig, Store, DatasetVersion]:
    """A config whose store and MLflow live in tmp_path, and a prepared gsm8k version `h1` of N test problems."""
    store = Store(f"file://{tmp_path / 'store'}")
    cfg = RunConfig.model_validate({
        "storage": {"uri": store.uri},
        "tracking": {"mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
    })
    manifest = json.dumps({"name": "gsm8k", "hash": "h1", "counts": {"test": N}})
    store.write_text(manifest, "datasets/gsm8k/h1/manifest.json")
    dataset = DatasetVersion(name="gsm8k", hash="h1", uri=store.url("datasets/gsm8k/h1"),
                             splits={SPLIT: store.url("datasets/gsm8k/h1/test.parquet")}, counts={SPLIT: N})
    return cfg, store, dataset


def make_run(store: Store, tiny: Path, run_id: str, correct: list[bool], settings: str = SETTINGS,
             lines: list[str] | None = None) -> tuple[TrainResult, EvalReport, EvalReport]:
    """A finished run in the store: model files, 3 steps of metrics (`lines`: other ones), eval tables of the run
    and the base."""
    model_uri = store.put_dir(tiny, model_dir(run_id))
    if lines is None:
        lines = [json.dumps({"step": s, "loss": 1.0 / s, "reward/mean": 0.1 * s, "note": "text"}) for s in (1, 2, 3)]
    metrics_uri = store.write_text("\n".join(lines) + "\n", f"runs/{run_id}/metrics.jsonl")
    ckpt = CheckpointRef(run_id=run_id, step=3, uri=store.url(f"runs/{run_id}/checkpoints/global_step_3"))
    train = TrainResult(run_id=run_id, final_step=3, checkpoint=ckpt, model_uri=model_uri, metrics_uri=metrics_uri)
    report = stored_report(store, eval_table(run_id, SPLIT), model_uri, correct, settings)
    base = stored_report(store, f"eval-cache/tiny/{SPLIT}-{settings}.parquet", "tiny", [False] * len(correct), settings)
    return train, report, base


def stored_report(store: Store, rel: str, model_uri: str, correct: list[bool], settings: str) -> EvalReport:
    table = pd.DataFrame({"id": [f"test/{i}" for i in range(len(correct))], "correct": correct,
                          "score": [float(c) for c in correct]})
    local = Path(store.path(rel))
    local.parent.mkdir(parents=True, exist_ok=True)
    table.to_parquet(local)
    acc = sum(correct) / len(correct)
    return EvalReport(model_uri=model_uri, split=SPLIT, n=len(correct), metrics={"accuracy": acc, "pass@4": acc,
                      "n": float(len(correct))}, table_uri=store.url(rel), settings_key=settings)


def outcome(cfg, dataset, train, report, base, warm_start_report=None, version=None) -> Outcome:
    """What the chain hands the registry after evaluation (and, with `version`, the summary after registration)."""
    return Outcome(ResolvedRun(cfg, train.run_id, resumed=False), dataset, train,
                   Evals(base=base, trained=report, warm_start=warm_start_report), version)


def register(cfg, store, dataset, train, report, base, warm_start_report=None, **kw):
    assert store.uri == cfg.storage.uri  # the registry opens the run's own store
    return register_run(outcome(cfg, dataset, train, report, base, warm_start_report),
                        tags={"prefect.flow_run_id": "fr-1", "git.sha": "abc123"}, **kw)


def correct_first(k: int) -> list[bool]:
    return [i < k for i in range(N)]


def with_model(cfg: RunConfig, base_model: str, registered_model: str | None = None) -> RunConfig:
    """`cfg` for runs from another base model (and, given, registered under another name)."""
    tracking = cfg.tracking.model_copy(update={"registered_model": registered_model})
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"name": base_model}), "tracking": tracking})
