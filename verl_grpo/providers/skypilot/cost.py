"""What a SkyPilot launch costs: the estimate before it (dry run) and the actual cost after it (job timeline).

Prices come from SkyPilot's catalog (the local copy `seed_catalog_cache` fills), per cloud and region. The
estimate covers the whole launch: the verl trainer (nodes × accelerators × algorithm.total_steps ×
skypilot.step_seconds; on the rollout group its Ray cluster has skypilot.rollout_nodes more nodes), the groups'
services (for as long as the trainer runs) and the held-out eval task (skypilot.eval_minutes). On spot it adds the
expected preemption overhead: training hours × skypilot.spot_preemptions_per_hour preemptions, each losing half a save
interval (algorithm.save_freq × step_seconds / 2) plus skypilot.recovery_minutes, during which the training tasks are
billed.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from verl_grpo.config import RunConfig
from verl_grpo.contracts import RunCost
from verl_grpo.errors import ConfigError
from verl_grpo.local_paths import data_mirror_dir
from verl_grpo.providers.skypilot import templates
from verl_grpo.services import SERVICES
from verl_grpo.trainers.verl.overrides import cluster_nodes

TABLE_ROWS = 5
"""Offers the dry run's cost table shows (cheapest first); the rest are counted as left off."""
EVAL_TASK = "eval"


@dataclass(frozen=True)
class LaunchTask:
    """One task the launch runs, as priced: its resources, how long it runs and whether it runs on spot."""

    name: str
    nodes: int
    accelerators: str | None
    """`NAME:COUNT` per node; None for a CPU-only task."""
    cpus: str | None
    """vCPUs per node (`4+`); None leaves them to the accelerators' instance type."""
    hours: float
    spot: bool
    """Runs on spot when infra.spot (the YAML's use_spot follows it); False for tasks SkyPilot runs on demand."""
    training: bool = True
    """Runs while the trainer trains (and waits through its recoveries); False for the eval task."""
    memory: str | None = None
    """GiB of memory per node (`16+`); None leaves it to the instance type."""

    @property
    def resources(self) -> str:
        extra = ", ".join(f"{k} {v}" for k, v in (("cpus", self.cpus), ("memory", self.memory)) if v)
        if self.accelerators:
            return f"{self.accelerators} ({extra})" if extra else self.accelerators
        return extra


@dataclass(frozen=True)
class CostLine:
    """The whole launch priced in one cloud region, the trainer on `instance_type`."""

    cloud: str
    region: str
    instance_type: str
    nodes: int
    hours: float
    """Estimated training hours."""
    on_demand: float
    """Total $ with every task on demand."""
    spot: float | None
    """Total $ with infra.spot=true: the tasks that follow it at spot prices, preemption overhead included; None
    where one of them has no spot offer in this region."""
    spot_overhead: float = 0.0
    """$ of the expected preemption overhead (included in `spot`)."""


@dataclass
class CostEstimate:
    tasks: list[LaunchTask]
    rows: list[CostLine]
    """The cheapest TABLE_ROWS offers, spot-first when infra.spot, on-demand first otherwise."""
    left_off: int
    spot_first: bool
    overhead_hours: float
    """Expected extra hours of the training tasks from spot preemptions."""
    overhead_note: str
    clouds: list[str] = field(default_factory=list)
    """Clouds whose catalog offers the trainer's accelerators."""

    def __iter__(self):
        return iter(self.rows)

    def render_lines(self) -> list[str]:
        order = "cheapest spot first" if self.spot_first else "cheapest on-demand first"
        lines = [f"Cost estimate of the whole launch per cloud and region ({order}; catalog $/h x nodes x hours):"]
        lines += [f"  {t.name}: {t.nodes} x {t.resources} x {t.hours:.2f} h"
                  f"{'' if t.spot else ' (always on demand)'}" for t in self.tasks]
        lines.append(f"  {'cloud':<10} {'region':<18} {'trainer instance':<24} {'on-demand':>12} "
                     f"{'spot':>12} {'of it preemption':>17}")
        for c in self.rows:
            spot = f"${c.spot:,.2f}" if c.spot is not None else "no spot"
            over = f"${c.spot_overhead:,.2f}" if c.spot is not None else "-"
            lines.append(f"  {c.cloud:<10} {c.region:<18} {c.instance_type:<24} "
                         f"{'$' + format(c.on_demand, ',.2f'):>12} "
                         f"{spot:>12} {over:>17}")
        if self.left_off:
            lines.append(f"  ... {self.left_off} more offer(s) left off")
        lines.append(f"  spot preemption overhead: {self.overhead_note}")
        return lines


