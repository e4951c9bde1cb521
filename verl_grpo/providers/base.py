"""The Provider interface: where training runs. A new cloud is one new module registered in PROVIDERS."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Protocol

from verl_grpo.config import RunConfig
from verl_grpo.contracts import Cluster, DatasetVersion, Job, JobState, RunCost, TrainSpec

log = logging.getLogger(__name__)

LineSink = Callable[[str], None]
"""Where a job's log lines go, one call per line."""


class Provider(Protocol):
    name: str
    evaluates_on_cluster: bool
    """True: a run's trained model is evaluated by a job on this provider (`submit_eval`); False: on this machine."""

    def up(self, cfg: RunConfig, run_id: str) -> Cluster:
        """Bring up (or reuse) the compute for a run."""

    def submit(self, cluster: Cluster, spec: TrainSpec) -> Job:
        """Start the training job described by spec; reattach if a job of the same name is alive."""

    def submit_eval(self, cfg: RunConfig, run_id: str, model_uri: str, dataset: DatasetVersion) -> Job:
        """Start (or reattach to) the held-out eval of a run's trained model; only where evaluates_on_cluster.
        The job writes the run's EvalReport to the store."""

    def status(self, job: Job) -> JobState:
        """Current phase of the job (non-blocking)."""

    def logs(self, job: Job, follow: bool = False) -> Iterator[str]:
        """Lines of the job's log, from the start; with follow, until the job ends."""

    def cancel(self, job: Job) -> None:
        """Stop the job; idempotent."""

    def down(self, cluster: Cluster) -> None:
        """Release the compute; idempotent and safe after a crash."""

    def run_cost(self, cfg: RunConfig, run_id: str) -> RunCost | None:
        """What the run's jobs cost on this provider, from their timelines; None where nothing is billed."""


def follow_job(provider: Provider, job: Job, on_line: LineSink | None = None) -> JobState:
    """Stream a job's log to on_line (default: this module's logger) until it ends, then its final state; the job
    is cancelled if following it fails or is interrupted (a retry then starts or reattaches to a clean one)."""
    sink = on_line or log.info
    try:
        for line in provider.logs(job, follow=True):
            sink(line)
    except BaseException:
        provider.cancel(job)
        raise
    return provider.status(job)
