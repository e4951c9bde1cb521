"""SkyPilotProvider against a fake `sky` boundary: launch, poll, recovery, reattach, cancel, failures.

Every call goes to a provider built for that call (`PerCall`), as `get_provider` builds them in the pipeline: what a
later call needs travels in the Cluster / Job and the store (moto S3 on loopback), never in a provider instance.
"""

from __future__ import annotations

import pytest
import yaml
from run_configs import VERL_H100_8, build_config

from verl_grpo.contracts import DatasetVersion, TrainSpec
from verl_grpo.errors import ConfigError, InfraError, Preempted, TrainingError
from verl_grpo.providers.skypilot.boundary import JobRecord, Offer
from verl_grpo.providers.skypilot.provider import SkyPilotProvider
from verl_grpo.store import Store
from verl_grpo.store_layout import run_config
from verl_grpo.trainers.verl.overrides import VerlPaths, verl_overrides


class FakeSky:
    """Scripted managed-jobs controller: each queue() call advances the job through `script`. Its catalog answers
    `offers` for any accelerators; `catalog_root` holds no local catalog unless a test points it at one."""

    catalog_root = "/nonexistent/sky-catalogs"
    offers = (Offer("aws", "p5.48xlarge", 98.32, 39.33),)

    def __init__(self, script=(("RUNNING", 0, None), ("SUCCEEDED", 0, None)), launch_error=None):
        self.script = list(script)
        self.jobs: dict[int, JobRecord] = {}
        self.launched: list[tuple[str, str, dict, bool]] = []
        self.cancelled: list[int] = []
        self.launch_error = launch_error

    def launch_managed(self, yaml_str, name, secrets, job_group):
        if self.launch_error:
            raise self.launch_error
        job_id = len(self.jobs) + 1
        self.launched.append((yaml_str, name, dict(secrets), job_group))
        self.jobs[job_id] = JobRecord(job_id, name, "PENDING")
        return job_id

    def queue(self):
        for job_id, rec in list(self.jobs.items()):
            if self.script and rec.status not in ("CANCELLED",) and job_id not in self.cancelled:
                status, recoveries, reason = self.script.pop(0)
                self.jobs[job_id] = JobRecord(job_id, rec.name, status, recoveries, reason)
        return list(self.jobs.values())

    def tail_logs(self, job_id, follow):
        yield from [f"job {job_id} step 1", f"job {job_id} step 2"]

    def cancel(self, job_id):
        self.cancelled.append(job_id)
        rec = self.jobs[job_id]
        self.jobs[job_id] = JobRecord(job_id, rec.name, "CANCELLED", rec.recovery_count)

    def is_no_cloud_access(self, exc):
        return isinstance(exc, NoCloud)

    def catalog_dir(self):
        return str(self.catalog_root)

    def kubernetes_spot_label(self):
        return None  # SkyPilot's config names no spot-labelling autoscaler

    def catalog_offers(self, accelerator, count, cloud, region, clouds):
        return list(self.offers), []


class NoCloud(Exception):
    pass


_STORE: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _store(s3_bucket):
    """The run's store: a bucket on moto, where `up` finds the run's resolved config as `resolve` stored it."""
    _STORE["uri"], _STORE["endpoint"] = s3_bucket
    yield
    _STORE.clear()


class PerCall:
    """A fresh SkyPilotProvider for each call, over the same (fake) SkyPilot."""

    def __init__(self, sky, env=None):
        self.sky, self.env = sky, env or {}

    def __getattr__(self, method):
        return getattr(SkyPilotProvider(boundary=self.sky, env=self.env), method)


def _cfg(**kw):
    cfg = build_config(*VERL_H100_8, "infra.spot=true", f"storage.uri={_STORE['uri']}",
                       f"storage.endpoint_url={_STORE['endpoint']}", *[f"{k}={v}" for k, v in kw.items()])
    Store.from_config(cfg.storage).write_text(cfg.to_yaml(), run_config("run-1"))  # as pipeline.resolve does
    return cfg


DATASET = DatasetVersion(name="gsm8k", hash="abc", uri="s3://b/store/datasets/gsm8k/abc",
                         splits={"test": "s3://b/store/datasets/gsm8k/abc/test.parquet"}, counts={"test": 4})
