"""The Provider interface: where training runs. A new cloud is one new module registered in PROVIDERS."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from verl_grpo.config import RunConfig
from verl_grpo.contracts import Cluster, Job, JobState, TrainSpec


class Provider(Protocol):
    name: str

    def up(self, cfg: RunConfig, run_id: str) -> Cluster:
        """Bring up (or reuse) the compute for a run."""

    def submit(self, cluster: Cluster, spec: TrainSpec) -> Job:
        """Start the training job described by spec; reattach if a job of the same name is alive."""

    def status(self, job: Job) -> JobState:
        """Current phase of the job (non-blocking)."""

    def logs(self, job: Job, follow: bool = False) -> Iterator[str]:
        """Lines of the job's log, from the start; with follow, until the job ends."""

    def cancel(self, job: Job) -> None:
        """Stop the job; idempotent."""

    def down(self, cluster: Cluster) -> None:
        """Release the compute; idempotent and safe after a crash."""
