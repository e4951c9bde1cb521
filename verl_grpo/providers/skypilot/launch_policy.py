"""What each rendered task asks of SkyPilot and of its nodes, read back from the YAML the launch submits: spot only
where the placement has it, restarts only for transient failures, the driver the node's torch needs checked before
anything downloads, the eval node on the trainer's transformers, CPU services without the CUDA stack, no tracking URI
on nodes, SkyPilot's own uv, NCCL/Gloo on the node's interface on a multi-node run, and our Ray off SkyPilot's ports.

Each check returns its line(s) for the dry run, or raises a ConfigError of one line naming the task, what is wrong
and the fix (the dry run lists every failing one). They read the rendered text, not the config, so a template or
code change that puts a defect back fails here before any spend.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from verl_grpo.config import RunConfig
from verl_grpo.errors import ConfigError
from verl_grpo.node_imports import setup_requirements
from verl_grpo.providers.skypilot.checks import SpotChoice
from verl_grpo.providers.skypilot.node_stack import (
    MIN_DRIVER,
    SKY_UV_DIR,
    TORCH_CUDA,
    TORCH_VERSION,
    TRANSFORMERS_VERSION,
    pinned,
)
from verl_grpo.providers.skypilot.templates import RAY_DASHBOARD_AGENT_PORT, RECOVER_ON_EXIT_CODES

SKY_RAY_DASHBOARD_AGENT_PORT = 52365
"""Ray's default dashboard-agent port, which SkyPilot's own Ray holds on every node."""
CUDA_STACK = ("verl", "vllm", "sglang", "torch")
"""Distributions a CPU service task must not install: gigabytes of CUDA wheels it never imports."""
FIX = "fix infra/skypilot templates or verl_grpo/providers/skypilot/templates.py"


def tasks(yamls: Mapping[str, str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(label, task dict) of every task of every rendered YAML (a job group's header skipped)."""
    for name, text in yamls.items():
        for task in yaml.safe_load_all(text):
            if isinstance(task, dict) and task.get("run"):
                yield str(task.get("name") or name), task


def _resources(task: dict[str, Any]) -> dict[str, Any]:
    return task.get("resources") or {}


def _on_gpu(task: dict[str, Any]) -> bool:
    return bool(_resources(task).get("accelerators"))


def check_spot(yamls: Mapping[str, str], choice: SpotChoice) -> str:
    """Every task asks spot exactly as the placement decision says (checks.spot_choice)."""
    wrong = [label for label, task in tasks(yamls) if bool(_resources(task).get("use_spot")) != choice.spot]
    if wrong:
        raise ConfigError(f"task(s) {', '.join(wrong)} ask use_spot: {str(not choice.spot).lower()}, but the launch "
                          f"decided spot {'on' if choice.spot else 'off'} ({choice.why}); a task asking spot where "
                          f"the placement has none gets no launchable resource; {FIX}")
    return choice.line


def check_restart_policy(cfg: RunConfig, yamls: Mapping[str, str]) -> list[str]:
    """Managed tasks restart a failure only skypilot.max_restarts_on_errors times (SkyPilot counts a failed setup
    too) and recover RECOVER_ON_EXIT_CODES, the transient exits, uncounted."""
    lines, codes = [], list(RECOVER_ON_EXIT_CODES)
    for label, task in tasks(yamls):
        recovery = _resources(task).get("job_recovery")
        if recovery is None:
            continue  # `sky exec` on an existing cluster: SkyPilot restarts nothing
        restarts = recovery.get("max_restarts_on_errors", 0)
        if restarts != cfg.skypilot.max_restarts_on_errors:
            raise ConfigError(f"task {label} restarts a failed setup or run {restarts} times, but "
                              f"skypilot.max_restarts_on_errors is {cfg.skypilot.max_restarts_on_errors}: each "
                              f"restart of a deterministic failure pays for new nodes, the install and the model "
                              f"download again; {FIX}")
        if recovery.get("recover_on_exit_codes") != codes:
            raise ConfigError(f"task {label} has recover_on_exit_codes {recovery.get('recover_on_exit_codes')}, not "
                              f"{codes}: a transient failure (network, store 5xx) would end the job; {FIX}")
        lines.append(f"restarts: task {label} recovers exit code(s) {codes} (transient: network, store 5xx) "
                     f"uncounted, other failures of setup or run {restarts} time(s) "
                     "(skypilot.max_restarts_on_errors)")
    return lines


def check_driver(yamls: Mapping[str, str]) -> list[str]:
    """Every GPU task checks the node's NVIDIA driver before its first install."""
    lines = []
    for label, task in tasks(yamls):
        if not _on_gpu(task):
            continue
        setup = task.get("setup") or ""
        check_at = setup.find("nvidia-smi --query-gpu=driver_version")
        install_at = setup.find("pip install")
        checked = check_at >= 0 and f"sort -V | head -n1)\" != {MIN_DRIVER}" in setup
        if not checked or 0 <= install_at < check_at:
            raise ConfigError(f"task {label} installs torch {TORCH_VERSION} (CUDA {TORCH_CUDA}) without first checking "
                              f"the node's NVIDIA driver is >= {MIN_DRIVER}: on an older driver the first CUDA call "
                              f"fails after the whole install and model download; {FIX}")
        lines.append(f"driver: task {label} needs NVIDIA driver >= {MIN_DRIVER} (torch {TORCH_VERSION}, CUDA "
                     f"{TORCH_CUDA}); its setup checks it first and fails in one line otherwise")
    return lines


