from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from tasks.policy import RETRY_DELAYS_S, retry_on_infra_errors
from verl_grpo import pipeline
from verl_grpo.config import RunConfig
from verl_grpo.contracts import Cluster, DatasetVersion, TrainResult


@task(name="train", cache_policy=NO_CACHE, retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_on_infra_errors)
def train(cfg: RunConfig, dataset: DatasetVersion, cluster: Cluster, run_id: str) -> TrainResult:
    """Run training on the cluster; a retry (after preemption) resumes from the last committed checkpoint."""
    logger = get_run_logger()
    return pipeline.train(cfg, dataset, cluster, run_id, on_line=logger.info)
