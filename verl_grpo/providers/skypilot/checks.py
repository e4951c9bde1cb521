"""What a SkyPilot launch needs besides a valid task: a store the cluster reaches, credentials for it, a usable model
id, the data, a well-formed W&B key, and spot only where it is sold. Each check returns its line, or raises a
ConfigError of one line naming the key and the fix; the real launch (provider.submit / submit_eval) and the dry run
call the same functions. No secret's value ever enters a line.
"""

from __future__ import annotations

import configparser
import re
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from urllib.parse import urlsplit

from verl_grpo.config import RunConfig
from verl_grpo.data.task_check import data_check
from verl_grpo.errors import ConfigError
from verl_grpo.models import MODEL_ALIASES

ENDPOINT_TIMEOUT_S = 2.0
"""TCP connect timeout of the storage.endpoint_url check: short, so an unreachable endpoint cannot stall the dry run."""
CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
"""What the tasks need to reach the store: the launch passes exactly these (and AWS_SESSION_TOKEN when set) from
this environment as SkyPilot secrets (templates.launch_secrets); a profile in ~/.aws is never sent to a cluster."""
HF_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
"""`org/name` as the Hugging Face hub spells model ids (huggingface_hub.utils.validate_repo_id has the rest)."""
MODEL_EXAMPLE = "Qwen/Qwen2.5-1.5B-Instruct"


def require_remote_store(cfg: RunConfig) -> str:
    """The store must be S3: the verl task writes checkpoints, the model and train_result.json there and the eval
    task reads the model and writes its report there; a `file://` store is out of the cluster's reach."""
    if not cfg.storage.uri.startswith("s3://"):
        raise ConfigError(f"storage.uri {cfg.storage.uri!r} is on this machine, out of the cluster's reach: the verl "
                          "task writes checkpoints, the model and train_result.json to the store, the eval task "
                          "reads the model and writes its report there. Set storage.uri "
                          "to s3://bucket/prefix (and storage.endpoint_url for MinIO/R2)")
    return f"store {cfg.storage.uri} is S3, reachable from the cluster"


def check_store_endpoint(cfg: RunConfig, timeout: float = ENDPOINT_TIMEOUT_S) -> str:
    """storage.endpoint_url, when set, is an http(s) URL that accepts a TCP connection within `timeout`."""
    url = cfg.storage.endpoint_url
    if not url:
        return "store endpoint: AWS S3 (storage.endpoint_url unset)"
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ConfigError(f"storage.endpoint_url {url!r} is not an http(s)://host[:port] URL; fix it, or unset it to "
                          "use AWS S3")
    problem = _tcp_problem(parts.hostname, port, timeout)
    if problem:
        raise ConfigError(f"storage.endpoint_url {url} is not reachable from this machine ({problem}); start the S3 "
                          "server or fix the URL, or unset storage.endpoint_url to use AWS S3")
    return f"store endpoint {url} accepts connections"


def _tcp_problem(host: str, port: int, timeout: float) -> str | None:
    """Why a TCP connection to host:port fails, or None. A thread bounds the DNS lookup too (it ignores timeouts)."""
    answer: dict[str, str | None] = {}

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            answer["problem"] = None
        except OSError as e:
            answer["problem"] = e.strerror or type(e).__name__

    thread = threading.Thread(target=connect, name="store-endpoint-check", daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return answer.get("problem", f"no answer in {timeout:g} s")


def check_store_credentials(env: Mapping[str, str]) -> str:
    """AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment: the only credentials the launch passes to the
    tasks. A profile that holds keys only in a shared credentials file is named in the fix, never read out."""
    missing = [name for name in CREDENTIAL_VARS if not env.get(name)]
    if not missing:
        return "AWS credentials for the store are in the environment (passed to the tasks as SkyPilot secrets)"
    profile = profile_with_keys(env)
    found = (f"; profile {profile[0]!r} in {profile[1]} has keys, export them with `eval \"$(aws configure "
             f"export-credentials --profile {profile[0]} --format env)\"`" if profile else "")
    raise ConfigError(f"{' and '.join(missing)} not set: the tasks reach storage.uri only with the AWS credentials of "
                      f"this environment, passed as SkyPilot secrets{found}; export {' and '.join(missing)}")


def profile_with_keys(env: Mapping[str, str]) -> tuple[str, str] | None:
    """(profile, file) when the shared credentials file holds an access key for AWS_PROFILE (or `default`)."""
    path = Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or Path.home() / ".aws" / "credentials").expanduser()
    profile = env.get("AWS_PROFILE") or "default"
    parser = configparser.ConfigParser()
    try:
        parser.read(path)
    except configparser.Error:
        return None
    return (profile, str(path)) if parser.has_option(profile, "aws_access_key_id") else None