def check_transformers(yamls: Mapping[str, str]) -> str:
    """Every GPU task installs the same transformers: the eval scores the model with the stack it trained with."""
    found = {label: pinned(setup_requirements(task.get("setup") or ""), "transformers")
             for label, task in tasks(yamls) if _on_gpu(task)}
    versions = set(found.values())
    if versions != {TRANSFORMERS_VERSION}:
        shown = ", ".join(f"{label}: {v or 'unpinned'}" for label, v in found.items())
        raise ConfigError(f"the GPU tasks install different or unpinned transformers ({shown}); vLLM alone resolves "
                          f"a newer one than verl's pin {TRANSFORMERS_VERSION}, so the eval would score the model "
                          f"with another tokenizer and modelling code than it trained with; {FIX}")
    return (f"transformers: {TRANSFORMERS_VERSION} on every GPU task ({', '.join(found)}): the eval node runs the "
            "trainer's (verl's pin)")


def check_services(yamls: Mapping[str, str]) -> list[str]:
    """CPU service tasks install no CUDA stack."""
    lines = []
    for label, task in tasks(yamls):
        if _on_gpu(task) or not isinstance(_resources(task).get("cpus"), str | int):
            continue
        names = [canonicalize_name(Requirement(r).name) for r in setup_requirements(task.get("setup") or "")]
        heavy = sorted({n for n in names if n in CUDA_STACK})
        if heavy:
            raise ConfigError(f"CPU service task {label} installs {', '.join(heavy)}, the GPU trainer's CUDA stack it "
                              f"never imports (gigabytes per node); give services their own package set; {FIX}")
        lines.append(f"services: task {label} installs {len(names)} packages, none of the CUDA stack")
    return lines


def check_node_env(yamls: Mapping[str, str]) -> str:
    """No task carries MLFLOW_TRACKING_URI (nodes never log to MLflow; a remote URI would bring its credentials into
    the YAML), and setup uses SkyPilot's own uv."""
    for label, task in tasks(yamls):
        if "MLFLOW_TRACKING_URI" in (task.get("envs") or {}):
            raise ConfigError(f"task {label} sets MLFLOW_TRACKING_URI, which no node uses (verl logs with its console "
                              "and file loggers; registration reads the store): a remote URI would be written into "
                              f"the YAML with its credentials; {FIX}")
        setup = task.get("setup") or ""
        if re.search(r"pip install\b[^\n]*\buv\b(?!\S)", setup.replace("uv pip install", "")):
            raise ConfigError(f"task {label} installs uv with pip, though SkyPilot ships its own under {SKY_UV_DIR} "
                              f"on every node it provisions; {FIX}")
    return f"uv: every setup uses SkyPilot's own ({SKY_UV_DIR}/uv); no task carries MLFLOW_TRACKING_URI"


def check_ray_network(yamls: Mapping[str, str]) -> list[str]:
    """Our Ray stays off SkyPilot's Ray's dashboard-agent port; a multi-node run pins NCCL and Gloo to the node's
    interface."""
    lines = []
    for label, task in tasks(yamls):
        run = task["run"]
        starts = re.findall(r"^\s*(?:until\s+)?ray start [^\n]*", run, re.MULTILINE)
        if not starts:
            continue
        bad = [s for s in starts if f"--dashboard-agent-listen-port={RAY_DASHBOARD_AGENT_PORT}" not in s]
        if bad:
            raise ConfigError(f"task {label} starts Ray without --dashboard-agent-listen-port="
                              f"{RAY_DASHBOARD_AGENT_PORT}: Ray's default {SKY_RAY_DASHBOARD_AGENT_PORT} is held by "
                              f"SkyPilot's own Ray on every node; {FIX}")
        lines.append(f"ray: task {label} starts Ray with its dashboard agent on {RAY_DASHBOARD_AGENT_PORT} "
                     f"(SkyPilot's Ray holds {SKY_RAY_DASHBOARD_AGENT_PORT})")
        if int(task.get("num_nodes") or 1) > 1:
            if "NCCL_SOCKET_IFNAME" not in run or "GLOO_SOCKET_IFNAME" not in run:
                raise ConfigError(f"task {label} runs on {task['num_nodes']} nodes without NCCL_SOCKET_IFNAME and "
                                  "GLOO_SOCKET_IFNAME: on instances with several interfaces (EFA, gVNIC) the "
                                  f"collectives may pick one the peers do not reach and hang; {FIX}")
            lines.append(f"network: task {label}'s {task['num_nodes']} nodes pin NCCL_SOCKET_IFNAME and "
                         "GLOO_SOCKET_IFNAME to the interface holding the node's IP")
    return lines