def _spec() -> TrainSpec:
    """The main_ppo command VerlTrainer.plan builds (the rendered run script takes its knobs from it)."""
    cfg = build_config(*VERL_H100_8, env={})
    ov = verl_overrides(cfg, {"train": "/mnt/d/train.parquet", "val": "/mnt/d/val.parquet"},
                        VerlPaths("/tmp/verl-grpo/checkpoints/run-1"), "run-1", env={})
    return TrainSpec(backend="verl", run_id="run-1", command=["python", "-m", "verl.trainer.main_ppo", *ov],
                     overrides=ov, total_steps=5)


SPEC = _spec()


def _submit(sky, env=None, cfg=None):
    provider = PerCall(sky, env)
    cluster = provider.up(cfg or _cfg(), "run-1")
    return provider, provider.submit(cluster, SPEC)


def _poll(provider, job):
    states = []
    while True:
        state = provider.status(job)
        states.append(state)
        if state.phase in ("SUCCEEDED", "CANCELLED"):
            return states


def test_success_launches_once_with_the_run_name_and_secret_values_in_memory_only():
    sky = FakeSky()
    provider, job = _submit(sky, env={"WANDB_API_KEY": "sekret"})
    assert job.name == "verl-grpo-run-1"
    yaml_str, name, secrets, group = sky.launched[0]
    assert name == "verl-grpo-run-1" and group is False
    assert secrets == {"WANDB_API_KEY": "sekret"} and "sekret" not in yaml_str
    assert [s.phase for s in _poll(provider, job)] == ["RUNNING", "SUCCEEDED"]
    assert list(provider.logs(job)) == ["job 1 step 1", "job 1 step 2"]


@pytest.mark.parametrize("offers, use_spot", [
    ((Offer("lambda", "gpu_8x_h100_sxm5", 31.92, None),), False),
    ((Offer("lambda", "gpu_8x_h100_sxm5", 31.92, None), Offer("aws", "p5.48xlarge", 98.32, 39.33)), True),
])
def test_spot_is_launched_only_where_the_local_catalog_sells_it(offers, use_spot, tmp_path, caplog):
    (tmp_path / "lambda").mkdir()
    (tmp_path / "lambda" / "vms.csv").write_text("InstanceType\n")
    sky = FakeSky()
    sky.catalog_root, sky.offers = tmp_path, offers
    _submit(sky)
    assert yaml.safe_load(sky.launched[0][0])["resources"]["use_spot"] is use_spot
    assert ("infra.spot=true but no catalog offer of H100:8 on lambda sells spot: launching on-demand" in caplog.text) \
        is not use_spot


def test_two_preemptions_then_success_surface_recovery_count():
    sky = FakeSky([("RUNNING", 0, None), ("RECOVERING", 1, None), ("RUNNING", 1, None),
                   ("RECOVERING", 2, None), ("RUNNING", 2, None), ("SUCCEEDED", 2, None)])
    provider, job = _submit(sky)
    states = _poll(provider, job)
    assert [s.phase for s in states].count("RECOVERING") == 2
    assert states[-1].phase == "SUCCEEDED" and states[-1].recovery_count == 2
    assert len(sky.launched) == 1


def test_retry_reattaches_to_live_job_by_name():
    sky = FakeSky([("RUNNING", 0, None)] * 4)
    _, first = _submit(sky)
    _, second = _submit(sky)  # a Prefect retry: a new provider instance, same run id
    assert second.id == first.id and len(sky.launched) == 1


def test_retry_after_terminal_failure_launches_anew():
    sky = FakeSky([("FAILED", 0, "exit 1")])
    provider, first = _submit(sky)
    with pytest.raises(TrainingError):
        provider.status(first)
    _, second = _submit(sky)
    assert second.id != first.id and len(sky.launched) == 2


def test_cancel_is_idempotent_and_down_cancels_live_jobs():
    sky = FakeSky([("RUNNING", 0, None)] * 10)
    provider, job = _submit(sky)
    provider.cancel(job)
    provider.cancel(job)
    assert sky.cancelled == [1]
    assert provider.status(job).phase == "CANCELLED"
    provider2, job2 = _submit(sky)
    eval_job = SkyPilotProvider(boundary=sky, env={}).submit_eval(
        _cfg(), "run-1", f"{_STORE['uri']}/runs/run-1/model", DATASET)
    PerCall(sky).down(PerCall(sky).up(_cfg(), "run-1"))  # teardown after a crash: a provider that launched nothing
    assert sky.cancelled == [1, 2, int(eval_job.id)]


