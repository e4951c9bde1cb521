"""The second launch read, held against today's rendered YAML: each finding put back into the text the launch submits
fails its dry-run check in one line naming it (verl_grpo/providers/skypilot/launch_policy.py), and the decisions the
checks hold it to (spot per placement, transient exits, the driver the node's torch needs) behave as SkyPilot's and
NVIDIA's rules say."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

import pytest
import yaml
from rendered_tasks import render, shape_config

from verl_grpo.errors import ConfigError
from verl_grpo.providers.skypilot import launch_policy as policy, templates
from verl_grpo.providers.skypilot.checks import spot_choice
from verl_grpo.providers.skypilot.node_stack import driver_check
from verl_grpo.trainers.exits import EXIT_RETRYABLE, is_transient, run_entry
from verl_grpo.trainers.verl.socket_ifname import interface_of


class CatalogSky:
    """The boundary's catalog and Kubernetes halves: one cloud selling `spot_price` for every accelerator."""

    def __init__(self, spot_price=None, label=None):
        self.spot_price, self.label = spot_price, label

    def catalog_dir(self):
        return "/nonexistent"

    def kubernetes_spot_label(self):
        return self.label

    def catalog_offers(self, accelerator, count, cloud, region, clouds):
        return [SimpleNamespace(cloud="aws", instance_type="p5.48xlarge", price=98.3, spot_price=self.spot_price)], []


@pytest.fixture(scope="module")
def shipped():
    """The job group (trainer on 2 nodes + services) and the eval task as the launch renders them, with the config."""
    cfg = shape_config("job_group", "skypilot.cloud=kubernetes")
    assert not _choice(cfg).spot  # rendered as the provider renders it: after the spot decision
    group = render("job_group", {}, "skypilot.cloud=kubernetes", "infra.spot=false").yaml
    evaluation = templates.render_eval(cfg, "run-1", "s3://bucket/store/runs/run-1/eval/spec.json", {}).yaml
    return cfg, {"train": group, "eval": evaluation}


def _choice(cfg, sky=None):
    return spot_choice(cfg, sky or CatalogSky(spot_price=30.0))


def test_todays_rendered_tasks_pass_every_check_and_name_each_decision(shipped):
    cfg, yamls = shipped
    lines = [policy.check_spot({"train": yamls["train"]}, _choice(cfg)), *policy.check_restart_policy(cfg, yamls),
             *policy.check_driver(yamls), policy.check_transformers(yamls), *policy.check_services(yamls),
             policy.check_node_env(yamls), *policy.check_ray_network(yamls)]
    text = "\n".join(lines)
    assert "spot: off (skypilot.shape=job_group runs only on Kubernetes" in text
    assert "restarts: task verl-trainer recovers exit code(s) [75]" in text and "0 time(s)" in text
    assert "driver: task verl-trainer needs NVIDIA driver >= 580.65.06 (torch 2.11.0, CUDA 13.0)" in text
    assert "transformers: 5.9.0 on every GPU task (verl-trainer, verl-grpo-run-1-eval)" in text
    assert "services: task data-server installs" in text and "none of the CUDA stack" in text
    assert "network: task verl-trainer's 2 nodes pin NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME" in text
    assert "dashboard agent on 52366" in text


def _edit_task(text: str, task: str, edit) -> str:
    """The YAML with `edit(doc)` applied to the task named `task`."""
    docs = list(yaml.safe_load_all(text))
    for doc in docs:
        if isinstance(doc, dict) and doc.get("name") == task:
            edit(doc)
    return yaml.safe_dump_all(docs, sort_keys=False)


def _setup_of(text: str, task: str, new_setup) -> str:
    return _edit_task(text, task, lambda doc: doc.update(setup=new_setup(doc["setup"])))


def _env_of(text: str, task: str, key: str, value: str) -> str:
    return _edit_task(text, task, lambda doc: doc["envs"].update({key: value}))


