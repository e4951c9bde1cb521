"""The leaderboard read back from a real MLflow (SQLite in tmp_path) after registrations, and the experiment's saved
view and compare links that the MLflow UI opens (tests/e2e/test_prefect_server.py renders them in a browser)."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from registry_runs import correct_first, make_env, make_run, register

from verl_grpo.config import load_config
from verl_grpo.registry.leaderboard import (
    LEADERBOARD_VIEW,
    VIEW_COLUMNS,
    leaderboard_markdown,
    leaderboard_route,
    read_leaderboard,
)
from verl_grpo_tasks.reporting import board_name, leaderboard_key, summary_key


@pytest.fixture
def env(tmp_path):
    return make_env(tmp_path)


def _with_reward(run, reward: float):
    train, report, base = run
    return train, report.model_copy(update={"metrics": {**report.metrics, "mean_score": reward}}), base


def test_rows_are_the_registered_runs_newest_first_with_deltas_over_the_champion(env, tiny_model_dir, tmp_path):
    cfg, store, dataset = env
    runs = [("weak", 10, 0.2), ("strong", 30, 0.6), ("worse", 5, 0.1)]
    for name, k, reward in runs:
        register(cfg, store, dataset, *_with_reward(make_run(store, tiny_model_dir, name, correct_first(k)), reward))

    experiment_id, rows = read_leaderboard(cfg.tracking.mlflow_uri, cfg.experiment_name)

    assert [r.run_name for r in rows] == ["worse", "strong", "weak"]
    assert [r.decision for r in rows] == ["kept-not-better", "promoted", "first-model"]
    assert [r.accuracy for r in rows] == [0.125, 0.75, 0.25]
    worse, strong, weak = rows
    assert strong.delta == pytest.approx(0.5) and strong.p_value < 1e-5
    assert strong.reward_delta == pytest.approx(0.4)  # against weak, the champion it was compared with
    assert worse.delta == pytest.approx(-0.625) and worse.reward_delta == pytest.approx(-0.5)  # against strong
    assert weak.delta is None and weak.p_value is None and weak.reward_delta is None  # the first has no champion
    assert [r.model for r in rows] == ["smollm2-135m · v3", "smollm2-135m · v2", "smollm2-135m · v1"]  # base model, registered version
    assert {r.dataset for r in rows} == {"h1"} and {r.steps for r in rows} == {3} and {r.cost for r in rows} == {"local"}

    markdown = leaderboard_markdown(board_name(cfg), rows, run_url=lambda run: f"http://ui/#/runs/{run}",
                                    view_url="http://ui/#/view")
    table = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| night (UTC) | model | dataset | steps | accuracy | Δ vs champion | p |")
    assert table[2].startswith(f'| [{strong.started}](http://ui/#/runs/{strong.mlflow_run_id} "strong") | '
                               "smollm2-135m · v2 | `h1` | 3 | 0.750 | +0.500 |"), table[2]
    assert "| 0.600 | +0.400 | promoted | local |" in table[2]
    assert "[The same columns in MLflow](http://ui/#/view)" in markdown

    client = MlflowClient(cfg.tracking.mlflow_uri)
    # The saved runs-table view MLflow's UI opens with ?viewStateShareKey=: the leaderboard's columns, newest first.
    view = json.loads(client.get_experiment(experiment_id).tags[f"mlflow.sharedViewState.{LEADERBOARD_VIEW}"])
    assert view["selectedColumns"] == [f"{kind}.`{key}`" for kind, key in VIEW_COLUMNS]
    assert "metrics.`eval.accuracy`" in view["selectedColumns"] and "tags.`promotion.decision`" in view["selectedColumns"]
    assert (view["orderByKey"], view["orderByAsc"]) == ("attributes.start_time", False)
    assert leaderboard_route(experiment_id).endswith(f"?viewStateShareKey={LEADERBOARD_VIEW}&workflowType=machine_learning")
    # The run description links MLflow's compare-runs page of this run and the champion it was compared with.
    note = client.get_run(strong.mlflow_run_id).data.tags["mlflow.note.content"]
    link = unquote(note.split("[Compare with the champion's run](#", 1)[1].split(")", 1)[0])
    assert link == (f'/compare-runs?runs=["{strong.mlflow_run_id}", "{weak.mlflow_run_id}"]'
                    f'&experiments=["{experiment_id}"]')
    # The single values as one table beside their one-dot charts: the Prefect eval-results table.
    logged = json.loads(Path(client.download_artifacts(strong.mlflow_run_id, "eval/summary.json", str(tmp_path))).read_text())
    summary = pd.DataFrame(logged["data"], columns=logged["columns"]).set_index("metric")
    assert summary.loc["accuracy", ["base", "trained", "delta"]].tolist() == [0.0, 0.75, 0.75]
    assert "Compare with the champion" not in client.get_run(weak.mlflow_run_id).data.tags["mlflow.note.content"]


def test_a_missing_experiment_has_no_leaderboard(env):
    cfg, _, _ = env
    assert read_leaderboard(cfg.tracking.mlflow_uri, "verl-grpo/none") == (None, [])


def test_smoke_runs_have_an_experiment_a_summary_and_a_leaderboard_of_their_own():
    production, smoke = load_config(["gsm8k"], []), load_config(["gsm8k"], ["model.name=tiny"])
    assert (production.experiment_name, smoke.experiment_name) == ("verl-grpo/gsm8k", "verl-grpo/gsm8k-tiny")
    assert (production.registered_model_name, smoke.registered_model_name) == ("verl-grpo-gsm8k", "verl-grpo-gsm8k-tiny")
    assert [summary_key(board_name(c)) for c in (production, smoke)] == ["run-summary-gsm8k", "run-summary-gsm8k-tiny"]
    assert [leaderboard_key(board_name(c)) for c in (production, smoke)] == ["leaderboard-gsm8k", "leaderboard-gsm8k-tiny"]
    # a model directory (the tiny model's too) is a production run: only the name `tiny` marks a smoke run
    assert load_config(["gsm8k"], ["model.name=/models/tiny"]).experiment_name == "verl-grpo/gsm8k"
    assert load_config(["gsm8k"], ["model.name=tiny", "tracking.experiment=mine"]).experiment_name == "mine"
