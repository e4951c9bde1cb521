"""The rehearsal's recovery and placement decisions are SkyPilot's own (its jobs recovery strategy executor and its
clouds' feature checks), taken offline; and the nvidia-smi stand-in a GPU node runs. No rehearsal job is started."""

from __future__ import annotations

import json
import os
import socket
import subprocess

import pytest

from verl_grpo.providers.skypilot import boundary
from verl_grpo_rehearsal import DEFAULT_DRIVER, ENV_DRIVER
from verl_grpo_rehearsal.controller import no_launchable_spot, recovery_executor
from verl_grpo_rehearsal.shims import GPU_SHIMS, write_shims

INFO = {"job_id": 7, "name": "job"}
POLICY = {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 0, "recover_on_exit_codes": [75]}


def _task(resources: dict | None = None, name: str = "verl-trainer"):
    doc = {"name": name, "run": "true", **({"resources": resources} if resources else {})}
    return boundary.load_task(json.dumps(doc), {})


def test_the_executor_restarts_a_listed_exit_code_without_counting_and_counts_the_others():
    task = _task({"job_recovery": POLICY})
    executor = recovery_executor(task, INFO, 0)
    assert (executor.max_restarts_on_errors, executor.recover_on_exit_codes) == (0, [75])
    assert [executor.should_restart_on_failure(exit_codes=[75]) for _ in range(3)] == [True] * 3
    assert executor.should_restart_on_failure(exit_codes=[7]) is False
    assert executor.should_restart_on_failure(exit_codes=[0, 75]) is True
    assert [r.job_recovery for r in task.resources] == [POLICY], "the rehearsal's own task keeps its job_recovery"


def test_the_executor_counts_max_restarts_on_errors_and_defaults_as_sky_jobs_launch():
    counted = recovery_executor(_task({"job_recovery": {"max_restarts_on_errors": 2, "recover_on_exit_codes": 75}}),
                                INFO, 1)
    assert counted.recover_on_exit_codes == [75]  # a single int, as SkyPilot normalizes it
    assert [counted.should_restart_on_failure(exit_codes=[3]) for _ in range(3)] == [True, True, False]
    assert counted.restart_cnt_on_failure == 3
    default = recovery_executor(_task(), INFO, 0)  # no job_recovery: the launch's default strategy, no restarts
    assert (type(default).__name__, default.max_restarts_on_errors) == ("EagerFailoverStrategyExecutor", 0)
    assert default.should_restart_on_failure(exit_codes=[75]) is False


@pytest.fixture
def no_network(monkeypatch):
    def refuse(self, address):
        raise AssertionError(f"the spot check touched the network: {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.mark.parametrize(("resources", "refused"), [
    ({"infra": "kubernetes", "use_spot": True, "accelerators": "H100:1"}, "use_spot on Kubernetes: Spot instances "
                                                                          "are not supported in Kubernetes."),
    ({"infra": "lambda", "use_spot": True}, "use_spot on Lambda: Spot instances are not supported in Lambda."),
    ({"any_of": [{"infra": "lambda", "use_spot": True}, {"infra": "aws", "use_spot": True}]}, None),
    ({"infra": "aws", "use_spot": True}, None),
    ({"infra": "kubernetes"}, None),
    ({"use_spot": True}, None),  # no cloud named: SkyPilot picks one that has spot
])
def test_spot_is_judged_by_the_clouds_own_feature_check_offline(no_network, resources, refused):
    reason = no_launchable_spot(_task(resources), "verl-trainer")
    if refused is None:
        assert reason is None
    else:
        assert reason.startswith(f"No launchable resource: task verl-trainer asks {refused}") and "\n" not in reason


def test_nvidia_smi_is_a_gpu_nodes_tool_answering_the_driver_query(tmp_path):
    write_shims(tmp_path, "/usr/bin/python3", tmp_path)
    assert not (tmp_path / "nvidia-smi").exists(), "a CPU node's PATH (the shims dir) has no nvidia-smi"
    smi = str(tmp_path / GPU_SHIMS / "nvidia-smi")
    base = {"PATH": os.environ["PATH"]}

    def run(*args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run([smi, *args], env=base | env, capture_output=True, text=True)

    answer = run("--query-gpu=driver_version", "--format=csv,noheader", SKYPILOT_NUM_GPUS_PER_NODE="4")
    assert (answer.returncode, answer.stdout) == (0, f"{DEFAULT_DRIVER}\n" * 4)
    assert answer.stderr == f"rehearsal: nvidia-smi stands in (driver {DEFAULT_DRIVER})\n"
    older = run("--format=csv,noheader", "--query-gpu=driver_version", **{ENV_DRIVER: "550.54.15"})
    assert (older.returncode, older.stdout) == (0, "550.54.15\n")  # at least one GPU
    other = run("-L")
    assert other.returncode != 0 and other.stdout == "" and "not stood in" in other.stderr