TRAINER_INSTALL = "uv pip install 'verl[vllm]==0.9.1' transformers==5.9.0"
DEFECTS = {
    "spot asked on Kubernetes": (
        "train", lambda t: t.replace("use_spot: false", "use_spot: true"), "spot",
        "ask use_spot: true, but the launch decided spot off (skypilot.shape=job_group runs only on Kubernetes"),
    "deterministic failures restarted three times": (
        "train", lambda t: t.replace("max_restarts_on_errors: 0", "max_restarts_on_errors: 3"), "restarts",
        "task verl-trainer restarts a failed setup or run 3 times, but skypilot.max_restarts_on_errors is 0"),
    "transient exits not recovered": (
        "train", lambda t: t.replace("recover_on_exit_codes: [75]", ""), "restarts",
        "recover_on_exit_codes None, not [75]: a transient failure (network, store 5xx) would end the job"),
    "no driver check before the CUDA 13 torch": (
        "train", lambda t: _setup_of(t, "verl-trainer", lambda s: s.replace("nvidia-smi", "true")), "driver",
        "task verl-trainer installs torch 2.11.0 (CUDA 13.0) without first checking the node's NVIDIA driver"),
    "eval node on another transformers": (
        "eval", lambda t: t.replace(" transformers==5.9.0", ""), "transformers",
        "verl-grpo-run-1-eval: unpinned"),
    "services install the CUDA stack": (
        "train", lambda t: _setup_of(t, "data-server", lambda s: s.replace("uv pip install", TRAINER_INSTALL)),
        "services", "CPU service task data-server installs verl, the GPU trainer's CUDA stack"),
    "tracking URI on nodes": (
        "train", lambda t: _env_of(t, "verl-trainer", "MLFLOW_TRACKING_URI", "https://user:pw@mlflow.example"),
        "env", "task verl-trainer sets MLFLOW_TRACKING_URI, which no node uses"),
    "pip's uv instead of SkyPilot's": (
        "eval", lambda t: t.replace("  uv venv", "  python3 -m pip install --quiet --upgrade uv\n  uv venv"), "env",
        "installs uv with pip, though SkyPilot ships its own under $HOME/.local/bin"),
    "Ray's dashboard agent on SkyPilot's port": (
        "train", lambda t: t.replace(" --dashboard-agent-listen-port=52366", ""), "ray",
        "starts Ray without --dashboard-agent-listen-port=52366: Ray's default 52365 is held by SkyPilot's own Ray"),
    "multi-node NCCL/Gloo on any interface": (
        "train", lambda t: t.replace("NCCL_SOCKET_IFNAME", "NCCL_DEBUG"), "ray",
        "task verl-trainer runs on 2 nodes without NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME"),
}


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_each_finding_put_back_fails_its_check_in_one_line_naming_it(shipped, defect):
    cfg, yamls = shipped
    which, put_back, check, says = DEFECTS[defect]
    broken = {**yamls, which: put_back(yamls[which])}
    assert broken[which] != yamls[which], "the defect was not put back"
    run = {"spot": lambda y: policy.check_spot({"train": y["train"]}, _choice(cfg)),
           "restarts": lambda y: policy.check_restart_policy(cfg, y), "driver": policy.check_driver,
           "transformers": policy.check_transformers, "services": policy.check_services,
           "env": policy.check_node_env, "ray": policy.check_ray_network}[check]
    with pytest.raises(ConfigError) as e:
        run(broken)
    assert "\n" not in str(e.value) and says in str(e.value), str(e.value)


@pytest.mark.parametrize("overrides, sky, spot, why", [
    (("skypilot.shape=job_group",), CatalogSky(30.0), False, "skypilot.shape=job_group runs only on Kubernetes"),
    (("skypilot.shape=rollout_group",), CatalogSky(30.0), False, "skypilot.shape=rollout_group runs only on Kub"),
    (("skypilot.shape=multinode", "skypilot.cloud=kubernetes"), CatalogSky(30.0), False, "skypilot.cloud=kubernetes"),
    (("skypilot.shape=job_group",), CatalogSky(30.0, ("karpenter.sh/capacity-type", "spot")), True,
     "labelled karpenter.sh/capacity-type=spot"),
    (("skypilot.shape=multinode", "skypilot.cloud=aws"), CatalogSky(30.0), True, "spot sold on aws"),
    (("skypilot.shape=multinode", "skypilot.cloud=aws"), CatalogSky(None), False, "sells spot"),
])
def test_spot_is_asked_only_where_the_placement_has_it(overrides, sky, spot, why):
    choice = spot_choice(shape_config("multinode", *overrides), sky)
    assert choice.spot is spot and why in choice.line
    assert (choice.warning is None) is spot, choice.warning


