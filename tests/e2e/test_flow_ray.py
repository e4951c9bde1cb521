"""The flow's eval step sharded on both task runners: its tables and metrics equal one unsharded eval of the
same models (the base model, and the model the run trained), and a local Ray stays on loopback and stops. The
thread runner's shards are checked on the run tests/e2e/test_flow.py checks end to end (`check_sharded_evals`)."""

from __future__ import annotations

import time

import psutil
import pytest
from prefect_template import seeded_test_harness
from sharded_evals import check_sharded_evals

from verl_grpo.config import OrchestrationConfig

pytestmark = pytest.mark.e2e

RAY_PROCESSES = {"raylet", "gcs_server"}


@pytest.fixture(scope="module")
def prefect_harness():
    with seeded_test_harness():
        yield


def test_two_shards_on_local_ray_equal_one_task_and_leave_no_ray_behind(prefect_harness, tiny_overrides):
    """(The thread runner's two shards: tests/e2e/test_flow.py, on the run it checks end to end.)"""
    from verl_grpo_flows.verl_grpo import verl_grpo

    overrides = [*tiny_overrides, "eval.shards=2", "orchestration.task_runner=ray"]
    check_sharded_evals(verl_grpo(config=["gsm8k"], overrides=overrides), overrides)
    import ray

    assert not ray.is_initialized()
    assert wait_for_no_ray_processes() == []


def test_local_ray_listens_on_loopback_only_and_stops_with_the_runner():
    import ray  # noqa: F401  (imported before the runner is made, as any earlier use of Ray would)

    from verl_grpo_flows.task_runners import task_runner

    assert wait_for_no_ray_processes() == []  # none left by an earlier test
    with task_runner(OrchestrationConfig(task_runner="ray")):
        children = psutil.Process().children(recursive=True)
        names = {_name(p) for p in children}
        listening = {(_name(p), c.laddr.ip) for p in children for c in _connections(p) if c.status == psutil.CONN_LISTEN}
    assert RAY_PROCESSES <= names
    assert listening and {ip.removeprefix("::ffff:") for _, ip in listening} == {"127.0.0.1"}, listening
    assert wait_for_no_ray_processes() == []


def wait_for_no_ray_processes(deadline_s: float = 30.0) -> list[str]:
    """Names of raylet / gcs_server processes under this one still alive after up to deadline_s."""
    end = time.monotonic() + deadline_s
    while True:
        alive = [p.name() for p in psutil.Process().children(recursive=True) if _name(p) in RAY_PROCESSES]
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.5)


def _name(process: psutil.Process) -> str:
    try:
        return process.name()
    except psutil.NoSuchProcess:
        return ""


def _connections(process: psutil.Process) -> list:
    try:
        return process.net_connections(kind="inet")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
