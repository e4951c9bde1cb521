"""Nightly retrains fire: on a real local server (`make serve`), Prefect's scheduler service creates Scheduled
runs for every deployment whose schedule is active (the CPU ones; the GPU ones stay paused while no
VERL_GRPO_GPU_STORE names their bucket), the nightly runs start a minute apart, a run whose time falls inside the
test's window is picked up by the worker and completes as a `nightly` run, and the server log holds no ERROR
record."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import DeploymentScheduleCreate
from prefect.client.schemas.objects import StateType
from prefect.client.schemas.schedules import IntervalSchedule
from prefect.settings import PREFECT_API_URL
from prefect_serving import served_prefect

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "infra" / "prefect"))
from check_server import is_transient, log_errors  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

DEPLOYMENTS = ("verl-grpo/gsm8k", "verl-grpo/math", "verl-grpo/mbpp")
GPU_DEPLOYMENTS = ("verl-grpo/gsm8k-gpu", "verl-grpo/math-gpu", "verl-grpo/mbpp-gpu")
RUN_TIMEOUT_S = 600  # a bound for a hang, with room for two other xdist workers beside


@pytest.fixture(scope="module")
def scheduling_server(tmp_path_factory, tiny_model_dir):
    """`make serve` with the schedules active and no GPU store; the nightly cron set twelve hours away, so none
    fires here."""
    home = tmp_path_factory.mktemp("scheduled")
    far = datetime.now(timezone.utc) + timedelta(hours=12)
    with served_prefect(home, tiny_model_dir.parent, VERL_GRPO_NIGHTLY_ACTIVE="true",
                        VERL_GRPO_NIGHTLY_CRON=f"{far.minute} {far.hour} * * *") as started:
        yield home, started, far


def test_cpu_deployments_get_scheduled_runs_gpu_ones_wait_for_a_bucket_and_the_server_log_has_no_error(
        scheduling_server):
    home, started, far = scheduling_server
    assert "scheduler: " in started.stdout and " 0 scheduled" not in started.stdout, started.stdout
    assert f"paused: {', '.join(GPU_DEPLOYMENTS)}" in started.stdout, started.stdout
    listed = subprocess.run([str(Path(sys.executable).parent / "prefect"), "flow-run", "ls", "--state", "Scheduled",
                             "--limit", "100", "-o", "json"],
                            env={"PATH": "/usr/bin:/bin", "HOME": str(home), "PREFECT_HOME": str(home / "prefect"),
                                 "PREFECT_API_URL": PREFECT_API_URL.value()},
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    runs = json.loads(listed.stdout)
    starts = {}
    with get_client(sync_client=True) as client:
        for name in (*DEPLOYMENTS, *GPU_DEPLOYMENTS):
            deployment = client.read_deployment_by_name(name)
            [schedule] = deployment.schedules
            assert schedule.schedule.timezone == "UTC"
            assert schedule.active == (name in DEPLOYMENTS), name
            scheduled = sum(r["deployment_id"] == str(deployment.id) for r in runs)
            assert scheduled >= 1 if name in DEPLOYMENTS else scheduled == 0, (name, scheduled)
            starts[name] = schedule.schedule.cron
    # a minute apart, in prefect.yaml's order, from the nightly cron's minute on
    assert list(starts.values()) == [f"{(far.minute + k) % 60} {far.hour} * * *" for k in range(6)], starts
    assert _service_errors(home) == []


def test_a_schedule_in_the_window_fires_and_the_worker_completes_it(scheduling_server, tiny_overrides):
    home, _, _ = scheduling_server
    due = datetime.now(timezone.utc) + timedelta(seconds=15)
    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("verl-grpo/gsm8k")
        deployment_id = client.create_deployment(
            flow_id=nightly.flow_id, name="tiny-nightly", entrypoint=nightly.entrypoint,
            pull_steps=nightly.pull_steps, work_pool_name=nightly.work_pool_name,
            work_queue_name=nightly.work_queue_name, tags=nightly.tags,
            parameters={"config": ["gsm8k", "local"], "overrides": tiny_overrides},
            schedules=[DeploymentScheduleCreate(schedule=IntervalSchedule(interval=timedelta(hours=1),
                                                                          anchor_date=due, timezone="UTC"),
                                                active=True)],
        )
        flow_run = _wait_for_run(client, deployment_id)
        assert flow_run.auto_scheduled and flow_run.created_by.type == "SCHEDULE"
        flow_run = _wait_for_final(client, flow_run.id)
    assert flow_run.state.type == StateType.COMPLETED, flow_run.state
    assert flow_run.start_time >= due - timedelta(seconds=1)
    assert {"nightly", "auto-scheduled", "gsm8k", "tiny"} <= set(flow_run.tags)
    assert _service_errors(home) == []


def _service_errors(home: Path) -> list[str]:
    """ERROR records of the server log, less SQLite lock contention that Prefect retries by itself."""
    return [e for e in log_errors((home / "prefect" / "server.log").read_text()) if not is_transient(e)]


def _wait_for_run(client, deployment_id, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = [r for r in client.read_flow_runs() if r.deployment_id == deployment_id]
        if runs:  # the scheduler creates a few ahead; the first is the one due in the window
            return min(runs, key=lambda r: r.expected_start_time)
        time.sleep(1)
    raise AssertionError(f"the scheduler created no run for deployment {deployment_id} within {timeout_s} s")


def _wait_for_final(client, flow_run_id, timeout_s: float = RUN_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        flow_run = client.read_flow_run(flow_run_id)
        if flow_run.state.is_final():
            return flow_run
        time.sleep(1)
    raise AssertionError(f"scheduled run {flow_run_id} still {flow_run.state.type} after {timeout_s} s")