def training_hours(cfg: RunConfig) -> float:
    return cfg.algorithm.total_steps * cfg.skypilot.step_seconds / 3600


def launch_tasks(cfg: RunConfig) -> list[LaunchTask]:
    """Every task of the launch with its resources, as the templates render them (infra/skypilot/*.j2)."""
    sp, hours = cfg.skypilot, training_hours(cfg)
    _accelerator_count(cfg.infra.accelerators, "infra.accelerators")
    # rollout_group: the trainer task is one Ray cluster of trainer + standalone rollout nodes, all on these GPUs.
    tasks = [LaunchTask(templates.TRAINER_TASK, cluster_nodes(cfg), cfg.infra.accelerators, None, hours, True)]
    if sp.shape in ("job_group", "rollout_group"):
        for s in templates.job_group_services(cfg):
            res = templates.service_resources(s.name, cfg)
            tasks.append(LaunchTask(s.task, res["num_nodes"], res["accelerators"], res["cpus"], hours, True,
                                    memory=res["memory"]))
    accelerators, _ = templates.eval_accelerators(cfg)
    tasks.append(LaunchTask(EVAL_TASK, 1, accelerators, None, sp.eval_minutes / 60, True, training=False))
    return tasks


def preemption_overhead_hours(cfg: RunConfig) -> tuple[float, str]:
    """Expected extra hours of the training tasks on spot, and how they were worked out (one line)."""
    sp, hours = cfg.skypilot, training_hours(cfg)
    preemptions = hours * sp.spot_preemptions_per_hour
    lost_s = cfg.algorithm.save_freq * sp.step_seconds / 2
    per = lost_s / 3600 + sp.recovery_minutes / 60
    note = (f"{hours:.2f} h x {sp.spot_preemptions_per_hour:g}/h (skypilot.spot_preemptions_per_hour) = "
            f"{preemptions:.2f} preemption(s) x ({cfg.algorithm.save_freq} steps x {sp.step_seconds:g} s / 2 lost "
            f"(algorithm.save_freq) + {sp.recovery_minutes:g} min recovery (skypilot.recovery_minutes)) = "
            f"{preemptions * per:.2f} h more of the training tasks, in the spot column")
    return preemptions * per, note


def estimate_cost(cfg: RunConfig, boundary: ModuleType) -> CostEstimate:
    """The whole launch priced per cloud and region of the local catalog, cheapest first (spot first when
    infra.spot). ConfigError when the trainer's accelerators are in no catalog, or infra.spot finds no spot."""
    tasks = launch_tasks(cfg)
    seed_catalog_cache(boundary)
    clouds = available_catalog_clouds(boundary)
    if cfg.skypilot.cloud is None and not clouds:
        raise ConfigError(f"no SkyPilot catalog found under {boundary.catalog_dir()}; run `sky check` with internet "
                          "access once, or copy a catalog there (e.g. ../shared/data/skypilot-catalog/v8)")
    prices = {t.name: _prices(t, cfg, boundary, clouds) for t in tasks}
    trainer = tasks[0]
    if not prices[trainer.name]:
        name, count = _accelerator_count(trainer.accelerators, "infra.accelerators")
        _, fuzzy = boundary.catalog_offers(name, count, cfg.skypilot.cloud, cfg.skypilot.region, clouds)
        hint = f"; did you mean {', '.join(fuzzy)}?" if fuzzy else ""
        raise ConfigError(f"infra.accelerators {cfg.infra.accelerators!r} is not offered in the SkyPilot catalog "
                          f"of {cfg.skypilot.cloud or ', '.join(clouds)}{hint}")
    offers_cloud = sorted({p.cloud for p in prices[trainer.name]})
    if cfg.infra.spot and all(p.spot_price is None for p in prices[trainer.name]):
        raise ConfigError(f"infra.spot=true but no catalog offer of {cfg.infra.accelerators} on "
                          f"{', '.join(offers_cloud)} sells spot; set infra.spot=false or choose another "
                          "skypilot.cloud")
    for t in tasks[1:]:
        if not prices[t.name]:
            fields = "skypilot.eval_accelerators" if t.name == EVAL_TASK else _service_fields(t.name)
            fix = f"set {fields}" if fields else "choose a skypilot.cloud/region that sells CPU instances"
            raise ConfigError(f"the {t.name} task's {t.resources} is not offered in the SkyPilot catalog of "
                              f"{cfg.skypilot.cloud or ', '.join(clouds)}; {fix}")
    overhead_h, note = preemption_overhead_hours(cfg)
    lines = [_line(cfg, tasks, prices, p, overhead_h) for p in prices[trainer.name]]
    if cfg.infra.spot:
        lines.sort(key=lambda c: (c.spot is None, c.spot or 0.0, c.on_demand, c.cloud, c.region))
    else:
        lines.sort(key=lambda c: (c.on_demand, c.spot is None, c.spot or 0.0, c.cloud, c.region))
    return CostEstimate(tasks=tasks, rows=lines[:TABLE_ROWS], left_off=max(0, len(lines) - TABLE_ROWS),
                        spot_first=cfg.infra.spot, overhead_hours=overhead_h, overhead_note=note, clouds=offers_cloud)


