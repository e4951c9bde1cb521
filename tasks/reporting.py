"""What a run shows in the Prefect UI: tags, the run summary, links and the eval table."""

from __future__ import annotations

import os
import re

from prefect import get_run_logger
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from verl_grpo.chain import Outcome
from verl_grpo.comparison import EvalTables, compare_to_base, eval_table
from verl_grpo.config import RunConfig
from verl_grpo.models import model_short_name
from verl_grpo.registry.leaderboard import leaderboard_markdown, leaderboard_route, read_leaderboard
from verl_grpo.registry.tracking import TRAINING_VIEW, read_lines
from verl_grpo.reward_curve import reward_curve
from verl_grpo.samples_markdown import full_text_line, samples_markdown
from verl_grpo.store import Store
from verl_grpo.store_layout import run_reward_curve, run_samples
from verl_grpo.summary import curve_lines, mlflow_ui_command, outcome_lines, summary_dict, summary_markdown
from verl_grpo.trainers.worker.samples import stored_samples

MLFLOW_UI_ENV, MLFLOW_UI_STORE_ENV = "VERL_GRPO_MLFLOW_UI", "VERL_GRPO_MLFLOW_UI_STORE"
"""URL of an MLflow UI and the local tracking store it serves (`make serve` sets both), for links from Prefect."""
SAMPLES_KEY = "training-samples"
"""The flow run's markdown artifact of the last sampled training step's rollouts, grouped by prompt."""


def run_tags(cfg: RunConfig) -> list[str]:
    """dataset, model, provider and backend: the tags of the flow run and every task run."""
    return [cfg.task, model_short_name(cfg.model.name), cfg.infra.provider, cfg.trainer.backend]


def mlflow_ui(tracking_uri: str) -> str | None:
    """The MLflow UI that shows this tracking store: the tracking server itself, or the UI that serves this local
    store (VERL_GRPO_MLFLOW_UI over VERL_GRPO_MLFLOW_UI_STORE); None when no UI serves it."""
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    if os.environ.get(MLFLOW_UI_STORE_ENV) == tracking_uri and os.environ.get(MLFLOW_UI_ENV):
        return os.environ[MLFLOW_UI_ENV].rstrip("/")
    return None


def mlflow_run_url(tracking_uri: str, experiment_id: str, mlflow_run_id: str) -> str | None:
    """The MLflow UI page of a run; None when no UI serves its store."""
    ui = mlflow_ui(tracking_uri)
    return f"{ui}/#/experiments/{experiment_id}/runs/{mlflow_run_id}?{TRAINING_VIEW}" if ui else None


def mlflow_local_note(tracking_uri: str, mlflow_run_id: str) -> str:
    """Markdown telling how to open a run of a local (sqlite/file) MLflow store."""
    return (f"# MLflow run `{mlflow_run_id}`\n\nThe tracking store is local (`{tracking_uri}`); open it with "
            f"`make serve` (MLflow UI at http://127.0.0.1:5000) or\n\n```bash\n{mlflow_ui_command(tracking_uri)}\n```"
            f"\n\nthen the run `{mlflow_run_id}` (or search `tags.verl_grpo.run_id`).\n")