def check_wandb_key(env: Mapping[str, str]) -> str:
    """WANDB_API_KEY, when set, has the shape of a W&B key (wandb's own rule; the login is checked by the run)."""
    from verl_grpo.mirrors.wandb_mirror import API_KEY_ENV, require_key_shape

    if not env.get(API_KEY_ENV):
        return "W&B: WANDB_API_KEY unset, no W&B logging"
    require_key_shape(env)
    return "W&B: WANDB_API_KEY is shaped like a W&B key (passed to the tasks as a SkyPilot secret)"


def check_model_name(cfg: RunConfig) -> str:
    """model.name is a known alias, a model that ships with the run (`tiny`, a local HF model dir) or an HF `org/name`
    id the cluster loads from the hub."""
    from verl_grpo.trainers.verl.overrides import ships_with_run

    name = cfg.model.name
    key = name.strip().lower()
    if key in MODEL_ALIASES:
        return f"model {name} is an alias of {MODEL_ALIASES[key]}"
    if ships_with_run(name):
        if key != "tiny" and not (Path(name).expanduser() / "config.json").is_file():
            raise ConfigError(f"model.name {name!r} is a directory without config.json; point model.name at a saved "
                              f"Hugging Face model directory or an HF id such as {MODEL_EXAMPLE}")
        return f"model {name} is on this machine; it ships to the cluster through the store"
    if HF_REPO_ID.match(name) and _hf_repo_id_problem(name) is None:
        return f"model {name} is a Hugging Face id (the cluster loads it from the hub)"
    aliases = ", ".join(sorted(k for k in MODEL_ALIASES if "/" not in k))
    why = _hf_repo_id_problem(name) if HF_REPO_ID.match(name) else "not org/name"
    raise ConfigError(f"model.name {name!r} is not a Hugging Face model id ({why}), a known alias ({aliases}) or a "
                      f"local model directory; set model.name, e.g. model.name={MODEL_EXAMPLE}")


def _hf_repo_id_problem(name: str) -> str | None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError as e:
        return str(e).split(".")[0]
    return None


def check_data(cfg: RunConfig) -> str:
    """The dataset's splits are in the data mirror, or may come from the hub (`verl-grpo validate`'s data check)."""
    ok, detail = data_check(cfg)
    if not ok:
        raise ConfigError(detail)
    return f"data: {detail}"


GROUP_SHAPES = ("job_group", "rollout_group")
"""Shapes SkyPilot places only on Kubernetes (a job group's `inter_connection`, sky/jobs/server/core.py)."""


def on_kubernetes(cfg: RunConfig) -> bool:
    """Whether the run's tasks land on Kubernetes: skypilot.cloud=kubernetes, or a job or rollout group."""
    return (cfg.skypilot.cloud or "").lower() == "kubernetes" or cfg.skypilot.shape in GROUP_SHAPES


@dataclass(frozen=True)
class SpotChoice:
    """Whether the tasks ask for spot, why, and the warning when that is not what infra.spot asked."""

    spot: bool
    why: str
    warning: str | None = None

    @property
    def line(self) -> str:
        return f"spot: {'on' if self.spot else 'off'} ({self.why})"