@dataclass(frozen=True)
class KubernetesOffer:
    """A task's capacity on your Kubernetes cluster, priced from skypilot.kubernetes_prices (as a catalog row)."""

    price: float
    cloud: str = "kubernetes"
    region: str = "your cluster"
    instance_type: str = "pods"
    spot_price: float | None = None


def estimate_kubernetes_cost(cfg: RunConfig) -> CostEstimate:
    """The whole launch priced from skypilot.kubernetes_prices: per node, each accelerator at its price, plus its
    vCPUs and GiB at `cpu` and `memory` where the task asks for them. ConfigError naming the missing price."""
    rates = cfg.skypilot.kubernetes_prices
    tasks = launch_tasks(cfg)
    prices = {}
    for task in tasks:
        hourly = 0.0
        if task.accelerators:
            name, count = _accelerator_count(task.accelerators, "infra.accelerators")
            if name not in rates:
                raise ConfigError(f"skypilot.kubernetes_prices has no price for {name} (the {task.name} task's "
                                  f"accelerators); add it, e.g. -o 'skypilot.kubernetes_prices={{{name}: 2.5}}'")
            hourly += count * rates[name]
        for unit, amount in (("cpu", task.cpus), ("memory", task.memory)):
            if amount and unit in rates:
                hourly += float(str(amount).rstrip("+")) * rates[unit]
        prices[task.name] = [KubernetesOffer(price=hourly)]
    line = _line(cfg, tasks, prices, prices[tasks[0].name][0], 0.0)
    unpriced = [u for u in ("cpu", "memory") if u not in rates]
    note = "none on Kubernetes (pods are not preempted as spot VMs are)" + (
        f"; {' and '.join(unpriced)} of the CPU tasks not priced (no skypilot.kubernetes_prices.{unpriced[0]})"
        if unpriced else "")
    return CostEstimate(tasks=tasks, rows=[line], left_off=0, spot_first=False, overhead_hours=0.0,
                        overhead_note=note, clouds=["kubernetes"])


def _line(cfg: RunConfig, tasks: list[LaunchTask], prices: dict, row, overhead_h: float) -> CostLine:
    """The launch with the trainer on `row` and every other task at its cheapest offer in the same region
    (else in the same cloud, else anywhere: the eval is a job of its own)."""
    on_demand, spot, spot_rate = 0.0, 0.0, 0.0
    for t in tasks:
        p = row if t is tasks[0] else _nearest(prices[t.name], row.cloud, row.region)
        on_demand += t.nodes * t.hours * p.price
        rate = (p.spot_price if t.spot else p.price) if spot is not None else None
        if rate is None:
            spot = None
            continue
        spot += t.nodes * t.hours * rate
        spot_rate += t.nodes * rate if t.training else 0.0
    overhead = overhead_h * spot_rate if spot is not None else 0.0
    return CostLine(cloud=row.cloud, region=row.region, instance_type=row.instance_type, nodes=cluster_nodes(cfg),
                    hours=training_hours(cfg), on_demand=on_demand,
                    spot=None if spot is None else spot + overhead, spot_overhead=overhead)


def _nearest(prices: Sequence, cloud: str, region: str):
    same_region = [p for p in prices if p.cloud == cloud and p.region == region]
    same_cloud = [p for p in prices if p.cloud == cloud]
    return min(same_region or same_cloud or prices, key=lambda p: p.price)


def _service_fields(task: str) -> str | None:
    """The config fields of a job-group service task's resources, for a message."""
    name = next((s.name for s in SERVICES.values() if s.task == task), None)
    if name is None:
        return None
    gpu = f" / services.{name}.accelerators" if name == "reward" else ""
    return f"services.{name}.cpus / services.{name}.memory{gpu}"


