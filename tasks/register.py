from __future__ import annotations

from prefect import task

from verl_grpo import plain_steps
from verl_grpo.chain import Evals, ResolvedRun
from verl_grpo.contracts import DatasetVersion, ModelVersion, TrainResult
from verl_grpo_tasks.policy import RETRIED_STEP


@task(name="register", **RETRIED_STEP)
def register(run: ResolvedRun, dataset: DatasetVersion, result: TrainResult, evals: Evals,
             tags: dict[str, str]) -> ModelVersion:
    """MLflow run + registered model version; idempotent, so a retry adds no second version."""
    return plain_steps.register(run, dataset, result, evals, tags)