def test_the_kubernetes_spot_rule_is_skypilots_own():
    from sky import clouds
    from sky.clouds.kubernetes import Kubernetes

    assert clouds.CloudImplementationFeatures.SPOT_INSTANCE in Kubernetes._CLOUD_UNSUPPORTED_FEATURES
    from sky.provision.kubernetes.utils import SPOT_LABEL_MAP

    assert set(SPOT_LABEL_MAP) == {"gke", "karpenter"}  # what the warning tells the user to set


@pytest.mark.parametrize("nvidia_smi, rc, says", [
    ("echo 580.95.05", 0, "driver check: NVIDIA driver 580.95.05 (>= 580.65.06 for torch 2.11.0, CUDA 13.0)"),
    ("echo 550.54.15", 1, "this node's NVIDIA driver is 550.54.15, but torch 2.11.0"),
    ("echo 580.10.01", 1, "this node's NVIDIA driver is 580.10.01, but torch 2.11.0"),  # R580, older than CUDA 13.0 GA
    ("echo 590.12", 0, "driver check: NVIDIA driver 590.12 (>= 580.65.06"),
    (None, 1, "this node's NVIDIA driver is missing (nvidia-smi found none), but torch 2.11.0"),
])
def test_the_driver_check_runs_first_and_fails_in_one_line(tmp_path, nvidia_smi, rc, says):
    if nvidia_smi:
        (tmp_path / "nvidia-smi").write_text(f"#!/bin/sh\n{nvidia_smi}\n")
        (tmp_path / "nvidia-smi").chmod(0o755)
    script = "set -euo pipefail\n" + "\n".join(driver_check()) + "\necho after\n"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == rc
    out = done.stdout + done.stderr
    assert says in out and ("after" in done.stdout) is (rc == 0)
    assert len(done.stderr.splitlines()) == (rc != 0)


class S3Error(Exception):
    def __init__(self, status, code):
        super().__init__(code)
        self.response = {"ResponseMetadata": {"HTTPStatusCode": status}, "Error": {"Code": code}}


class EndpointConnectionError(Exception):
    """botocore's, by name."""


@pytest.mark.parametrize("error, transient", [
    (ConnectionResetError(104, "reset"), True), (TimeoutError("read"), True), (S3Error(503, "SlowDown"), True),
    (S3Error(500, "InternalError"), True), (EndpointConnectionError("no route"), True),
    (S3Error(403, "AccessDenied"), False), (PermissionError(13, "denied"), False), (ValueError("bug"), False),
    (FileNotFoundError(2, "gone"), False),
])
def test_entry_points_exit_75_only_on_transient_errors(capsys, error, transient):
    assert is_transient(error) is transient

    def body():
        raise RuntimeError("while fetching") from error

    if transient:
        assert run_entry("verl_restore", body) == EXIT_RETRYABLE
        assert "verl_restore: transient RuntimeError" in capsys.readouterr().err
    else:
        with pytest.raises(RuntimeError):
            run_entry("verl_restore", body)


def test_nccl_finds_the_interface_holding_the_nodes_ip():
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("203.0.113.254") is None
    assert os.path.exists("/proc/net/dev")


def test_setup_uses_the_uv_skypilot_installs_on_every_node():
    from sky.skylet import constants

    from verl_grpo.providers.skypilot.node_stack import SKY_UV_DIR

    assert constants.SKY_UV_INSTALL_DIR.strip('"') == SKY_UV_DIR
    assert f'export PATH="{SKY_UV_DIR}:$PATH"' in "\n".join(templates.venv_setup(["pyyaml"], gpu=False))
