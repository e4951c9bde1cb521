from __future__ import annotations

from prefect import task

from tasks.policy import RETRIED_STEP
from verl_grpo import pipeline
from verl_grpo.chain import ResolvedRun
from verl_grpo.contracts import DatasetVersion, EvalReport, ModelVersion, TrainResult


@task(name="register", **RETRIED_STEP)
def register(run: ResolvedRun, dataset: DatasetVersion, result: TrainResult, report: EvalReport,
             base_report: EvalReport, tags: dict[str, str]) -> ModelVersion:
    """MLflow run + registered model version; idempotent, so a retry adds no second version."""
    return pipeline.register(run, dataset, result, report, base_report, tags)
