"""The only module that imports `sky`. Thin wrappers returning plain data; tests swap this module for a fake.

Everything else in the SkyPilot provider talks to SkyPilot through the functions here, so the launch,
poll and recovery logic is testable without a cloud, and SkyPilot's own loaders and catalog do the
offline validation.

Importing it turns SkyPilot's usage collection off (unless the user set its switch): SkyPilot reads the switch
when it sends, and the local API server it starts inherits this process's environment, so a library caller
that never went through the CLI or a flow is as quiet as they are.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from verl_grpo.privacy import apply_quiet_env

apply_quiet_env()


@dataclass(frozen=True)
class JobRecord:
    """One job as SkyPilot reports it: a managed job (`status` is a `sky.jobs.ManagedJobStatus` value) or a job
    on an existing cluster (`status` is a `sky.skylet.job_lib.JobStatus` value)."""

    job_id: int
    name: str
    status: str
    recovery_count: int = 0
    failure_reason: str | None = None
    task_name: str | None = None
    """The job-group task this row is of (SkyPilot lists one row per task); None where a row is the whole job."""
    submitted_at: float | None = None
    """Unix time the job was submitted."""
    start_at: float | None = None
    """Unix time SkyPilot began provisioning its cluster (None until it starts)."""
    end_at: float | None = None
    """Unix time the job ended (None while live)."""
    job_duration: float | None = None
    """Seconds the job's command ran, summed over recoveries (provisioning and recovery excluded)."""


@dataclass(frozen=True)
class Offer:
    """An instance type from SkyPilot's catalog that carries the requested accelerators."""

    cloud: str
    instance_type: str
    price: float
    """On-demand $/hour (cheapest region)."""
    spot_price: float | None
    """Spot $/hour (cheapest region); None where the cloud sells no spot capacity."""


@dataclass(frozen=True)
class RegionPrice:
    """One instance type in one region of a cloud's catalog, with its hourly prices there."""

    cloud: str
    region: str
    instance_type: str
    price: float
    """On-demand $/hour in this region."""
    spot_price: float | None
    """Spot $/hour in this region; None where none is sold."""


def load_task(yaml_str: str, secrets: Mapping[str, str] | None = None) -> Any:
    """SkyPilot's own parse of a single task YAML (schema check included); raises SkyPilot's errors."""
    import sky
    from sky.utils import yaml_utils

    config = yaml_utils.safe_load(yaml_str)
    return sky.Task.from_yaml_config(config, secrets_overrides=list((secrets or {}).items()) or None)


def load_job_group(yaml_str: str, secrets: Mapping[str, str] | None = None) -> Any:
    """SkyPilot's own parse of a multi-document job-group YAML into a Dag; raises SkyPilot's errors."""
    from sky.utils import dag_utils

    if not dag_utils.is_job_group_yaml_str(yaml_str):
        raise ValueError("not a job group: the header document must set `execution: parallel`")
    return dag_utils.load_job_group_from_yaml_str(yaml_str, secrets_overrides=list((secrets or {}).items()) or None)


def check_recovery_strategy(name: str) -> None:
    """Raise SkyPilot's ValueError when `name` is not a registered managed-job recovery strategy."""
    from sky.utils import registry

    registry.JOBS_RECOVERY_STRATEGY_REGISTRY.from_str(name)


def kubernetes_spot_label() -> tuple[str, str] | None:
    """The spot node label SkyPilot would select on Kubernetes as far as its config tells offline: the label of the
    `kubernetes.autoscaler` it names when that autoscaler provisions spot nodes (SPOT_LABEL_MAP), else None.
    (`get_spot_label` also lists the cluster's nodes, which needs the cluster.)"""
    from sky.provision.kubernetes import utils as kubernetes_utils

    autoscaler = kubernetes_utils.get_autoscaler_type()
    if autoscaler is None or autoscaler.value not in kubernetes_utils.SPOT_LABEL_MAP:
        return None
    return kubernetes_utils.SPOT_LABEL_MAP[autoscaler.value]


