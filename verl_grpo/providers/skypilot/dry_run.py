"""`verl-grpo launch --provider skypilot --dry-run`: every check the launch makes, the YAML and a cost table;
launches nothing. A real launch runs it first too.

Checks (all of them run; DryRunFailed lists every failure, one line each naming the key and the fix): the store is
S3 (the same `require_remote_store` the provider calls), storage.endpoint_url accepts a TCP connection, the AWS
credentials the tasks get are in the environment, WANDB_API_KEY's shape, model.name is an HF id / alias / local
model, the data splits are in the mirror (checks.py); verl overrides against verl's Hydra config + validate_config,
the training and the eval (vLLM) SkyPilot YAML with SkyPilot's loaders, the recovery strategy against SkyPilot's
registry, the accelerators of both against SkyPilot's catalog (local copy, `~/.sky/catalogs/v8`), and a lower-bound
GPU memory estimate (`check_gpu_memory`: an OOM is the failure a local rehearsal cannot reproduce), each task's imports
against what its setup installs (`node_imports`), the run's own reward function shipped, imported in the nodes'
package set and scoring a sample row (`reward_check`), and the attention backend against what the nodes install
(`check_attention`), and what each rendered task asks of SkyPilot and its nodes (`launch_policy`: spot as decided,
restarts only for transient exits, the driver check, one transformers on every GPU task, CPU services without the
CUDA stack, no tracking URI, SkyPilot's uv, Ray's ports, NCCL/Gloo's interface). infra.spot is turned off, with a
warning, where the placement has no spot (Kubernetes without a spot autoscaler, every job or rollout group) or no
catalog offer sells it (checks.spot_choice, as the provider does).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from verl_grpo.config import RunConfig
from verl_grpo.contracts import Cluster, DatasetVersion
from verl_grpo.errors import ConfigError, DataError
from verl_grpo.node_imports import check_node_imports
from verl_grpo.providers.skypilot import templates
from verl_grpo.providers.skypilot.checks import (
    check_data,
    check_model_name,
    check_store_credentials,
    check_store_endpoint,
    check_wandb_key,
    require_remote_store,
    spot_choice,
)
from verl_grpo.providers.skypilot.cost import (
    CostEstimate,
    available_catalog_clouds,
    estimate_cost,
    estimate_kubernetes_cost,
    seed_catalog_cache,
)
from verl_grpo.providers.skypilot.launch_policy import (
    check_driver,
    check_node_env,
    check_ray_network,
    check_restart_policy,
    check_services,
    check_spot,
    check_transformers,
)
from verl_grpo.providers.skypilot.provider import SkyPilotProvider, rendered_secret_names
from verl_grpo.providers.skypilot.reward_check import check_task_scorer, check_user_reward
from verl_grpo.store import Store
from verl_grpo.store_layout import dataset_dir, eval_spec
from verl_grpo.trainers.verl.backend import VerlTrainer
from verl_grpo.trainers.verl.node_reward import UserRewardPlan, node_reward
from verl_grpo.trainers.verl.overrides import cluster_model_path, cluster_nodes, gpus_per_node, uses_fully_async

DRY_RUN_ID = "dry-run"
GPU_MEMORY_GIB = {"H100": 80, "H100-MEGA": 80, "H200": 141, "B200": 180, "GH200": 96, "A100": 40, "A100-80GB": 80,
                  "L40S": 48, "L40": 48, "L4": 24, "A10G": 24, "A10": 24, "A6000": 48, "V100": 16, "V100-32GB": 32,
                  "T4": 16}
"""GiB of memory per GPU, by SkyPilot accelerator name (those not listed skip the memory check)."""
TRAIN_BYTES_PER_PARAM = 16
"""FSDP full fine-tuning: fp32 weights (4) + fp32 grads (4) + Adam moments (8), sharded over every GPU."""
FROZEN_BYTES_PER_PARAM = 2
"""A frozen bf16 copy: the LoRA base weights, or the reference model when a KL term is on."""


@dataclass
class DryRunReport:
    yamls: dict[str, str]
    """Training task (or job-group) name → rendered YAML, and `eval` → the held-out eval task's YAML."""
    checks: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """What the launch does differently from the config (e.g. on-demand where no spot is sold), one line each."""
    costs: CostEstimate | None = None
    seconds: float = 0.0
    user_reward: UserRewardPlan | None = None
    """The training plan's placement of the run's own reward function (reward.path), for its check."""

    def render(self) -> str:
        lines = [f"# {name}\n{text}" for name, text in self.yamls.items()]
        lines += [f"warning: {w}" for w in self.warnings]
        lines.append("Checks passed:")
        lines += [f"  - {c}" for c in self.checks]
        lines += self.costs.render_lines() if self.costs else []
        lines.append(f"Dry run took {self.seconds:.1f} s; nothing was launched.")
        return "\n".join(lines)


