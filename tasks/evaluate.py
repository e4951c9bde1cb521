from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.policy import RETRY_DELAYS_S, retry_on_infra_errors
from verl_grpo import pipeline
from verl_grpo.config import RunConfig
from verl_grpo.contracts import DatasetVersion, EvalReport


@task(name="evaluate", cache_policy=NO_CACHE, retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_on_infra_errors)
def evaluate(cfg: RunConfig, model_uri: str, dataset: DatasetVersion, run_id: str) -> EvalReport:
    return pipeline.evaluate(cfg, model_uri, dataset, run_id)


@task(name="evaluate-base", cache_policy=NO_CACHE, retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_on_infra_errors)
def evaluate_base(cfg: RunConfig, dataset: DatasetVersion) -> EvalReport:
    """The base model on the same split and settings; cached in the store across runs."""
    return pipeline.evaluate_base(cfg, dataset)
