"""What a run shows in the Prefect UI: tags, the run summary, links and the eval table."""

from __future__ import annotations

import os
import re

from prefect import get_run_logger
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from verl_grpo.chain import Outcome
from verl_grpo.comparison import EvalTables, compare_to_base
from verl_grpo.config import RunConfig
from verl_grpo.contracts import EvalReport
from verl_grpo.models import model_short_name
from verl_grpo.registry.tracking import read_lines
from verl_grpo.reward_curve import reward_curve
from verl_grpo.samples_markdown import full_text_line, samples_markdown
from verl_grpo.store import Store
from verl_grpo.store_layout import run_reward_curve, run_samples
from verl_grpo.summary import curve_lines, mlflow_ui_command, outcome_lines, summary_dict, summary_markdown
from verl_grpo.trainers.worker.samples import stored_samples

MLFLOW_UI_ENV, MLFLOW_UI_STORE_ENV = "VERL_GRPO_MLFLOW_UI", "VERL_GRPO_MLFLOW_UI_STORE"
"""URL of an MLflow UI and the local tracking store it serves (`make serve` sets both), for links from Prefect."""
# MLflow 3's UI opens every experiment in its GenAI (traces) view unless the link asks for the training view.
MLFLOW_TRAINING_VIEW = "workflowType=machine_learning"
SAMPLES_KEY = "training-samples"
"""The flow run's markdown artifact of the last sampled training step's rollouts, grouped by prompt."""


def run_tags(cfg: RunConfig) -> list[str]:
    """dataset, model, provider and backend: the tags of the flow run and every task run."""
    return [cfg.task, model_short_name(cfg.model.name), cfg.infra.provider, cfg.trainer.backend]


def mlflow_run_url(tracking_uri: str, experiment_id: str, mlflow_run_id: str) -> str | None:
    """The MLflow UI page of a run: on the tracking server itself, or on the UI that serves this local store
    (VERL_GRPO_MLFLOW_UI over VERL_GRPO_MLFLOW_UI_STORE); None when no UI serves it."""
    if tracking_uri.startswith(("http://", "https://")):
        ui = tracking_uri
    elif os.environ.get(MLFLOW_UI_STORE_ENV) == tracking_uri and os.environ.get(MLFLOW_UI_ENV):
        ui = os.environ[MLFLOW_UI_ENV]
    else:
        return None
    return f"{ui.rstrip('/')}/#/experiments/{experiment_id}/runs/{mlflow_run_id}?{MLFLOW_TRAINING_VIEW}"


def mlflow_local_note(tracking_uri: str, mlflow_run_id: str) -> str:
    """Markdown telling how to open a run of a local (sqlite/file) MLflow store."""
    return (f"# MLflow run `{mlflow_run_id}`\n\nThe tracking store is local (`{tracking_uri}`); open it with "
            f"`make serve` (MLflow UI at http://127.0.0.1:5000) or\n\n```bash\n{mlflow_ui_command(tracking_uri)}\n```"
            f"\n\nthen the run `{mlflow_run_id}` (or search `tags.verl_grpo.run_id`).\n")


def eval_table(report: EvalReport, base: EvalReport, warm_start: EvalReport | None = None) -> list[dict]:
    """One row per metric: base model, (warm-start model,) trained model and the difference to base (and, with a
    warm start, GRPO's own difference: trained minus warm start)."""
    rows = []
    for name in sorted(set(report.metrics) | set(base.metrics) | set(warm_start.metrics if warm_start else ())):
        trained, before = report.metrics.get(name), base.metrics.get(name)
        row = {"metric": name, "base": before}
        if warm_start is not None:
            warm = warm_start.metrics.get(name)
            row |= {"warm_start": warm, "trained": trained, "delta": _delta(trained, before),
                    "delta_grpo": _delta(trained, warm)}
        else:
            row |= {"trained": trained, "delta": _delta(trained, before)}
        rows.append(row)
    return rows


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else round(after - before, 6)


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
    create_markdown_artifact(summary_markdown(summary, link), key=summary_key(cfg.task),
                             description=f"verl-grpo run {run_id}")
    create_table_artifact(eval_table(report, base, warm), key="eval-results",
                          description=f"{run_id}: {report.split} n={report.n}, base vs "
                                      f"{'warm start vs ' if warm else ''}trained")
    if records := stored_samples(store, run_id):
        create_markdown_artifact(samples_page(store, run_id, records[-1], url), key=SAMPLES_KEY,
                                 description=f"{run_id}: rollouts of training step {records[-1]['step']}, the last "
                                             "sampled step (every sampled step: the MLflow run's train/samples.json)")
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


def summary_key(dataset: str) -> str:
    """`run-summary-<dataset>`: one key per dataset, so the key's history page in Prefect lists that dataset's runs
    (the nightly leaderboard); Prefect keys take lowercase letters, digits and dashes."""
    return "run-summary-" + re.sub(r"[^a-z0-9]+", "-", dataset.lower()).strip("-")


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