def dry_run(cfg: RunConfig, boundary: ModuleType | None = None, env: Mapping[str, str] | None = None,
            check_reward: bool = True) -> DryRunReport:
    """Run every check the launch makes; DryRunFailed lists every failure, one line each, when any fails."""
    start = time.perf_counter()
    if cfg.trainer.backend not in SkyPilotProvider.backends:
        raise ConfigError(f"the skypilot provider runs the {' or '.join(SkyPilotProvider.backends)} backend; set "
                          f"trainer.backend={SkyPilotProvider.backends[0]}")
    if boundary is None:
        from verl_grpo.providers.skypilot import boundary as real

        boundary = real
    env = os.environ if env is None else env
    report = DryRunReport(yamls={})
    checks = _Checks(report)
    checks.run(require_remote_store, cfg)
    checks.run(check_store_endpoint, cfg)
    checks.run(check_store_credentials, env)
    checks.run(check_wandb_key, env)
    checks.run(check_model_name, cfg)
    checks.run(check_data, cfg)
    checks.run(check_placement, cfg)
    spot = spot_choice(cfg, boundary) if cfg.infra.accelerators else None
    if spot is not None:
        report.warnings += [spot.warning] if spot.warning else []
        cfg = cfg.model_copy(update={"infra": cfg.infra.model_copy(update={"spot": spot.spot})})
    if cfg.infra.accelerators and cloud_is_kubernetes(cfg):
        if cfg.skypilot.kubernetes_prices:
            report.costs = checks.run(estimate_kubernetes_cost, cfg, line=False)
            report.checks.append("cost: priced from skypilot.kubernetes_prices (your cluster's rates; no catalog "
                                 "prices Kubernetes)")
        else:
            report.checks.append("cost not priced: Kubernetes capacity is your cluster's, in no catalog; set "
                                 "skypilot.kubernetes_prices (e.g. {H100: 2.5, cpu: 0.03, memory: 0.004}) to price it")
    elif cfg.infra.accelerators:
        seed_catalog_cache(boundary)
    provider = SkyPilotProvider(boundary=boundary, env=env)
    cluster = checks.run(provider.up, cfg, DRY_RUN_ID, line=False)
    if cluster is not None:
        checks.run(_render_training, cfg, boundary, env, cluster, check_reward, report)
    checks.run(_check_recovery_strategy, cfg, boundary)
    if cfg.infra.accelerators and not cloud_is_kubernetes(cfg):
        costs = checks.run(estimate_cost, cfg, boundary, line=False)
        if costs is not None:
            report.costs = costs
            report.checks.append(f"{cfg.infra.accelerators} exists in the SkyPilot catalog "
                                 f"({', '.join(report.costs.clouds)})")
    if cfg.infra.accelerators:  # its GPUs looked up only once infra.accelerators' were found (one line per cause)
        checks.run(check_eval_task, cfg, boundary, env, report.yamls, report.costs is not None)
    checks.run(check_node_imports, report.yamls)
    if spot is not None:
        checks.run(check_spot, report.yamls, spot)
    checks.run(check_restart_policy, cfg, report.yamls)
    checks.run(check_driver, report.yamls)
    if "eval" in report.yamls:
        checks.run(check_transformers, report.yamls)
    checks.run(check_services, report.yamls)
    checks.run(check_node_env, report.yamls)
    checks.run(check_ray_network, report.yamls)
    if report.user_reward is not None:
        checks.run(check_user_reward, report.yamls, report.user_reward)
    elif cfg.dataset.name in templates.TASK_PACKAGES:
        checks.run(check_task_scorer, cfg, report.yamls)
    if cfg.infra.accelerators:
        checks.run(check_gpu_memory, cfg)
    checks.run(check_attention, cfg)
    report.checks.append(credential_path(cfg))
    report.seconds = time.perf_counter() - start
    if checks.failures:
        raise DryRunFailed(checks.failures)
    return report


