from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from tasks.policy import RETRY_DELAYS_S, retry_on_infra_errors
from tasks.progress import TrainingProgressArtifacts
from verl_grpo import pipeline
from verl_grpo.config import RunConfig
from verl_grpo.contracts import Cluster, DatasetVersion, TrainResult

TRAIN_CONCURRENCY_TAG = "verl-grpo-train"
"""Tag of every train task run; a tag concurrency limit of 1 on it (`make serve` sets it) keeps even ad-hoc
runs from training at the same time on one server."""


@task(name="train", cache_policy=NO_CACHE, retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_on_infra_errors, tags=[TRAIN_CONCURRENCY_TAG])
def train(cfg: RunConfig, dataset: DatasetVersion, cluster: Cluster, run_id: str) -> TrainResult:
    """Run training on the cluster; a retry (after preemption) resumes from the last committed checkpoint.

    Trainer log lines go to the Prefect log; each step updates the `training-progress` and `training-rewards`
    artifacts.
    """
    logger = get_run_logger()
    progress = TrainingProgressArtifacts(run_id, cfg.algorithm.total_steps)
    return pipeline.train(cfg, dataset, cluster, run_id, on_line=logger.info, on_progress=progress)
