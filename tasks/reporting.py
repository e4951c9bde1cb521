"""What a run shows in the Prefect UI: tags, the run summary, links and the eval table."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from verl_grpo.config import RunConfig
from verl_grpo.contracts import DatasetVersion, EvalReport, ModelVersion, TrainResult
from verl_grpo.models import model_short_name
from verl_grpo.summary import summary_dict, summary_markdown


def run_tags(cfg: RunConfig) -> list[str]:
    """dataset, model, provider and backend: the tags of the flow run and every task run."""
    return [cfg.dataset.name, model_short_name(cfg.model.name), cfg.infra.provider, cfg.trainer.backend]


def mlflow_run_url(tracking_uri: str, experiment_id: str, mlflow_run_id: str) -> str | None:
    """The MLflow UI page of a run when tracking is an MLflow server; None for a local store (no URL)."""
    if not tracking_uri.startswith(("http://", "https://")):
        return None
    return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{mlflow_run_id}"


def mlflow_local_note(tracking_uri: str, mlflow_run_id: str) -> str:
    """Markdown telling how to open a run of a local (sqlite/file) MLflow store."""
    return (f"# MLflow run `{mlflow_run_id}`\n\nThe tracking store is local (`{tracking_uri}`); open it with\n\n"
            f"```bash\nmlflow ui --backend-store-uri {tracking_uri} --host 127.0.0.1 --port 5000\n```\n\n"
            f"then the run `{mlflow_run_id}` (or search `tags.verl_grpo.run_id`).\n")


def eval_table(report: EvalReport, base: EvalReport) -> list[dict]:
    """One row per metric: base model, trained model and the difference."""
    rows = []
    for name in sorted(set(report.metrics) | set(base.metrics)):
        trained, before = report.metrics.get(name), base.metrics.get(name)
        delta = None if trained is None or before is None else round(trained - before, 6)
        rows.append({"metric": name, "base": before, "trained": trained, "delta": delta})
    return rows


@task(name="publish-summary", cache_policy=NO_CACHE)
def publish_summary(cfg: RunConfig, run_id: str, dataset: DatasetVersion, result: TrainResult, report: EvalReport,
                    base: EvalReport, version: ModelVersion) -> dict:
    """Run summary (markdown), eval table, and links to the MLflow run, checkpoint and model; returns the summary."""
    summary = summary_dict(cfg, run_id, dataset, result, report, base, version)
    create_markdown_artifact(summary_markdown(summary), key="run-summary", description=f"verl-grpo run {run_id}")
    create_table_artifact(eval_table(report, base), key="eval-results",
                          description=f"{run_id}: {report.split} n={report.n}, base vs trained")
    _publish_mlflow_link(cfg.tracking.mlflow_uri, version.mlflow_run_id)
    if result.checkpoint:
        create_link_artifact(result.checkpoint.uri, link_text=f"checkpoint step {result.checkpoint.step}",
                             key="checkpoint", description=f"{run_id}: last committed checkpoint")
    create_link_artifact(result.model_uri, link_text="final model", key="model",
                         description=f"{run_id}: final Hugging Face model dir")
    return summary


def _publish_mlflow_link(tracking_uri: str, mlflow_run_id: str) -> None:
    from mlflow import MlflowClient

    experiment_id = MlflowClient(tracking_uri=tracking_uri).get_run(mlflow_run_id).info.experiment_id
    url = mlflow_run_url(tracking_uri, experiment_id, mlflow_run_id)
    if url:
        create_link_artifact(url, link_text=f"MLflow run {mlflow_run_id}", key="mlflow-run")
    else:
        create_markdown_artifact(mlflow_local_note(tracking_uri, mlflow_run_id), key="mlflow-run")