class DryRunFailed(ConfigError):
    """One or more dry-run checks failed; the message has one line per failure (key and fix)."""

    def __init__(self, failures: list[str]):
        self.failures = failures
        n = len(failures)
        super().__init__(f"the dry run found {n} problem{'s' if n > 1 else ''} (nothing was launched):\n"
                         + "\n".join(f"  - {f}" for f in failures))


class _Checks:
    """Runs each check, keeping its line(s) on success and its one-line message on a ConfigError/DataError, so the
    dry run reports every failure instead of the first."""

    def __init__(self, report: DryRunReport):
        self.report = report
        self.failures: list[str] = []

    def run(self, check: Callable, *args, line: bool = True):
        try:
            out = check(*args)
        except (ConfigError, DataError) as e:
            self.failures.append(" ".join(str(e).split()))
            return None
        if line:
            self.report.checks += [out] if isinstance(out, str) else list(out)
        return out


def _render_training(cfg: RunConfig, boundary: ModuleType, env: Mapping[str, str], cluster: Cluster,
                     check_reward: bool, report: DryRunReport) -> list[str]:
    """verl's compose + validation of the run's overrides, then the rendered task through SkyPilot's loaders."""
    store = Store.from_config(cfg.storage)
    trainer = VerlTrainer(check_reward=check_reward, ship_models=False)
    spec = trainer.plan(cfg, _planned_dataset(cfg, store), store, DRY_RUN_ID, cluster)
    lines = list(trainer.last_validation.checks) if trainer.last_validation else []
    report.user_reward = trainer.last_user_reward
    rendered = templates.render(cfg, spec, env)
    report.yamls[rendered.name] = rendered.yaml
    try:
        loaded = boundary.load_job_group(rendered.yaml) if rendered.is_job_group else boundary.load_task(rendered.yaml)
    except Exception as e:
        raise ConfigError(f"SkyPilot rejected the rendered {rendered.shape} YAML: {e}") from e
    return [*lines, f"SkyPilot loads the {rendered.shape} YAML ({_describe(loaded)})",
            *_check_launch_secrets(cfg, rendered, boundary, env)]


def _check_launch_secrets(cfg: RunConfig, rendered: templates.RenderedTask, boundary: ModuleType,
                          env: Mapping[str, str]) -> list[str]:
    """No secret value the launch passes (W&B, AWS, HF, the services' token) is in the YAML; with services, SkyPilot's
    loader, given the secrets as the launch gives them (a fresh services token), hands the token to every task."""
    values = templates.launch_secrets(cfg, env)
    # Values under 8 characters are no real credential and would match YAML text by chance.
    leaked = sorted(k for k, v in values.items() if len(v) >= 8 and v in rendered.yaml)
    if leaked:
        raise ConfigError(f"the rendered YAML contains the value of {', '.join(leaked)}; secrets go under `secrets:` "
                          "by name only (fix infra/skypilot templates)")
    name = cfg.services.token_env
    if not templates.runs_services(cfg):
        return []
    declared = {k: values[k] for k in rendered_secret_names(rendered.yaml) if k in values}
    loaded = boundary.load_job_group(rendered.yaml, declared) if rendered.is_job_group else \
        boundary.load_task(rendered.yaml, declared)
    tasks = getattr(loaded, "tasks", None) or [loaded]
    missing = [t.name for t in tasks if name not in (t.secrets or {})]
    if missing:
        raise ConfigError(f"services.token_env {name} is no SkyPilot secret of {', '.join(missing)}; every task of "
                          "a shape with services needs the token (fix infra/skypilot templates)")
    return [f"services token {name}: generated per launch, given to all {len(tasks)} tasks as a SkyPilot secret; "
            "no secret's value is in the YAML"]