def test_a_cluster_whose_config_is_not_stored_fails_in_one_line():
    sky = FakeSky()
    cluster = PerCall(sky).up(_cfg(), "run-2")  # run-2 was never resolved: no config in the store
    with pytest.raises(InfraError, match="runs/run-2/config.yaml is missing"):
        PerCall(sky).submit(cluster, SPEC.model_copy(update={"run_id": "run-2"}))
    assert sky.launched == []


@pytest.mark.parametrize(("status", "recoveries", "reason", "error", "fragment"), [
    ("FAILED_SETUP", 0, "pip failed", ConfigError, "FAILED_SETUP"),
    ("FAILED_PRECHECKS", 0, "bad ports", ConfigError, "FAILED_PRECHECKS"),
    ("FAILED_NO_RESOURCE", 0, "no H100", InfraError, "FAILED_NO_RESOURCE"),
    ("FAILED_NO_RESOURCE", 3, "no H100 to recover on", Preempted, "preempted"),
    ("FAILED_CONTROLLER", 0, "controller died", InfraError, "FAILED_CONTROLLER"),
    ("FAILED_NO_RESOURCE", 1, "capacity error", Preempted, "after 1 recoveries"),
    ("FAILED", 0, "exit code 1", TrainingError, "exited with an error"),
])
def test_failure_statuses_map_to_typed_errors(status, recoveries, reason, error, fragment):
    provider, job = _submit(FakeSky([(status, recoveries, reason)]))
    with pytest.raises(error, match=fragment) as info:
        provider.status(job)
    assert type(info.value) is error
    assert reason in str(info.value)


@pytest.mark.parametrize(("status", "recoveries", "error"), [
    ("FAILED", 3, TrainingError),  # SkyPilot recovers preemptions itself: FAILED is always the program
    ("FAILED_NO_RESOURCE", 0, InfraError),
    ("FAILED_NO_RESOURCE", 2, Preempted),
])
def test_retry_type_follows_status_and_recovery_count_never_the_message(status, recoveries, error):
    for reason in ("Spot instance preempted; recovering", "exit code 1", None):
        provider, job = _submit(FakeSky([(status, recoveries, reason)]))
        with pytest.raises(error) as info:
            provider.status(job)
        assert type(info.value) is error


def test_file_store_is_refused_before_launch(tmp_path):
    sky = FakeSky()
    provider = PerCall(sky)
    cfg = build_config(*VERL_H100_8, f"storage.uri=file://{tmp_path}/store")
    Store.from_config(cfg.storage).write_text(cfg.to_yaml(), run_config("run-1"))
    with pytest.raises(ConfigError, match="storage.uri"):
        provider.submit(provider.up(cfg, "run-1"), SPEC)
    assert sky.launched == []


def test_no_cloud_access_at_launch_is_an_infra_error_with_sky_check_advice():
    with pytest.raises(InfraError, match="sky check"):
        _submit(FakeSky(launch_error=NoCloud("No cloud is enabled")))


def test_job_group_shape_launches_a_group_with_service_endpoints():
    sky = FakeSky()
    provider = PerCall(sky)
    cluster = provider.up(_cfg(**{"skypilot.shape": "job_group", "services.enabled": "[reward]"}), "run-1")
    assert cluster.endpoints["reward-server"] == "http://reward-server-0.verl-grpo-run-1:8001"
    provider.submit(cluster, SPEC)
    yaml_str, _, secrets, group = sky.launched[0]
    # No token in the caller's environment: one is generated for the job's services, passed as a secret only.
    token = secrets["VERL_GRPO_SERVICES_TOKEN"]
    assert group is True and len(token) >= 32 and token not in yaml_str
    PerCall(FakeSky(), env={"VERL_GRPO_SERVICES_TOKEN": "tok-1"}).submit(cluster, SPEC)  # the caller's own token


