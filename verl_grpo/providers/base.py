"""The Provider interface: where training runs. A new cloud is one new module registered in PROVIDERS."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from typing import Protocol

from verl_grpo.config import RunConfig
from verl_grpo.contracts import Cluster, DatasetVersion, Job, JobState, RunCost, TrainSpec

log = logging.getLogger(__name__)

LineSink = Callable[[str], None]
"""Where a job's log lines go, one call per line."""

_PROGRESS_BAR = re.compile(r"\d+%\|[^|]*\|\s*[\d.]+[kMG]?/[\d.?]+[kMG]?"  # 40%|████      | 4/10
                           r"|\[\d+:\d+(?::\d+)?(?:<[^,\]]*)?,\s*[^\]]*(?:/s|s/\w+)\]")  # [00:01<00:02, 3.1it/s]
"""A tqdm bar: `Map:  40%|████      | 4/10 [00:01<00:02, 3.1 examples/s]`, or one without a total (`[00:01, 3it/s]`)."""


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


def readable_line(line: str) -> str | None:
    """A job's log line as a reader of the run's log wants it; None for a blank line or a progress bar. A bar
    redraws itself with carriage returns, which a log read with universal newlines splits into one line per redraw
    (and a blank one before the first): a run's log would open with screens of them."""
    line = line.rstrip().rsplit("\r", 1)[-1]
    return None if not line.strip() or _PROGRESS_BAR.search(line) else line


def follow_job(provider: Provider, job: Job, on_line: LineSink | None = None) -> JobState:
    """Stream a job's log to on_line (default: this module's logger) until it ends, then its final state; blank
    lines and progress bars are left out (`readable_line`; the job's own log file keeps them). The job is cancelled
    if following it fails or is interrupted (a retry then starts or reattaches to a clean one)."""
    sink = on_line or log.info
    try:
        for line in provider.logs(job, follow=True):
            if (shown := readable_line(line)) is not None:
                sink(shown)
    except BaseException:
        provider.cancel(job)
        raise
    return provider.status(job)