def _check_recovery_strategy(cfg: RunConfig, boundary: ModuleType) -> str:
    try:
        boundary.check_recovery_strategy(cfg.skypilot.recovery_strategy)
    except ValueError as e:
        raise ConfigError(f"skypilot.recovery_strategy: {e}") from e
    return f"recovery strategy {cfg.skypilot.recovery_strategy} is registered in SkyPilot"


def check_eval_task(cfg: RunConfig, boundary: ModuleType, env: Mapping[str, str], yamls: dict[str, str],
                    catalog: bool = True) -> list[str]:
    """Render the held-out eval task into yamls["eval"], load it with SkyPilot and, with `catalog` and off Kubernetes
    (no catalog sells a cluster's capacity), find its GPUs in the catalog."""
    store = Store.from_config(cfg.storage)
    spec_uri = store.url(eval_spec(DRY_RUN_ID, cfg.eval.split))
    # A module's place on the nodes is the training plan's check; only a file ships, and the eval fetches it.
    shipped = (cfg.reward.path or "").endswith(".py")
    reward = node_reward(cfg, store, templates.REMOTE_WORKDIR, upload=False) if shipped else None
    rendered = templates.render_eval(cfg, DRY_RUN_ID, spec_uri, env, reward=reward)
    yamls["eval"] = rendered.yaml
    try:
        loaded = boundary.load_task(rendered.yaml)
    except Exception as e:
        raise ConfigError(f"SkyPilot rejected the rendered eval YAML: {e}") from e
    loads = f"SkyPilot loads the eval YAML ({_describe(loaded)})"
    if cloud_is_kubernetes(cfg) or not catalog:
        return [loads]
    accelerators, gpus = templates.eval_accelerators(cfg)
    field = "skypilot.eval_accelerators" if cfg.skypilot.eval_accelerators else "infra.accelerators × verl.rollout_tp"
    clouds = available_catalog_clouds(boundary)
    offers, fuzzy = boundary.catalog_offers(accelerators.partition(":")[0], gpus, cfg.skypilot.cloud,
                                            cfg.skypilot.region, clouds)
    if not offers:
        hint = f" (did you mean {', '.join(fuzzy)}?)" if fuzzy else ""
        raise ConfigError(f"the eval task's accelerators {accelerators!r} (from {field}) are not offered in the "
                          f"SkyPilot catalog of {cfg.skypilot.cloud or ', '.join(clouds)}{hint}; "
                          "set skypilot.eval_accelerators, e.g. H100:1")
    clouds_offering = ", ".join(sorted({o.cloud for o in offers}))
    return [loads, f"eval accelerators {accelerators} exist in the SkyPilot catalog ({clouds_offering})"]


def model_params(name: str) -> float | None:
    """Parameters of a model: counted from the tensor shapes of a local model directory's safetensors files, else
    read from the size in the model name's last component (`…/SmolLM2-135M-…` → 1.35e8, `…-0.5B…` → 5e8), never
    from the rest of a path (a temp dir named `…3b…` says nothing); None when neither tells."""
    path = Path(name).expanduser()
    if path.is_dir() and (counted := safetensors_params(path)):
        return float(counted)
    last = name.rstrip("/").rsplit("/", 1)[-1]
    m = re.search(r"(?<![\d.])(\d+(?:\.\d+)?)([MB])(?![a-z])", last, re.IGNORECASE)
    return float(m.group(1)) * (1e6 if m.group(2).upper() == "M" else 1e9) if m else None


