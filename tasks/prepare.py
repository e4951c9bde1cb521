from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.policy import RETRY_DELAYS_S, retry_on_infra_errors
from verl_grpo import pipeline
from verl_grpo.config import RunConfig
from verl_grpo.contracts import DatasetVersion


@task(name="prepare-data", cache_policy=NO_CACHE, retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_on_infra_errors)
def prepare_data(cfg: RunConfig) -> DatasetVersion:
    """verl-format parquet in the store; content-hashed, so a repeat is a cache hit."""
    return pipeline.prepare(cfg)
