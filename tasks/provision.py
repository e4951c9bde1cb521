from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from verl_grpo import plain_steps
from verl_grpo.chain import ResolvedRun
from verl_grpo.contracts import Cluster
from verl_grpo_tasks.policy import RETRIED_STEP


@task(name="provision", **RETRIED_STEP)
def provision(run: ResolvedRun) -> Cluster:
    return plain_steps.provision(run)


@task(name="teardown", cache_policy=NO_CACHE)
def teardown(run: ResolvedRun, cluster: Cluster) -> None:
    plain_steps.teardown(run, cluster)