def catalog_offers(
    accelerator: str, count: int, cloud: str | None, region: str | None, clouds_available: list[str]
) -> tuple[list[Offer], list[str]]:
    """Instance types carrying `count` × `accelerator`, with prices, from SkyPilot's catalog; and fuzzy candidates.

    Only clouds whose catalog file is present locally are queried (SkyPilot would download others).
    """
    from sky import catalog

    offers: list[Offer] = []
    fuzzy: list[str] = []
    for name in [cloud] if cloud else clouds_available:
        types, candidates = catalog.get_instance_type_for_accelerator(
            accelerator, count, use_spot=False, region=region, clouds=name)
        fuzzy += candidates
        for itype in types or []:
            price = catalog.get_hourly_cost(itype, use_spot=False, region=region, zone=None, clouds=name)
            try:
                spot = catalog.get_hourly_cost(itype, use_spot=True, region=region, zone=None, clouds=name)
            except (AssertionError, ValueError):
                spot = None  # e.g. "Lambda Cloud does not support spot."
            offers.append(Offer(cloud=name, instance_type=itype, price=float(price),
                                spot_price=None if spot is None or spot != spot else float(spot)))
    return offers, sorted(set(fuzzy))


def catalog_region_prices(accelerator: str | None, count: int, cpus: str | None, cloud: str | None,
                          region: str | None, clouds_available: list[str], memory: str | None = None
                          ) -> list[RegionPrice]:
    """Every (cloud, region, instance type) of the local catalogs carrying `count` × `accelerator` (and at least
    `cpus` / `memory` when given), or, with no accelerator, SkyPilot's default instance type for `cpus` (e.g. "4+")
    and `memory` (e.g. "16+") in each cloud; with on-demand and spot $/hour per region. Only clouds whose catalog
    file is present locally are queried."""
    from sky import catalog

    rows: list[RegionPrice] = []
    for name in [cloud] if cloud else clouds_available:
        if accelerator:
            types, _ = catalog.get_instance_type_for_accelerator(accelerator, count, cpus=cpus, memory=memory,
                                                                 use_spot=False, region=region, clouds=name)
        else:
            default = catalog.get_default_instance_type(cpus=cpus, memory=memory, region=region, clouds=name)
            types = [default] if default else []
        for itype in types or []:
            for r in catalog.get_region_zones_for_instance_type(itype, False, clouds=name):
                if region and r.name != region:
                    continue
                price = catalog.get_hourly_cost(itype, use_spot=False, region=r.name, zone=None, clouds=name)
                try:
                    spot = catalog.get_hourly_cost(itype, use_spot=True, region=r.name, zone=None, clouds=name)
                except (AssertionError, ValueError):
                    spot = None  # e.g. "Lambda Cloud does not support spot."
                rows.append(RegionPrice(cloud=name, region=r.name, instance_type=itype, price=float(price),
                                        spot_price=None if spot is None or spot != spot else float(spot)))
    return rows


def catalog_dir() -> str:
    """Where SkyPilot reads its catalogs from on this machine (`~/.sky/catalogs/v8` by default)."""
    from sky.catalog import common

    return common.get_catalog_path("")


def launch_managed(yaml_str: str, name: str, secrets: Mapping[str, str], job_group: bool) -> int:
    """Submit a managed job (or job group) named `name`; returns its job id. Secrets are passed in memory only."""
    import sky

    dag_or_task = load_job_group(yaml_str, secrets) if job_group else load_task(yaml_str, secrets)
    job_ids, _ = sky.get(sky.jobs.launch(dag_or_task, name=name))
    if not job_ids:
        raise RuntimeError(f"sky.jobs.launch returned no job id for {name}")
    return int(job_ids[0])


def exec_on_cluster(cluster_name: str, yaml_str: str, secrets: Mapping[str, str]) -> int:
    """Run a task on an existing cluster with `sky exec` (no provisioning); returns the cluster job id."""
    import sky

    job_id, _ = sky.get(sky.exec(load_task(yaml_str, secrets), cluster_name=cluster_name))
    return int(job_id)


