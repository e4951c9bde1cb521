from __future__ import annotations

from prefect import task

from verl_grpo import plain_steps
from verl_grpo.chain import ResolvedRun
from verl_grpo.contracts import DatasetVersion
from verl_grpo_tasks.policy import RETRIED_STEP


@task(name="prepare-data", **RETRIED_STEP)
def prepare_data(run: ResolvedRun) -> DatasetVersion:
    """verl-format parquet in the store; content-hashed, so a repeat is a cache hit."""
    return plain_steps.prepare(run.cfg)