def _prices(task: LaunchTask, cfg: RunConfig, boundary: ModuleType, clouds: list[str]) -> list:
    memory = {"memory": task.memory} if task.memory else {}
    if task.accelerators:
        name, count = _accelerator_count(task.accelerators, "infra.accelerators")
        return boundary.catalog_region_prices(name, count, task.cpus, cfg.skypilot.cloud, cfg.skypilot.region,
                                              clouds, **memory)
    return boundary.catalog_region_prices(None, 0, task.cpus, cfg.skypilot.cloud, cfg.skypilot.region, clouds,
                                          **memory)


def _accelerator_count(spec: str | None, field_name: str) -> tuple[str, int]:
    name, _, count = (spec or "").partition(":")
    try:
        n = float(count or 1)
    except ValueError:
        n = 0
    if not name or n <= 0:
        raise ConfigError(f"{field_name} {spec!r}: use NAME:COUNT, e.g. H100:8")
    return name, max(1, int(n))


# --- after a run: the actual cost from the job's timeline ---------------------------------------------------


def actual_cost(cfg: RunConfig, run_id: str, records: Iterable, boundary: ModuleType) -> RunCost:
    """Node-hours and $ of the run's ended managed jobs (`sky jobs queue` records of the training and eval jobs),
    each from SkyPilot's provisioning start (start_at) to its end (end_at), recoveries included, priced at the
    cheapest catalog offer of each task's resources in skypilot.cloud/region (spot or on demand, as launched).
    A record of a job-group task is priced as that task; a record of a whole job as all of its tasks."""
    tasks = launch_tasks(cfg)
    seed_catalog_cache(boundary)
    clouds = available_catalog_clouds(boundary)
    rates: dict[str, tuple[float | None, int]] = {}
    for t in tasks:
        on_spot = t.spot and cfg.infra.spot
        offers = _prices(t, cfg, boundary, clouds)
        price = min(((p.spot_price if on_spot else p.price) for p in offers
                     if (p.spot_price if on_spot else p.price) is not None), default=None)
        rates[t.name] = (price, t.nodes)
    eval_name = EVAL_TASK
    training = [t.name for t in tasks if t.training]
    node_hours, cost, run_hours, jobs, recoveries, unpriced = 0.0, 0.0, 0.0, set(), 0, []
    for r in records:
        if r.start_at is None or r.end_at is None:
            continue
        hours = max(0.0, r.end_at - r.start_at) / 3600
        if r.task_name in rates:
            names = [r.task_name]
        elif r.name == templates.eval_job_name(run_id):
            names = [eval_name]
        else:
            names = training
        for name in names:
            price, nodes = rates[name]
            node_hours += nodes * hours
            if price is None:
                unpriced.append(name)
            else:
                cost += nodes * hours * price
        run_hours += (r.job_duration or 0.0) / 3600
        jobs.add(r.job_id)
        recoveries += r.recovery_count
    pricing = "spot" if cfg.infra.spot else "on-demand"
    where = "/".join(p for p in (cfg.skypilot.cloud, cfg.skypilot.region) if p) or "cheapest catalog offer"
    return RunCost(node_hours=node_hours, cost_usd=None if unpriced else cost, run_hours=run_hours,
                   jobs=len(jobs), recoveries=recoveries, pricing=pricing,
                   priced_at=f"{pricing} {where}" + (f" (no price for {', '.join(sorted(set(unpriced)))})"
                                                     if unpriced else ""))


# --- SkyPilot's local catalog ---------------------------------------------------------------------------------


def seed_catalog_cache(boundary: ModuleType) -> list[Path]:
    """Copy catalog CSVs from the local data mirror (`<mirror>/skypilot-catalog/v8`) into SkyPilot's catalog
    cache where the cache has none, so an offline machine can check GPU names and prices. Never overwrites."""
    source = data_mirror_dir() / "skypilot-catalog" / "v8"
    cache = Path(boundary.catalog_dir())
    copied = []
    for csv in sorted(source.rglob("*.csv")) if source.is_dir() else []:
        target = cache / csv.relative_to(source)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(csv, target)
            copied.append(target)
    return copied


def available_catalog_clouds(boundary: ModuleType) -> list[str]:
    """Clouds with a local `vms.csv` in SkyPilot's catalog dir (others would be downloaded)."""
    root = Path(boundary.catalog_dir())
    return sorted(p.parent.name for p in root.glob("*/vms.csv")) if root.is_dir() else []
