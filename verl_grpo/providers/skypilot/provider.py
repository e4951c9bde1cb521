"""SkyPilot provider: training runs as a managed job (or job group) named `verl-grpo-{run_id}`, its held-out
eval (vLLM on GPUs) as a task named `verl-grpo-{run_id}-eval`.

The name makes submission idempotent: a retry of the same run finds the live job and reattaches
instead of launching a second one. All SkyPilot calls go through `boundary` (a fake in tests).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType

import yaml

from verl_grpo.config import RunConfig
from verl_grpo.contracts import Cluster, DatasetVersion, Job, JobState, RunCost, TrainSpec
from verl_grpo.errors import ConfigError, InfraError, Preempted, TrainingError
from verl_grpo.providers.skypilot import templates
from verl_grpo.providers.skypilot.checks import require_remote_store, with_spot_choice
from verl_grpo.store import Store, filesystem_for, strip_scheme
from verl_grpo.store_layout import run_config

log = logging.getLogger(__name__)

NAME = "skypilot"

# Managed jobs: `sky.jobs.ManagedJobStatus` values. tests/integration/test_sky_status_enums.py checks that these
# tables cover SkyPilot's enum exactly, so a status added upstream fails a test instead of a run.
LIVE = {"PENDING", "SUBMITTED", "STARTING", "RUNNING", "RECOVERING", "CANCELLING", "WINDING_DOWN"}
_PHASES = {
    "PENDING": "PENDING", "SUBMITTED": "PENDING", "STARTING": "PENDING",
    "RUNNING": "RUNNING", "WINDING_DOWN": "RUNNING", "RECOVERING": "RECOVERING",
    "SUCCEEDED": "SUCCEEDED", "CANCELLING": "CANCELLED", "CANCELLED": "CANCELLED",
}
FAILURES = {"FAILED", "FAILED_SETUP", "FAILED_PRECHECKS", "FAILED_NO_RESOURCE", "FAILED_CONTROLLER"}

# Jobs on an existing cluster (`sky exec`): `sky.skylet.job_lib.JobStatus` values.
CLUSTER_LIVE = {"INIT", "PENDING", "SETTING_UP", "RUNNING"}
_CLUSTER_PHASES = {"INIT": "PENDING", "PENDING": "PENDING", "SETTING_UP": "RUNNING", "RUNNING": "RUNNING",
                   "SUCCEEDED": "SUCCEEDED", "CANCELLED": "CANCELLED"}
CLUSTER_FAILURES = {"FAILED", "FAILED_SETUP", "FAILED_DRIVER"}
CLUSTER_JOB_SEP = "/"
"""Job.id of a cluster job is `{cluster}/{job id}` (SkyPilot cluster names contain no `/`)."""


ENV_BOUNDARY = "VERL_GRPO_SKY_BOUNDARY"
"""A module to use in place of SkyPilot (`verl_grpo.providers.skypilot.boundary`): the same functions, e.g. a local
rehearsal of the cloud or a test double. The provider names no such module itself; whoever runs it chooses."""
DEFAULT_BOUNDARY = "verl_grpo.providers.skypilot.boundary"


def boundary_from(env: Mapping[str, str]) -> ModuleType:
    """SkyPilot itself, or the module `env` names in ENV_BOUNDARY; ConfigError in one line when that cannot load."""
    name = env.get(ENV_BOUNDARY) or DEFAULT_BOUNDARY
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ConfigError(f"{ENV_BOUNDARY}={name} does not import ({e}); unset it to launch with SkyPilot, or "
                          "install the package that provides it") from None


class SkyPilotProvider:
    """Provider `skypilot`: managed jobs on cloud GPUs, recovered by SkyPilot after spot preemptions."""

    name = NAME
    evaluates_on_cluster = True  # vLLM on the cluster's GPUs, one SkyPilot task per eval
    backends = ("verl",)
    """The trainer backends its task templates launch."""

    def __init__(self, boundary: ModuleType | None = None, env: Mapping[str, str] | None = None):
        self.env = os.environ if env is None else env
        self.sky = boundary or boundary_from(self.env)

    def up(self, cfg: RunConfig, run_id: str) -> Cluster:
        """Managed jobs provision their own clusters at submit; this only names the run's compute.

        Holds nothing: the Cluster names the run and where its resolved config is stored, so any provider built
        later (another process, a retry, teardown after a crash) submits and tears down the same way."""
        if not cfg.infra.accelerators:
            raise ConfigError("infra.accelerators is not set; the skypilot provider needs e.g. "
                              "infra.accelerators=H100:8")
        config_uri = Store.from_config(cfg.storage).url(run_config(run_id))
        if cfg.skypilot.cluster:
            if cfg.skypilot.shape != "multinode":
                raise ConfigError(f"skypilot.cluster runs one task with `sky exec`; skypilot.shape="
                                  f"{cfg.skypilot.shape!r} needs a job group: set skypilot.shape=multinode or unset "
                                  "skypilot.cluster")
            # The user's cluster, named only (no SkyPilot call: the dry run stays offline); submit() checks it is UP.
            return Cluster(provider=NAME, name=cfg.skypilot.cluster, workdir=templates.REMOTE_WORKDIR, run_id=run_id,
                           config_uri=config_uri, store_endpoint=cfg.storage.endpoint_url, reused=True)
        name = templates.job_name(run_id)
        endpoints = {}
        if cfg.skypilot.shape == "job_group":
            endpoints = {s.task: f"http://{s.task}-0.{name}:{s.port}" for s in templates.job_group_services(cfg)}
        return Cluster(provider=NAME, name=name, workdir=templates.REMOTE_WORKDIR, endpoints=endpoints,
                       run_id=run_id, config_uri=config_uri, store_endpoint=cfg.storage.endpoint_url)

    def submit(self, cluster: Cluster, spec: TrainSpec) -> Job:
        """Reattach to a live job named for this run, else render, validate and launch a new one."""
        cfg = self._as_rendered(run_config_of(cluster))
        return self._launch(cfg, templates.job_name(spec.run_id), lambda: templates.render(cfg, spec, self.env))

    def submit_eval(self, cfg: RunConfig, run_id: str, model_uri: str, dataset: DatasetVersion) -> Job:
        """Reattach to the run's live eval task, else write its spec to the store and launch it (vLLM on GPUs).

        The task reads the model and the dataset from the store and writes the per-problem table and the
        EvalReport back (`runs/{run_id}/eval/{split}.json`); poll it with status/logs like a training job.
        """
        cfg = self._as_rendered(cfg)
        if model_uri.startswith("file://") or Path(model_uri).exists():
            raise ConfigError(f"model {model_uri!r} is on this machine, out of the eval task's reach; evaluate the "
                              f"run's model in the store ({cfg.storage.uri}/runs/<run_id>/model)")
        from verl_grpo.evaluate.vllm_runner import plan_spec, write_spec
        from verl_grpo.trainers.verl.node_reward import node_config, node_reward

        _, gpus = templates.eval_accelerators(cfg)
        store = Store.from_config(cfg.storage)

        def render() -> templates.RenderedTask:
            # The node scores with the run's own function, fetched from the store to where its spec says it is.
            reward = node_reward(cfg, store, templates.REMOTE_WORKDIR)
            spec = plan_spec(node_config(cfg, reward), model_uri, dataset, run_id, tensor_parallel_size=gpus)
            return templates.render_eval(cfg, run_id, write_spec(spec, store), self.env, reward=reward)

        return self._launch(cfg, templates.eval_job_name(run_id), render)

    def _as_rendered(self, cfg: RunConfig) -> RunConfig:
        """The checks a launch makes before rendering (remote store), and cfg with spot only where it is sold."""
        require_remote_store(cfg)
        cfg, warning = with_spot_choice(cfg, self.sky)
        if warning:
            log.warning(warning)
        return cfg

    def status(self, job: Job) -> JobState:
        if (cj := _cluster_job(job)) is not None:
            return self._cluster_job_state(job, *cj)
        record = self._record(job)
        if record is None:
            raise InfraError(f"managed job {job.name} (id {job.id}) is not in `sky jobs queue`; check the jobs "
                             "controller")
        return job_state(record)

    def logs(self, job: Job, follow: bool = False) -> Iterator[str]:
        if (cj := _cluster_job(job)) is not None:
            yield from self.sky.tail_cluster_logs(cj[0], cj[1], follow)
            return
        yield from self.sky.tail_logs(int(job.id), follow)

    def cancel(self, job: Job) -> None:
        if (cj := _cluster_job(job)) is not None:
            record = self._cluster_record(*cj)
            if record is not None and record.status in CLUSTER_LIVE:
                self.sky.cancel_cluster_job(*cj)
            return
        record = self._record(job)
        if record is not None and record.status in LIVE:
            self.sky.cancel(int(job.id))

    def down(self, cluster: Cluster) -> None:
        """Managed-job clusters are torn down by SkyPilot; cancel any still-live job of this run (crash cleanup).

        An existing cluster (skypilot.cluster) is the user's: it stays up, only this run's live jobs are cancelled.
        """
        names = templates.run_job_names(cluster.run_id) if cluster.run_id else {cluster.name}
        if cluster.reused:
            for record in self._cluster_jobs(cluster.name):
                if record.name in names and record.status in CLUSTER_LIVE:
                    self.sky.cancel_cluster_job(cluster.name, record.job_id)
            return
        for record in self.sky.queue():
            if record.name in names and record.status in LIVE:
                self.sky.cancel(record.job_id)

    def run_cost(self, cfg: RunConfig, run_id: str) -> RunCost | None:
        """The run's actual cloud cost from the timelines of its ended training and eval managed jobs (retries
        included); None on an existing cluster (skypilot.cluster: the user's machines, billed whatever runs)."""
        if cfg.skypilot.cluster:
            return None
        from verl_grpo.providers.skypilot.cost import actual_cost

        names = templates.run_job_names(run_id)
        launched, fallback = with_spot_choice(cfg, self.sky)  # priced as launched: on demand where no spot is sold
        cost = actual_cost(launched, run_id, [r for r in self.sky.queue() if r.name in names], self.sky)
        return cost.model_copy(update={"warnings": [fallback]}) if fallback else cost

    def _launch(self, cfg: RunConfig, name: str, render: Callable[[], templates.RenderedTask]) -> Job:
        """Reattach to the live job called `name`, else render (only then) and launch it as a managed job."""
        if cfg.skypilot.cluster:
            return self._exec_on_cluster(cfg, name, render)
        live = self._live_job(name)
        if live is not None:
            return Job(provider=NAME, id=str(live.job_id), name=name)
        rendered = render()
        secrets = _secrets_for(rendered, cfg, self.env)
        try:
            job_id = self.sky.launch_managed(rendered.yaml, name, secrets, rendered.is_job_group)
        except Exception as e:  # SkyPilot raises many types; classify, never swallow.
            raise _launch_error(self.sky, e) from e
        return Job(provider=NAME, id=str(job_id), name=name)

    def _exec_on_cluster(self, cfg: RunConfig, name: str, render: Callable[[], templates.RenderedTask]) -> Job:
        """`sky exec` this task on the existing cluster, or reattach to its live job of the same name.

        The Ray dashboard of a cluster launched from these templates is at `sky status --endpoint 8265 CLUSTER`.
        """
        cluster = cfg.skypilot.cluster
        status = self.sky.cluster_status(cluster)
        if status != "UP":
            raise ConfigError(f"skypilot.cluster {cluster!r} is {status or 'not known to SkyPilot'} (`sky status`); "
                              f"start it with `sky start {cluster}`, or unset skypilot.cluster to launch a managed job")
        live = [r for r in self.sky.cluster_queue(cluster) if r.name == name and r.status in CLUSTER_LIVE]
        if live:
            return Job(provider=NAME, id=f"{cluster}{CLUSTER_JOB_SEP}{max(r.job_id for r in live)}", name=name)
        rendered = render()
        secrets = _secrets_for(rendered, cfg, self.env)
        try:
            job_id = self.sky.exec_on_cluster(cluster, rendered.yaml, secrets)
        except Exception as e:  # SkyPilot raises many types; classify, never swallow.
            raise _launch_error(self.sky, e) from e
        return Job(provider=NAME, id=f"{cluster}{CLUSTER_JOB_SEP}{job_id}", name=name)

    def _cluster_jobs(self, cluster: str) -> list:
        status = self.sky.cluster_status(cluster)
        return self.sky.cluster_queue(cluster) if status == "UP" else []

    def _cluster_record(self, cluster: str, job_id: int):
        return next((r for r in self._cluster_jobs(cluster) if r.job_id == job_id), None)

    def _cluster_job_state(self, job: Job, cluster: str, job_id: int) -> JobState:
        status = self.sky.cluster_status(cluster)
        if status != "UP":
            # The machines under a running job went away (spot preemption, or stopped): retryable by type.
            raise Preempted(f"job {job.name} on cluster {cluster}: the cluster is {status or 'gone'}; "
                            f"`sky start {cluster}` (or relaunch it) and retry to resume from the last checkpoint")
        record = next((r for r in self.sky.cluster_queue(cluster) if r.job_id == job_id), None)
        if record is None:
            raise InfraError(f"job {job_id} ({job.name}) is not in `sky queue {cluster}`; check the cluster")
        return cluster_job_state(cluster, record)

    def _live_job(self, name: str):
        live = [r for r in self.sky.queue() if r.name == name and r.status in LIVE]
        return max(live, key=lambda r: r.job_id) if live else None

    def _record(self, job: Job):
        return next((r for r in self.sky.queue() if str(r.job_id) == job.id), None)


def run_config_of(cluster: Cluster) -> RunConfig:
    """The run's resolved config, read from where the Cluster says it is stored."""
    if not cluster.config_uri:
        raise InfraError(f"cluster {cluster.name} names no run config; bring it up with the skypilot provider's up()")
    try:
        fs = filesystem_for(cluster.config_uri, cluster.store_endpoint)
        with fs.open(strip_scheme(cluster.config_uri), "r") as f:
            return RunConfig.model_validate(yaml.safe_load(f))
    except FileNotFoundError:
        raise InfraError(f"run config {cluster.config_uri} is missing from the store; the run was not begun there "
                         "(resolve the run first) or the store lost it") from None


def _cluster_job(job: Job) -> tuple[str, int] | None:
    """(cluster, job id) of a job started with `sky exec`; None for a managed job."""
    cluster, sep, job_id = job.id.rpartition(CLUSTER_JOB_SEP)
    return (cluster, int(job_id)) if sep else None


def _secrets_for(rendered: templates.RenderedTask, cfg: RunConfig, env: Mapping[str, str]) -> dict[str, str]:
    """The values of exactly the secrets the rendered YAML declares (the services' token generated when unset)."""
    values = templates.launch_secrets(cfg, env)
    return {k: values[k] for k in rendered_secret_names(rendered.yaml)}


def rendered_secret_names(yaml_text: str) -> list[str]:
    """Secret names the rendered YAML declares (all documents of a job group)."""
    names: list[str] = []
    for doc in yaml.safe_load_all(yaml_text):
        for key in (doc or {}).get("secrets") or {}:
            if key not in names:
                names.append(key)
    return names


def job_state(record) -> JobState:
    """SkyPilot's managed-job status → JobState; failures raise typed errors the flow retries (or not) by type.

    Decided by the status enum and recovery_count only, never by failure_reason text (it is only quoted).
    SkyPilot itself tells preemptions from program failures: a preempted cluster is RECOVERING (recovery_count
    rises), while FAILED always means the user program failed (after max_restarts_on_errors restarts).
    """
    status, reason = record.status, record.failure_reason
    if status in _PHASES:
        return JobState(phase=_PHASES[status], recovery_count=record.recovery_count, failure_reason=reason)
    where = f"managed job {record.name} (id {record.job_id}, recovered {record.recovery_count}x)"
    if status == "FAILED_SETUP":
        raise ConfigError(f"{where}: FAILED_SETUP: the task's setup commands failed ({reason}); "
                          f"check `sky jobs logs {record.job_id}` and the setup section of the task YAML")
    if status == "FAILED_PRECHECKS":
        raise ConfigError(f"{where}: FAILED_PRECHECKS: SkyPilot rejected the task before provisioning ({reason}); "
                          "fix the resources (accelerators, infra, ports) in the run config")
    if status == "FAILED_NO_RESOURCE" and record.recovery_count > 0:
        raise Preempted(f"{where}: FAILED_NO_RESOURCE after {record.recovery_count} recoveries: preempted, and no "
                        f"capacity to recover on ({reason}); a retry resumes from the last checkpoint")
    if status == "FAILED_NO_RESOURCE":
        raise InfraError(f"{where}: FAILED_NO_RESOURCE: no capacity for the requested resources ({reason}); "
                         "retry later, allow more clouds/regions, or set infra.spot=false")
    if status == "FAILED_CONTROLLER":
        raise InfraError(f"{where}: FAILED_CONTROLLER: the jobs controller failed ({reason}); "
                         "check `sky jobs logs --controller` and retry")
    if status == "FAILED":
        raise TrainingError(f"{where}: FAILED: the job's command (training or eval) exited with an error ({reason}); "
                            f"see `sky jobs logs {record.job_id}`")
    raise InfraError(f"{where}: unknown SkyPilot status {status!r}; upgrade verl-grpo's status mapping")


def cluster_job_state(cluster: str, record) -> JobState:
    """A `sky exec` job's `JobStatus` → JobState, or a typed error (by status, never by message text)."""
    status = record.status
    if status in _CLUSTER_PHASES:
        return JobState(phase=_CLUSTER_PHASES[status])
    where = f"job {record.name} (id {record.job_id}) on cluster {cluster}"
    if status == "FAILED_SETUP":
        raise ConfigError(f"{where}: FAILED_SETUP: the job's setup failed; see `sky logs {cluster} {record.job_id}`")
    if status == "FAILED_DRIVER":
        raise InfraError(f"{where}: FAILED_DRIVER: SkyPilot's job driver died (e.g. the head ran out of memory); "
                         f"see `sky logs {cluster} {record.job_id}` and retry")
    if status == "FAILED":
        raise TrainingError(f"{where}: FAILED: the job's command (training or eval) exited with an error; "
                            f"see `sky logs {cluster} {record.job_id}`")
    raise InfraError(f"{where}: unknown SkyPilot job status {status!r}; upgrade verl-grpo's status mapping")


def _launch_error(sky, exc: Exception) -> Exception:
    if sky.is_no_cloud_access(exc):
        return InfraError(f"SkyPilot has no cloud access: {exc}. Run `sky check` to enable a cloud; nothing was "
                          "launched")
    if isinstance(exc, (ValueError, TypeError)):
        return ConfigError(f"SkyPilot rejected the task: {exc}")
    return InfraError(f"sky.jobs.launch failed: {type(exc).__name__}: {exc}")
