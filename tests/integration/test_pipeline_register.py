"""Registration through the pipeline: a champion evaluated with other settings is re-evaluated, not skipped."""

from __future__ import annotations

import pytest

from verl_grpo import held_out, plain_steps
from verl_grpo.chain import Evals, ResolvedRun
from verl_grpo.config import load_config
from verl_grpo.contracts import TrainResult
from verl_grpo.store_layout import run_metrics


@pytest.fixture
def base_overrides(tmp_path, tiny_model_dir):
    return [f"model.name={tiny_model_dir}", f"storage.uri=file://{tmp_path / 'store'}",
            f"tracking.mlflow_uri=sqlite:///{tmp_path / 'mlflow.db'}", "eval.max_new_tokens=8", "eval.batch_size=8",
            "trainer.threads=1"]


def _register_tiny_as_run(overrides, run_id, tiny_model_dir):
    cfg = load_config(["gsm8k"], overrides)
    dataset = plain_steps.prepare(cfg)
    result = TrainResult(run_id=run_id, final_step=1, checkpoint=None, model_uri=str(tiny_model_dir),
                         metrics_uri=f"{cfg.storage.uri}/{run_metrics(run_id)}")
    report = held_out.evaluate_trained(cfg, dataset, run_id, str(tiny_model_dir))
    base = held_out.evaluate_base(cfg, dataset)
    return cfg, report, plain_steps.register(ResolvedRun(cfg, run_id, resumed=False), dataset, result,
                                          Evals(base=base, trained=report))


def test_champion_with_other_eval_settings_is_reevaluated(base_overrides, tiny_model_dir, monkeypatch):
    _, _, first = _register_tiny_as_run([*base_overrides, "eval.limit=4"], "run-a", tiny_model_dir)
    assert "champion" in first.aliases and "first model" in first.decision

    calls = []
    real = held_out.evaluate_champion
    monkeypatch.setattr(held_out, "evaluate_champion", lambda cfg, ds: calls.append(1) or real(cfg, ds))
    cfg, report, second = _register_tiny_as_run([*base_overrides, "eval.limit=6"], "run-b", tiny_model_dir)
    assert calls == [1]
    # Same weights on both sides: compared on equal terms, the champion stays for lack of evidence.
    assert "incomparable" not in second.decision and "champion" not in second.aliases
    assert second.aliases == ["challenger"]


def test_models_cli_and_charts(base_overrides, tiny_model_dir, tmp_path):
    from click.testing import CliRunner
    from mlflow import MlflowClient

    from verl_grpo_cli.main import main

    cfg, _, version = _register_tiny_as_run([*base_overrides, "eval.limit=4"], "run-a", tiny_model_dir)
    args = [a for o in base_overrides for a in ("-o", o)]
    listed = CliRunner().invoke(main, ["models", "list", *args], catch_exceptions=False)
    assert listed.exit_code == 0
    assert " champion " in listed.output and "challenger" not in listed.output and "delta vs base" in listed.output
    assert "base model" in listed.output and "  tiny  " in listed.output and "eval metric" not in listed.output
    compared = CliRunner().invoke(main, ["models", "compare", cfg.registered_model_name, "champion", *args])
    assert compared.exit_code == 0 and "\n1 " in compared.output
    metric_rows = compared.output.split("eval metric")[1].splitlines()  # every eval metric, read from the run
    assert metric_rows[0].split() == ["v1"]
    assert {"accuracy", "format_rate", "mean_score", "truncated_rate"} <= {r.split()[0] for r in metric_rows[2:]}
    missing = CliRunner().invoke(main, ["models", "compare", cfg.registered_model_name, "7", *args])
    assert missing.exit_code == 2 and "no version or alias 7" in missing.output

    client = MlflowClient(tracking_uri=cfg.tracking.mlflow_uri)
    plots = {a.path for a in client.list_artifacts(version.mlflow_run_id, "plots")}
    assert plots == {"plots/accuracy_vs_base.png"}  # no training metrics in this run, so no reward curve