class FakeCluster(FakeSky):
    """An existing cluster: `sky exec` jobs advance through `script` on each cluster_queue() call."""

    def __init__(self, script=(("RUNNING",), ("SUCCEEDED",)), status="UP"):
        super().__init__()
        self.cluster_script = list(script)
        self.status = status
        self.cluster_jobs: dict[int, JobRecord] = {}
        self.execs: list[tuple[str, str, dict]] = []
        self.cluster_cancelled: list[tuple[str, int]] = []

    def cluster_status(self, name):
        return self.status if name == "my-h100s" else None

    def exec_on_cluster(self, cluster_name, yaml_str, secrets):
        job_id = len(self.cluster_jobs) + 1
        self.execs.append((cluster_name, yaml_str, dict(secrets)))
        self.cluster_jobs[job_id] = JobRecord(job_id, yaml.safe_load(yaml_str)["name"], "PENDING")
        return job_id

    def cluster_queue(self, name):
        for job_id, rec in list(self.cluster_jobs.items()):
            if self.cluster_script and rec.status != "CANCELLED":
                (status,) = self.cluster_script.pop(0)
                self.cluster_jobs[job_id] = JobRecord(job_id, rec.name, status)
        return list(self.cluster_jobs.values())

    def tail_cluster_logs(self, name, job_id, follow):
        yield f"{name} job {job_id} step 1"

    def cancel_cluster_job(self, name, job_id):
        self.cluster_cancelled.append((name, job_id))
        rec = self.cluster_jobs[job_id]
        self.cluster_jobs[job_id] = JobRecord(job_id, rec.name, "CANCELLED")


def _exec(sky, **kw):
    provider = PerCall(sky, env={"HF_TOKEN": "hf_secret"})
    cluster = provider.up(_cfg(**{"skypilot.cluster": "my-h100s", **kw}), "run-1")
    return provider, cluster, provider.submit(cluster, SPEC)


def test_existing_cluster_runs_the_round_with_sky_exec_not_a_managed_job():
    sky = FakeCluster()
    provider, cluster, job = _exec(sky)
    assert cluster.name == "my-h100s" and sky.launched == []
    (name, yaml_str, secrets), = sky.execs
    assert name == "my-h100s" and secrets == {"HF_TOKEN": "hf_secret"} and "hf_secret" not in yaml_str
    task = yaml.safe_load(yaml_str)
    assert task["name"] == "verl-grpo-run-1" and task["resources"]["ports"] == [8265]
    assert "job_recovery" not in task["resources"]  # sky exec: no managed-job recovery
    assert "verl_grpo.trainers.verl.restore" in task["run"]
    assert job.id == "my-h100s/1"
    assert [s.phase for s in _poll(provider, job)] == ["RUNNING", "SUCCEEDED"]
    assert list(provider.logs(job)) == ["my-h100s job 1 step 1"]


def test_existing_cluster_reattaches_to_the_live_round_and_cancels_it():
    sky = FakeCluster(script=[("RUNNING",)] * 10)
    provider, cluster, first = _exec(sky)
    _, _, second = _exec(sky)  # a Prefect retry with a fresh provider
    assert second.id == first.id and len(sky.execs) == 1
    provider.cancel(first)
    provider.cancel(first)
    assert sky.cluster_cancelled == [("my-h100s", 1)]
    provider.down(cluster)  # the user's cluster stays up: nothing else to cancel, no teardown
    assert sky.cluster_cancelled == [("my-h100s", 1)] and sky.cancelled == []


@pytest.mark.parametrize(("status", "error"), [
    ("FAILED", TrainingError), ("FAILED_SETUP", ConfigError), ("FAILED_DRIVER", InfraError)])
def test_existing_cluster_job_failures_map_to_typed_errors(status, error):
    provider, _, job = _exec(FakeCluster(script=[(status,)]))
    with pytest.raises(error, match=status) as info:
        provider.status(job)
    assert type(info.value) is error


def test_existing_cluster_that_went_away_is_a_preemption():
    sky = FakeCluster(script=[("RUNNING",)] * 3)
    provider, _, job = _exec(sky)
    sky.status = "STOPPED"
    with pytest.raises(Preempted, match="STOPPED"):
        provider.status(job)


def test_existing_cluster_must_be_up_and_multinode():
    with pytest.raises(ConfigError, match="sky start my-h100s"):
        _exec(FakeCluster(status="STOPPED"))
    with pytest.raises(ConfigError, match="skypilot.shape=multinode"):
        PerCall(FakeCluster()).up(
            _cfg(**{"skypilot.cluster": "my-h100s", "skypilot.shape": "job_group"}), "run-1")