def queue() -> list[JobRecord]:
    """All managed jobs of this user, refreshed from the jobs controller; none before the first managed job
    launched the controller, or after it was torn down (as `sky jobs queue` says)."""
    import sky
    from sky import exceptions

    try:
        records = sky.get(sky.jobs.queue(refresh=True))
    except exceptions.ClusterDoesNotExist:  # the controller was never launched: a first launch asks here
        return []
    except exceptions.ClusterNotUpError as e:
        if e.cluster_status is None:  # torn down
            return []
        raise
    return [_record(r, sky.jobs.ManagedJobStatus) for r in records]


def cluster_status(cluster_name: str) -> str | None:
    """The `sky.ClusterStatus` value (UP, INIT, STOPPED) of an existing cluster; None when SkyPilot has no such
    cluster."""
    import sky

    records = sky.get(sky.status(cluster_names=[cluster_name]))
    if not records:
        return None
    status = _get(records[0], "status")
    return str(getattr(status, "value", status))


def cluster_queue(cluster_name: str) -> list[JobRecord]:
    """Jobs of an existing cluster (`sky queue`), statuses as `JobStatus` values."""
    import sky
    from sky.skylet import job_lib

    return [_record(r, job_lib.JobStatus) for r in sky.get(sky.queue(cluster_name))]


def tail_cluster_logs(cluster_name: str, job_id: int, follow: bool) -> Iterator[str]:
    """Lines of a cluster job's log from the start; with follow, until the job ends."""
    import sky

    for chunk in sky.tail_logs(cluster_name, job_id, follow, preload_content=False):
        if chunk is None:
            return
        yield from chunk.splitlines()


def cancel_cluster_job(cluster_name: str, job_id: int) -> None:
    """Cancel one job on an existing cluster (the cluster stays up)."""
    import sky

    sky.get(sky.cancel(cluster_name, job_ids=[job_id]))


def tail_logs(job_id: int, follow: bool) -> Iterator[str]:
    """Lines of a managed job's log from the start; with follow, until the job ends."""
    import sky

    for chunk in sky.jobs.tail_logs(job_id=job_id, follow=follow, preload_content=False):
        if chunk is None:
            return
        yield from chunk.splitlines()


def cancel(job_id: int) -> None:
    """Cancel a managed job (SkyPilot tears its clusters down)."""
    import sky

    sky.get(sky.jobs.cancel(job_ids=[job_id]))


def is_no_cloud_access(exc: BaseException) -> bool:
    """True for SkyPilot's 'no cloud enabled' error (the user runs `sky check`)."""
    from sky import exceptions

    return isinstance(exc, exceptions.NoCloudAccessError)


def _get(raw: Any, key: str) -> Any:
    return raw.get(key) if isinstance(raw, Mapping) else getattr(raw, key, None)


def _record(raw: Any, status_enum: Any) -> JobRecord:
    """A plain JobRecord; the status goes through SkyPilot's own enum, so an unknown status fails here, loudly."""
    status = _get(raw, "status")
    return JobRecord(
        job_id=int(_get(raw, "job_id")),
        name=str(_get(raw, "job_name") or ""),
        status=status_enum(getattr(status, "value", status)).value,
        recovery_count=int(_get(raw, "recovery_count") or 0),
        failure_reason=_get(raw, "failure_reason"),
        task_name=_get(raw, "task_name"),
        submitted_at=_time(_get(raw, "submitted_at")),
        start_at=_time(_get(raw, "start_at")),
        end_at=_time(_get(raw, "end_at")),
        job_duration=_time(_get(raw, "job_duration")),
    )


def _time(value: Any) -> float | None:
    """A timestamp or duration of SkyPilot's queue (None, or <= 0 for "not yet", as SkyPilot stores them)."""
    return float(value) if value is not None and float(value) > 0 else None