def safetensors_params(model_dir: Path) -> int:
    """Elements of every tensor in `model_dir`'s *.safetensors files, from their JSON headers (no weights read)."""
    total = 0
    for file in sorted(model_dir.glob("*.safetensors")):
        with file.open("rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        total += sum(math.prod(t["shape"]) for key, t in header.items() if key != "__metadata__")
    return total


def check_gpu_memory(cfg: RunConfig) -> str:
    """GPU memory of the verl run per GPU, a simple estimate (activations and fragmentation not counted; the
    rollout engine is colocated with training, so its reserved share is counted on top of the training state).

    Training state: params × 16 B (FSDP full fine-tuning: fp32 weights, grads, Adam) sharded over nodes × GPUs per
    node, or params × 2 B (frozen bf16 base) with LoRA, plus params × 2 B for the reference model when a KL term is
    on. vLLM/SGLang reserve verl.gpu_memory_utilization of each GPU, and must hold the bf16 weights
    (params × 2 B / verl.rollout_tp) inside that share. ConfigError in one line naming the fields to change when
    either does not fit; a check line otherwise (or saying why it was skipped)."""
    gpu = (cfg.infra.accelerators or "").partition(":")[0]
    total = GPU_MEMORY_GIB.get(gpu.upper())
    model = cluster_model_path(cfg.model.name, shipped_to=cfg.model.name)
    params = model_params(model)
    if total is None or params is None:
        what = f"GPU memory of {gpu!r}" if total is None else f"parameter count of {model!r}"
        return f"GPU memory check skipped: {what} unknown"
    gib = 1 << 30
    gpus = cfg.infra.nodes * gpus_per_node(cfg)
    per_param = FROZEN_BYTES_PER_PARAM if cfg.verl.lora_rank else TRAIN_BYTES_PER_PARAM
    per_param += FROZEN_BYTES_PER_PARAM if cfg.algorithm.kl_coef > 0 else 0
    train = params * per_param / gpus / gib
    util = cfg.verl.gpu_memory_utilization
    rollout = util * total
    # verl's fully-async trainer keeps the rollout replicas off the trainer GPUs (skypilot.rollout_nodes).
    colocated = 0.0 if uses_fully_async(cfg) else rollout
    if train + colocated > total:
        raise ConfigError(
            f"GPU memory: {model} ({params / 1e9:.2f}B params) needs >= {train:.1f} GiB of training state per GPU "
            f"({per_param} B/param over {gpus} GPUs) + {colocated:.1f} GiB rollout share (verl.gpu_memory_utilization="
            f"{util}) > {total} GiB of {gpu}; raise infra.nodes or the GPU count of infra.accelerators, lower "
            f"verl.gpu_memory_utilization, or set verl.lora_rank")
    weights = params * FROZEN_BYTES_PER_PARAM / cfg.verl.rollout_tp / gib
    if weights >= rollout:
        raise ConfigError(
            f"GPU memory: the rollout engine's {weights:.1f} GiB of {model} weights per GPU do not fit in its "
            f"{rollout:.1f} GiB share (verl.gpu_memory_utilization={util} of {total} GiB {gpu}); raise "
            f"verl.rollout_tp or verl.gpu_memory_utilization")
    if not colocated:
        return (f"GPU memory fits (lower bound): {train:.1f} GiB training state on the trainer GPUs, {weights:.1f} "
                f"GiB weights in the {rollout:.1f} GiB rollout share of the rollout GPUs, of {total} GiB per {gpu}")
    return (f"GPU memory fits (lower bound): {train:.1f} GiB training state + {rollout:.1f} GiB rollout share of "
            f"{total} GiB per {gpu}")


def cloud_is_kubernetes(cfg: RunConfig) -> bool:
    """skypilot.cloud=kubernetes: the run is priced from skypilot.kubernetes_prices, not a catalog (a group shape with
    no cloud pinned lands on Kubernetes too, checks.on_kubernetes, but is priced from the catalog's VM clouds)."""
    return (cfg.skypilot.cloud or "").lower() == "kubernetes"


def check_placement(cfg: RunConfig) -> str:
    """Where the tasks can reach each other: a multinode cluster's nodes by SKYPILOT_NODE_IPS anywhere; a job or
    rollout group's services by `<task>-0.${SKYPILOT_JOBGROUP_NAME}` hostnames, which SkyPilot 0.14.1 gives only on
    Kubernetes (sky/optimizer.py; the rendered group sets `inter_connection: true` so SkyPilot enforces it)."""
    sp = cfg.skypilot
    if sp.shape == "multinode":
        return (f"placement: one cluster of {cluster_nodes(cfg)} node(s), which find each other by "
                "SKYPILOT_NODE_IPS (no hostname discovery needed)")
    if sp.cloud and not cloud_is_kubernetes(cfg):
        raise ConfigError(f"skypilot.shape={sp.shape} reaches its services by job-group hostnames, which SkyPilot "
                          f"gives only on Kubernetes, not on skypilot.cloud={sp.cloud}; set "
                          "skypilot.cloud=kubernetes or use skypilot.shape=multinode")
    if cloud_is_kubernetes(cfg):
        return "placement: Kubernetes (job-group hostnames for the services; inter_connection: true)"
    return ("placement: Kubernetes only (inter_connection: true: SkyPilot refuses any other cloud before "
            "provisioning); the cost table below prices the catalog's VM clouds, not your cluster")


def credential_path(cfg: RunConfig) -> str:
    """How the nodes authenticate to the store: always with the task's AWS secrets, never through a SkyPilot bucket
    mount, which SkyPilot authenticates with the cloud's credentials (an IAM role on AWS, elsewhere only an uploaded
    ~/.aws/credentials, never credentials from the environment: sky/clouds/aws.py get_credential_file_mounts)."""
    line = ("credentials: every node reads data and commits checkpoints with the task's AWS secrets (s3fs); no bucket "
            "is mounted")
    if cluster_nodes(cfg) > 1:
        line += "; each node's checkpoint sync uploads its shards with the same secrets"
    return line


def check_attention(cfg: RunConfig) -> str:
    """The attention backend the nodes load the models with, and that they can: flash_attention_2 only when
    skypilot.node_packages installs flash-attn (verl[vllm]==0.9.1 brings none)."""
    attn = cfg.verl.attn_implementation
    if attn == "sdpa":
        return ("attention: sdpa, use_remove_padding off (torch's own, nothing to install; 1.2-1.5x the update time "
                "of flash-attn, bench/results/gpu_attention.md)")
    names = set()
    for spec in cfg.skypilot.node_packages:
        try:
            names.add(canonicalize_name(Requirement(spec).name))
        except InvalidRequirement:
            raise ConfigError(f"skypilot.node_packages: {spec!r} is not a pip requirement; write a wheel URL as "
                              "'NAME @ URL'") from None
    if "flash-attn" not in names:
        raise ConfigError("verl.attn_implementation=flash_attention_2 needs flash-attn on the nodes and "
                          f"verl[{cfg.verl.rollout_engine}]==0.9.1 installs none; add 'flash-attn @ <wheel URL for "
                          "torch 2.11>' to skypilot.node_packages or set verl.attn_implementation=sdpa")
    return "attention: flash_attention_2 with use_remove_padding (flash-attn from skypilot.node_packages)"


def _planned_dataset(cfg: RunConfig, store: Store) -> DatasetVersion:
    """The dataset as it will sit in the store (hash `dry-run` until preparation computes the real one)."""
    uri = store.url(dataset_dir(cfg.dataset.name, DRY_RUN_ID))
    return DatasetVersion(name=cfg.dataset.name, hash=DRY_RUN_ID, uri=uri,
                          splits={s: f"{uri}/{s}.parquet" for s in ("train", "val", "test")},
                          counts={"train": 0, "val": 0, "test": 0})


def _describe(loaded) -> str:
    tasks = getattr(loaded, "tasks", None)
    return f"{len(tasks)} tasks" if tasks is not None else f"task {loaded.name}"
