"""`verl-grpo jobs`: list, follow and cancel a run's SkyPilot jobs by run id.

The same provider a launch builds talks to SkyPilot (or to the module VERL_GRPO_SKY_BOUNDARY names in its place,
e.g. the local rehearsal's), and the jobs are found by the names the provider gives them: `verl-grpo-{run_id}` for
training and `verl-grpo-{run_id}-eval` for the held-out eval. Managed jobs by default; with `cluster`, the jobs that
ran with `sky exec` on that existing cluster.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from verl_grpo.contracts import Job
from verl_grpo.errors import ConfigError
from verl_grpo.extras import require
from verl_grpo.providers.skypilot import templates
from verl_grpo.providers.skypilot.provider import CLUSTER_JOB_SEP, CLUSTER_LIVE, LIVE, NAME, SkyPilotProvider


@dataclass(frozen=True)
class RunJob:
    """One SkyPilot job of a run, as `sky jobs queue` (or `sky queue CLUSTER`) lists it."""

    job: Job
    status: str
    recovery_count: int
    failure_reason: str | None
    live: bool


def provider(env: Mapping[str, str] | None = None) -> SkyPilotProvider:
    """The provider a launch would build in this environment (real SkyPilot, or the rehearsal)."""
    require("cloud", "verl-grpo jobs")
    return SkyPilotProvider(env=env)


def queue(sky: SkyPilotProvider, cluster: str | None = None) -> list[RunJob]:
    """Every job SkyPilot lists (managed jobs, or the jobs of `cluster`), newest first."""
    if cluster is None:
        records, live = sky.sky.queue(), LIVE
    else:
        if sky.sky.cluster_status(cluster) != "UP":
            raise ConfigError(f"--cluster {cluster!r} is not an UP SkyPilot cluster (`sky status`); check the name")
        records, live = sky.sky.cluster_queue(cluster), CLUSTER_LIVE
    prefix = f"{cluster}{CLUSTER_JOB_SEP}" if cluster else ""
    jobs = [RunJob(job=Job(provider=NAME, id=f"{prefix}{r.job_id}", name=r.name), status=r.status,
                   recovery_count=r.recovery_count, failure_reason=r.failure_reason, live=r.status in live)
            for r in records]
    return sorted(jobs, key=lambda j: int(j.job.id.rpartition(CLUSTER_JOB_SEP)[2]), reverse=True)


def run_jobs(sky: SkyPilotProvider, run_id: str, cluster: str | None = None) -> list[RunJob]:
    """The run's training and eval jobs, newest first (a relaunch or a resume adds a job of the same name)."""
    names = templates.run_job_names(run_id)
    return [j for j in queue(sky, cluster) if j.job.name in names]


def queue_lines(jobs: list[RunJob]) -> list[str]:
    """A table of jobs as `sky jobs queue` shows them: id, name, status, recoveries, failure reason."""
    if not jobs:
        return ["no SkyPilot jobs"]
    width = max(len(j.job.name) for j in jobs)
    lines = [f"{'ID':>6}  {'NAME':<{width}}  {'STATUS':<18}  RECOVERIES  FAILURE"]
    lines += [f"{j.job.id:>6}  {j.job.name:<{width}}  {j.status:<18}  {j.recovery_count:>10}  {j.failure_reason or '-'}"
              for j in jobs]
    return lines


def logs(sky: SkyPilotProvider, run_id: str, *, follow: bool, eval_task: bool = False,
         cluster: str | None = None) -> Iterator[str]:
    """The log of the run's newest training (or eval) job from its start; with follow, until the job ends."""
    name = templates.eval_job_name(run_id) if eval_task else templates.job_name(run_id)
    found = [j for j in run_jobs(sky, run_id, cluster) if j.job.name == name]
    if not found:
        where = f"`sky queue {cluster}`" if cluster else "`sky jobs queue`"
        raise ConfigError(f"run_id {run_id!r}: no job named {name} in {where}; check the run id "
                          "(`verl-grpo jobs queue`)")
    yield from sky.logs(found[0].job, follow=follow)


def cancel(sky: SkyPilotProvider, run_id: str, cluster: str | None = None) -> list[RunJob]:
    """Cancel every live job of the run (training and eval); returns those cancelled (none when all have ended).
    On an existing cluster only the run's jobs stop, the cluster stays up."""
    found = run_jobs(sky, run_id, cluster)
    if not found:
        raise ConfigError(f"run_id {run_id!r}: no job named {templates.job_name(run_id)} or "
                          f"{templates.eval_job_name(run_id)}; check the run id (`verl-grpo jobs queue`)")
    live = [j for j in found if j.live]
    for j in live:
        sky.cancel(j.job)
    return live
