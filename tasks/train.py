from __future__ import annotations

from prefect import task
from prefect.logging import get_run_logger

from verl_grpo import plain_steps
from verl_grpo.chain import ResolvedRun
from verl_grpo.config.placement import placement
from verl_grpo.contracts import Cluster, DatasetVersion, TrainResult
from verl_grpo_tasks.policy import RETRIED_STEP
from verl_grpo_tasks.progress import TrainingProgressArtifacts

TRAIN_CONCURRENCY_TAG = "verl-grpo-train"
"""Tag of every train task run on this machine (infra.provider=local); a tag concurrency limit of 1 on it (`make
serve` sets it) keeps even ad-hoc runs from training at the same time on one server."""
CLOUD_TRAIN_CONCURRENCY_TAG = "verl-grpo-train-cloud"
"""Tag of every train task run on cloud GPUs (SkyPilot) instead: a limit of its own (`make serve` sets it), so a
nightly cloud run, hours on its cluster, never waits for a CPU training on this machine nor holds one up."""


def train_tag(run: ResolvedRun) -> str:
    return TRAIN_CONCURRENCY_TAG if placement(run.cfg).on_this_machine else CLOUD_TRAIN_CONCURRENCY_TAG


@task(name="train", **RETRIED_STEP)
def train(run: ResolvedRun, dataset: DatasetVersion, cluster: Cluster) -> TrainResult:
    """Run training on the cluster; a retry (after preemption) resumes from the last committed checkpoint.

    Trainer log lines go to the Prefect log; each step updates the `training-progress` and `training-rewards`
    artifacts.
    """
    logger = get_run_logger()
    progress = TrainingProgressArtifacts(run.run_id, run.cfg.algorithm.total_steps)
    return plain_steps.train(run, dataset, cluster, on_line=logger.info, on_progress=progress)