def publish_summary(outcome: Outcome) -> dict:
    """The run's outcome where a user looks first: artifacts on the flow run itself (called from the flow's
    body, not as a task, so they show under the flow run) and the same lines in the flow run's log."""
    cfg, run_id, result = outcome.run.cfg, outcome.run.run_id, outcome.train
    report, base, warm, version = outcome.evals.trained, outcome.evals.base, outcome.evals.warm_start, outcome.version
    store = outcome.run.store
    tables = EvalTables(store)
    changes = compare_to_base(report, base, tables, warm)
    plain = outcome.evals.trained_without_tools
    curve = reward_curve(read_lines(store, result.metrics_uri) or [])
    summary = summary_dict(outcome, changes, curve, curve_png_location(store, run_id),
                           without_tools=compare_to_base(report, plain, tables) if plain else ())
    url = _mlflow_url(cfg.tracking.mlflow_uri, version.mlflow_run_id)
    link = (f"[{version.mlflow_run_id}]({url})" if url
            else f"`{version.mlflow_run_id}` (`{mlflow_ui_command(cfg.tracking.mlflow_uri)}`)")
    logger = get_run_logger()
    cost = [f"cloud cost: {summary['cloud_cost']}"] if summary.get("cloud_cost") else []
    for line in [*outcome_lines(summary), *cost, *curve_lines(summary),
                 f"MLflow run: {url or mlflow_ui_command(cfg.tracking.mlflow_uri)}"]:
        logger.info(line)
    for line in summary["warnings"]:
        logger.warning(line)
    create_markdown_artifact(summary_markdown(summary, link), key=summary_key(board_name(cfg)),
                             description=f"verl-grpo run {run_id}")
    create_table_artifact(eval_table(report, base, warm), key="eval-results",
                          description=f"{run_id}: {report.split} n={report.n}, base vs "
                                      f"{'warm start vs ' if warm else ''}trained")
    if records := stored_samples(store, run_id):
        create_markdown_artifact(samples_page(store, run_id, records[-1], url), key=SAMPLES_KEY,
                                 description=f"{run_id}: rollouts of training step {records[-1]['step']}, the last "
                                             "sampled step (every sampled step: the MLflow run's train/samples.json)")
    publish_leaderboard(cfg)
    if url:
        create_link_artifact(url, link_text=f"MLflow run {version.mlflow_run_id}", key="mlflow-run")
    else:
        create_markdown_artifact(mlflow_local_note(cfg.tracking.mlflow_uri, version.mlflow_run_id), key="mlflow-run")
    if result.checkpoint:
        create_link_artifact(result.checkpoint.uri, link_text=f"checkpoint step {result.checkpoint.step}",
                             key="checkpoint", description=f"{run_id}: last committed checkpoint")
    create_link_artifact(result.model_uri, link_text="final model", key="model",
                         description=f"{run_id}: final Hugging Face model dir")
    return summary


def samples_page(store: Store, run_id: str, record: dict, mlflow_url: str | None) -> str:
    """The `training-samples` markdown of one samples.jsonl record, naming where the uncut text is."""
    rel = run_samples(run_id)
    location = store.path(rel) if store.is_local else store.url(rel)
    return samples_markdown(record, run_id, full_text_line(mlflow_url, location))


def summary_key(board: str) -> str:
    """`run-summary-<board>`: one key per task (and one per task's smoke runs, see `board_name`), so the key's
    history page in Prefect lists that task's run summaries; Prefect keys take lowercase letters, digits and
    dashes."""
    return "run-summary-" + _key_part(board)


def leaderboard_key(board: str) -> str:
    """`leaderboard-<board>`: the task's leaderboard, a new version of the same key after each run."""
    return "leaderboard-" + _key_part(board)


def _key_part(board: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", board.lower()).strip("-")


def board_name(cfg: RunConfig) -> str:
    """The task (`gsm8k`), or its smoke runs' own board (`gsm8k-tiny`), as the MLflow experiments split them."""
    return cfg.task + (f"-{cfg.smoke_model}" if cfg.smoke_model else "")


def publish_leaderboard(cfg: RunConfig) -> None:
    """The leaderboard of the run's experiment (verl_grpo.registry.leaderboard) as the markdown artifact
    `leaderboard-<board>`, linked to the MLflow UI's runs and saved view when a UI serves the store."""
    experiment_id, rows = read_leaderboard(cfg.tracking.mlflow_uri, cfg.experiment_name)
    if experiment_id is None:
        return
    ui = mlflow_ui(cfg.tracking.mlflow_uri)
    markdown = leaderboard_markdown(
        board_name(cfg), rows, run_url=lambda run: mlflow_run_url(cfg.tracking.mlflow_uri, experiment_id, run),
        view_url=f"{ui}/#{leaderboard_route(experiment_id)}" if ui else None)
    create_markdown_artifact(markdown, key=leaderboard_key(board_name(cfg)),
                             description=f"{board_name(cfg)}: registered runs, newest first")


def curve_png_location(store: Store, run_id: str) -> str:
    """Where the run's reward curve PNG is: a local path for a local store, else its store URI; "" when the run
    drew none (no reward logged)."""
    rel = run_reward_curve(run_id)
    if not store.exists(rel):
        return ""
    return store.path(rel) if store.is_local else store.url(rel)


def _mlflow_url(tracking_uri: str, mlflow_run_id: str) -> str | None:
    from mlflow import MlflowClient

    experiment_id = MlflowClient(tracking_uri=tracking_uri).get_run(mlflow_run_id).info.experiment_id
    return mlflow_run_url(tracking_uri, experiment_id, mlflow_run_id)
