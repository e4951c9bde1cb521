from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.policy import RETRY_DELAYS_S, retry_on_infra_errors
from verl_grpo import pipeline
from verl_grpo.config import RunConfig
from verl_grpo.contracts import Cluster


@task(name="provision", cache_policy=NO_CACHE, retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_on_infra_errors)
def provision(cfg: RunConfig, run_id: str) -> Cluster:
    return pipeline.provision(cfg, run_id)


@task(name="teardown", cache_policy=NO_CACHE)
def teardown(cfg: RunConfig, cluster: Cluster) -> None:
    pipeline.teardown(cfg, cluster)
