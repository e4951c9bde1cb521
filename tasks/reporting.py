from __future__ import annotations

from prefect import task
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from verl_grpo.config import RunConfig
from verl_grpo.contracts import DatasetVersion, EvalReport, ModelVersion, TrainResult
from verl_grpo.models import model_short_name
from verl_grpo.summary import summary_dict, summary_markdown


def run_tags(cfg: RunConfig) -> list[str]:
    return [cfg.dataset.name, model_short_name(cfg.model.name), cfg.infra.provider, cfg.trainer.backend]


@task(name="publish-summary", cache_policy=NO_CACHE)
def publish_summary(cfg: RunConfig, run_id: str, dataset: DatasetVersion, result: TrainResult, report: EvalReport,
                    base: EvalReport, version: ModelVersion) -> dict:
    """Markdown run summary and links (checkpoint, model) as Prefect artifacts; returns the summary."""
    summary = summary_dict(cfg, run_id, dataset, result, report, base, version)
    create_markdown_artifact(summary_markdown(summary), key="run-summary", description=f"verl-grpo run {run_id}")
    if result.checkpoint:
        create_link_artifact(result.checkpoint.uri, link_text="last checkpoint", key="checkpoint")
    create_link_artifact(result.model_uri, link_text="final model", key="model")
    return summary
