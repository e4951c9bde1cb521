"""A task's leaderboard: one row per registered run of its experiment, newest first, read back from MLflow.

The same rows feed the Prefect artifact `leaderboard-<task>` and the MLflow experiment's saved view (the runs table
with these columns, `LEADERBOARD_VIEW`), so both UIs answer "which night was best?" alike.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import quote

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from verl_grpo.models import model_short_name
from verl_grpo.registry import tracking
from verl_grpo.registry.lines import BASE_MODEL_TAG

DECISION_TAG = "promotion.decision"
MODEL_VERSION_TAG = "verl_grpo.model_version"
"""`<registered model> v<n>`: the version the run registered."""
COMPARED_TO_TAG = "promotion.champion_run_id"
"""The MLflow run of the champion this run was compared with (the run page's compare link, the reward delta)."""

ACCURACY, REWARD = tracking.value_name("eval", "accuracy"), tracking.value_name("eval", "mean_score")
DELTA, P_VALUE = "promotion.delta", "promotion.mcnemar_p"
STEPS, COST = tracking.value_name("train", "final_step"), tracking.value_name("cloud", "cost_usd")

LEADERBOARD_VIEW = "verl-grpo-leaderboard"
"""The share key of the experiment's saved runs-table view (`?viewStateShareKey=`): MLflow's UI reads it from the
experiment tag `mlflow.sharedViewState.<key>`."""
_SHARED_VIEW_TAG = "mlflow.sharedViewState."
VIEW_COLUMNS = [
    ("tags", BASE_MODEL_TAG), ("tags", MODEL_VERSION_TAG), ("attributes", "Dataset"), ("metrics", STEPS),
    ("metrics", ACCURACY), ("metrics", DELTA), ("metrics", P_VALUE), ("metrics", REWARD), ("tags", DECISION_TAG),
    ("metrics", COST)]
"""The runs-table columns of the saved view, after MLflow's own Run Name and Created: the leaderboard's."""
ROWS = 30
"""Runs a leaderboard shows (the newest)."""


@dataclass(frozen=True)
class Row:
    started: str
    """UTC date and time the run's training started."""
    run_name: str
    mlflow_run_id: str
    model: str
    """Base model (short name) and the registered version, e.g. `smollm2-135m · v3`."""
    dataset: str
    """The dataset version's hash (its first 8 characters)."""
    steps: int | None
    accuracy: float | None
    delta: float | None
    """Accuracy minus the champion's on the same problems (None: no champion to compare with)."""
    p_value: float | None
    """McNemar p of that difference."""
    reward: float | None
    """Mean held-out reward (`eval.mean_score`)."""
    reward_delta: float | None
    decision: str
    cost: str


def leaderboard(client: MlflowClient, experiment_id: str, limit: int = ROWS) -> list[Row]:
    """The experiment's registered runs (those with a promotion decision), newest first."""
    runs = client.search_runs([experiment_id], filter_string="attributes.status = 'FINISHED'",
                              order_by=["attributes.start_time DESC"], max_results=limit)
    compared: dict[str, float | None] = {}

    def reward_of(run_id: str) -> float | None:
        if run_id not in compared:
            compared[run_id] = _metric(client.get_run(run_id), REWARD)
        return compared[run_id]

    return [_row(run, reward_of) for run in runs if run.data.tags.get(DECISION_TAG)]


def _row(run: Run, reward_of: Callable[[str], float | None]) -> Row:
    tags, reward = run.data.tags, _metric(run, REWARD)
    champion = tags.get(COMPARED_TO_TAG)
    champion_reward = reward_of(champion) if champion else None
    version = tags.get(MODEL_VERSION_TAG, "").rsplit(" ", 1)[-1]
    steps = _metric(run, STEPS)
    cost = _metric(run, COST)
    return Row(
        started=datetime.fromtimestamp(run.info.start_time / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M"),
        run_name=run.info.run_name or tags.get(tracking.RUN_ID_TAG, run.info.run_id),
        mlflow_run_id=run.info.run_id,
        model=" · ".join(filter(None, (model_short_name(tags.get(BASE_MODEL_TAG, "")), version))),
        dataset=tags.get("dataset.hash", "")[:8],
        steps=None if steps is None else int(steps),
        accuracy=_metric(run, ACCURACY),
        delta=_metric(run, DELTA),
        p_value=_metric(run, P_VALUE),
        reward=reward,
        reward_delta=None if reward is None or champion_reward is None else reward - champion_reward,
        decision=tags[DECISION_TAG],
        cost=f"${cost:.2f}" if cost is not None else tags.get("infra.provider", ""),
    )


def _metric(run: Run, key: str) -> float | None:
    value = tracking.single_values(run.data.metrics).get(key)
    return None if value is None or math.isnan(value) else value


HEADER = ["night (UTC)", "model", "dataset", "steps", "accuracy", "Δ vs champion", "p", "reward", "Δ reward",
          "decision", "cost"]


def leaderboard_markdown(task: str, rows: list[Row], run_url: Callable[[str], str | None],
                         view_url: str | None = None) -> str:
    """The leaderboard as a markdown table (Prefect's artifact): 3-digit numbers, the run linked to its MLflow page
    when a UI serves it (`run_url(mlflow_run_id)`: the night's date is the link, the run's name its title), and a line
    linking MLflow's saved view of the same columns."""
    lines = [f"# Leaderboard: {task}", ""]
    lines += [f"Newest first; {len(rows)} registered run{'s' if len(rows) != 1 else ''}. Δ and p: against the champion "
              "of the night, on the same problems (McNemar)."]
    if view_url:
        lines += ["", f"[The same columns in MLflow]({view_url})"]
    lines += ["", "| " + " | ".join(HEADER) + " |", "|" + "---|" * 3 + "---:|" * 6 + "---|---:|"]
    for row in rows:
        url = run_url(row.mlflow_run_id)
        night = f'[{row.started}]({url} "{row.run_name}")' if url else f"{row.started} `{row.run_name}`"
        cells = [night, row.model, f"`{row.dataset}`" if row.dataset else "", _int(row.steps),
                 _num(row.accuracy), _signed(row.delta), _num(row.p_value), _num(row.reward), _signed(row.reward_delta),
                 row.decision, row.cost]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}" if 0 < abs(value) < 1e-3 else f"{value:.3f}"


def _signed(value: float | None) -> str:
    return "" if value is None else f"{value:+.3f}"


def _int(value: int | None) -> str:
    return "" if value is None else str(value)


def ensure_leaderboard_view(client: MlflowClient, experiment_id: str) -> None:
    """Save the leaderboard's runs-table view on the experiment (newest first, the leaderboard's columns)."""
    view = {"orderByKey": "attributes.start_time", "orderByAsc": False, "searchFilter": "",
            "selectedColumns": [f"{kind}.`{key}`" for kind, key in VIEW_COLUMNS], "runsHiddenMode": "SHOW_ALL"}
    value = json.dumps(view, separators=(",", ":"))
    tag = _SHARED_VIEW_TAG + LEADERBOARD_VIEW
    if client.get_experiment(experiment_id).tags.get(tag) != value:
        client.set_experiment_tag(experiment_id, tag, value)


def leaderboard_route(experiment_id: str) -> str:
    """The MLflow UI route (after `#`) of the experiment's leaderboard view."""
    return f"/experiments/{experiment_id}/runs?viewStateShareKey={LEADERBOARD_VIEW}&{tracking.TRAINING_VIEW}"


def compare_route(experiment_id: str, *mlflow_run_ids: str) -> str:
    """The MLflow UI route (after `#`) of its compare-runs page for these runs."""
    runs, experiments = quote(json.dumps(list(mlflow_run_ids))), quote(json.dumps([experiment_id]))
    return f"/compare-runs?runs={runs}&experiments={experiments}"


def read_leaderboard(tracking_uri: str, experiment: str, limit: int = ROWS) -> tuple[str | None, list[Row]]:
    """The experiment's id and leaderboard rows; (None, []) when the experiment does not exist yet."""
    client = tracking.client_for(tracking_uri)
    with tracking.infra_errors(tracking_uri):
        found = client.get_experiment_by_name(experiment)
        if found is None:
            return None, []
        return found.experiment_id, leaderboard(client, found.experiment_id, limit)
