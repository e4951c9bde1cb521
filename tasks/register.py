from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.policy import RETRY_DELAYS_S, retry_on_infra_errors
from verl_grpo import pipeline
from verl_grpo.config import RunConfig
from verl_grpo.contracts import DatasetVersion, EvalReport, ModelVersion, TrainResult


@task(name="register", cache_policy=NO_CACHE, retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_on_infra_errors)
def register(cfg: RunConfig, run_id: str, dataset: DatasetVersion, result: TrainResult, report: EvalReport,
             base_report: EvalReport, tags: dict[str, str]) -> ModelVersion:
    """MLflow run + registered model version; idempotent, so a retry adds no second version."""
    return pipeline.register(cfg, run_id, dataset, result, report, base_report, tags)