def spot_choice(cfg: RunConfig, sky: ModuleType) -> SpotChoice:
    """infra.spot=true asks for spot only where the placement can have it; elsewhere the run goes on-demand with one
    warning line (it never fails).

    On Kubernetes (skypilot.cloud=kubernetes, and every job or rollout group, which SkyPilot places only there)
    SkyPilot lists spot as unsupported unless the cluster's nodes carry a spot label (sky/clouds/kubernetes.py
    `_CLOUD_UNSUPPORTED_FEATURES`, `get_spot_label`): a task asking spot there has no launchable resource. Offline, the
    one sign of spot nodes is SkyPilot's own `kubernetes.autoscaler` setting naming an autoscaler that labels them
    (its SPOT_LABEL_MAP: gke, karpenter); without it spot is off. Elsewhere spot stays on where a local catalog offer
    of infra.accelerators (in skypilot.cloud / skypilot.region when set) sells it, and without any local catalog to
    ask SkyPilot decides at launch. A profile's `spot: true` and `-o infra.spot=true` are the same value in the
    resolved config the run stores and resumes from, so they behave the same."""
    if not cfg.infra.spot:
        return SpotChoice(False, "infra.spot=false")
    if not cfg.infra.accelerators:
        return SpotChoice(True, "infra.spot=true")
    if on_kubernetes(cfg):
        where = (f"skypilot.shape={cfg.skypilot.shape} runs only on Kubernetes"
                 if cfg.skypilot.shape in GROUP_SHAPES else "skypilot.cloud=kubernetes")
        label = sky.kubernetes_spot_label()
        if label is not None:
            return SpotChoice(True, f"{where}, and SkyPilot's kubernetes.autoscaler provisions spot nodes labelled "
                                    f"{label[0]}={label[1]}")
        why = f"{where}, where SkyPilot offers spot only on nodes with a spot label (sky/clouds/kubernetes.py)"
        return SpotChoice(False, why, f"infra.spot=true but {why}: launching on-demand (if your cluster's "
                                      "autoscaler provisions spot nodes, set kubernetes.autoscaler: gke or karpenter "
                                      "in ~/.sky/config.yaml; set infra.spot=false to silence this)")
    from verl_grpo.providers.skypilot.cost import available_catalog_clouds, seed_catalog_cache

    seed_catalog_cache(sky)  # the shipped catalog copy, where SkyPilot's cache has none (offline machines)
    name, _, count = cfg.infra.accelerators.partition(":")
    try:
        n = int(float(count or 1))
    except ValueError:
        return SpotChoice(True, "infra.spot=true")  # a malformed count is the catalog check's error to report
    clouds = available_catalog_clouds(sky)
    if cfg.skypilot.cloud is None and not clouds:
        return SpotChoice(True, "infra.spot=true; no local catalog to ask, SkyPilot decides at launch")
    offers, _ = sky.catalog_offers(name, n, cfg.skypilot.cloud, cfg.skypilot.region, clouds)
    selling = sorted({o.cloud for o in offers if o.spot_price is not None})
    if not offers or selling:
        return SpotChoice(True, f"infra.spot=true; spot sold on {', '.join(selling)}" if selling else
                          "infra.spot=true")
    where = ", ".join(sorted({o.cloud for o in offers}))
    return SpotChoice(False, f"no catalog offer of {cfg.infra.accelerators} on {where} sells spot",
                      f"infra.spot=true but no catalog offer of {cfg.infra.accelerators} on {where} sells spot: "
                      "launching on-demand (set infra.spot=false to silence this, or skypilot.cloud to a cloud that "
                      "sells spot)")


def with_spot_choice(cfg: RunConfig, sky: ModuleType) -> tuple[RunConfig, str | None]:
    """cfg as the task is rendered (infra.spot off where no offer sells spot) and the warning, if any."""
    choice = spot_choice(cfg, sky)
    if choice.spot == cfg.infra.spot:
        return cfg, choice.warning
    return cfg.model_copy(update={"infra": cfg.infra.model_copy(update={"spot": choice.spot})}), choice.warning
