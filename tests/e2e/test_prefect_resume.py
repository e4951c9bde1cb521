"""A lost machine under `make serve`: the worker's whole process tree is killed mid-training, a worker is started
again from a shell that knows nothing of the state dir, the zombie automation marks the flow run Crashed, the
rerun automation runs the deployment again with the same run_id, and training resumes right after the last
committed checkpoint in the deployment's own store; one model version is registered. A flow run pointed at
another store with a run id that store does not know fails before any training."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, LogFilter, LogFilterFlowRunId
from prefect.client.schemas.objects import StateType
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_URL
from prefect_serving import pid_alive, served_prefect

from verl_grpo import runs
from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.config import config_files, load_config
from verl_grpo.store import Store

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

ZOMBIE_AFTER_S = 60  # automations.yaml says 90 s; heartbeats come every 30 s (a late one under load is not a crash)
TOTAL_STEPS = 40
RUN_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir):
    home = tmp_path_factory.mktemp("resumed")
    with served_prefect(home, tiny_model_dir.parent, VERL_GRPO_NIGHTLY_ACTIVE="false",
                        VERL_GRPO_ZOMBIE_AFTER_S=str(ZOMBIE_AFTER_S)):
        yield home


def _overrides(tiny_overrides: list[str]) -> list[str]:
    """The tiny run in the state dir's own store and MLflow (what the deployment pins), long enough to kill."""
    keep = [o for o in tiny_overrides if not o.startswith(("storage.", "tracking.", "algorithm.total_steps"))]
    return [*keep, f"algorithm.total_steps={TOTAL_STEPS}"]


def test_a_killed_worker_tree_resumes_after_the_last_checkpoint_on_a_worker_from_another_shell(
        served, tiny_overrides, tmp_path):
    store = Store(f"file://{served / 'store'}")
    checkpoints = CheckpointStore(store)
    first = run_deployment("verl-grpo/gsm8k", parameters={"overrides": _overrides(tiny_overrides)}, timeout=0)
    run_id = _wait_for_commit(first.id, checkpoints, step=2)

    killed = _kill_tree(int((served / "prefect" / "worker.pid").read_text()))
    killed_at = time.monotonic()
    committed = checkpoints.latest_complete(run_id).step  # nothing can commit any more
    assert 2 <= committed < TOTAL_STEPS
    _start_worker_as_a_user_would(served, tmp_path / "elsewhere")

    with get_client(sync_client=True) as client:
        crashed = _wait_for_state(client, first.id, StateType.CRASHED, ZOMBIE_AFTER_S + 120)
        assert crashed.type == StateType.CRASHED, f"{crashed}; killed {killed}"
        rerun = _wait_for_rerun(client, first, run_id)
        resumed_at = _wait_for_line(served / "work" / run_id / "train.log", f"step {committed + 1}/{TOTAL_STEPS}",
                                    client, rerun.id)
        done = _wait_for_state(client, rerun.id, StateType.COMPLETED, RUN_TIMEOUT_S)
        logs = "\n".join(log.message for log in client.read_logs(
            LogFilter(flow_run_id=LogFilterFlowRunId(any_=[rerun.id]))))
    assert done.type == StateType.COMPLETED, logs[-5000:]
    resumed_line = f"resuming run {run_id} from checkpoint step {committed}"
    assert resumed_line in logs
    assert f"step {committed + 1}/{TOTAL_STEPS}" in logs and f"step {committed}/{TOTAL_STEPS}" not in logs
    print(f"\nkill -> step {committed + 1} trained again: {resumed_at - killed_at:.0f} s (zombie window "
          f"{ZOMBIE_AFTER_S} s); last committed step {committed}, no step lost past it")

    assert store.listdir("runs") == [run_id]  # no second run, nothing in the restarted worker's own default store
    assert not (tmp_path / "elsewhere" / "store" / "runs").exists()
    steps = [json.loads(line)["step"] for line in store.read_text("runs", run_id, "metrics.jsonl").splitlines()]
    assert steps == list(range(1, TOTAL_STEPS + 1))  # every step once across both flow runs
    import mlflow

    versions = mlflow.MlflowClient(tracking_uri=f"sqlite:///{served / 'mlflow.db'}").search_model_versions("")
    assert len(versions) == 1, versions


def test_a_flow_run_given_a_run_id_its_store_does_not_know_fails_before_training(served, tiny_overrides, tmp_path):
    overrides = _overrides(tiny_overrides)
    cfg = load_config(config_files(["gsm8k", "local"]), overrides, env={"VERL_GRPO_HOME": str(served)})
    run_id, _ = runs.begin_run(Store(f"file://{served / 'store'}"), cfg, "lives-in-the-deployment-store", fresh=True)
    other = tmp_path / "other-home"
    flow_run = run_deployment("verl-grpo/gsm8k", parameters={"overrides": overrides, "run_id": run_id},
                              job_variables={"env": {"VERL_GRPO_HOME": str(other)}}, timeout=RUN_TIMEOUT_S)
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run.id).state
        # the flow process ships its log lines to the API in the background: they may land after its final state
        deadline = time.monotonic() + 60
        while True:
            logs = [log.message for log in client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id])))]
            reason = [line for line in logs if "no such run in the store" in line]
            if reason or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert state.type == StateType.FAILED, state
    assert reason and f"'{run_id}'" in reason[0] and f"file://{other}/store" in reason[0], logs
    assert not (other / "store" / "runs").exists() and not (other / "work" / run_id).exists()
    assert not any("step 1/" in line for line in logs)


def _wait_for_commit(flow_run_id, checkpoints: CheckpointStore, step: int) -> str:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            flow_run = client.read_flow_run(flow_run_id)
            run_id = flow_run.parameters.get("run_id")
            latest = run_id and checkpoints.latest_complete(run_id)
            if latest and latest.step >= step:
                return run_id
            assert not flow_run.state.is_final(), f"flow run ended before step {step} was committed: {flow_run.state}"
            time.sleep(0.2)
    raise AssertionError(f"no checkpoint of step {step} within {RUN_TIMEOUT_S} s")


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(proc.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def _kill_tree(worker_pid: int) -> list[int]:
    """kill -9 the worker, its flow-run process and the trainer at once, as a lost machine would."""
    tree = _descendants(worker_pid)
    assert len(tree) >= 3, f"expected worker, flow run and trainer under {worker_pid}: {tree}"
    for pid in tree:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(pid_alive(pid) for pid in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(pid) for pid in tree)
    return tree


def _start_worker_as_a_user_would(home: Path, elsewhere: Path) -> None:
    """A worker from a shell with only the Prefect settings: its own VERL_GRPO_HOME (another, empty state dir) and
    Prefect's default heartbeat. The deployment's job variables must win. make stop stops it (worker.pid)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VERL_GRPO_", "PREFECT_")) or k == "VERL_GRPO_MODEL_CACHE"}
    env.update({"PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_HOME": str(home / "prefect"),
                "VERL_GRPO_HOME": str(elsewhere)})
    log = open(home / "prefect" / "worker-restarted.log", "wb")
    worker = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "worker", "start", "--pool",
                               "verl-grpo-local", "--type", "process"], env=env, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    (home / "prefect" / "worker.pid").write_text(str(worker.pid))


def _wait_for_state(client, flow_run_id, state_type: StateType, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while True:
        state = client.read_flow_run(flow_run_id).state
        if state.type == state_type or (state.is_final() and state_type != StateType.CRASHED) \
                or time.monotonic() > deadline:
            return state
        time.sleep(1)


def _wait_for_rerun(client, first, run_id: str, timeout_s: float = 120):
    """The flow run the rerun automation created for the crashed one: same deployment, same run_id."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        flow_runs = client.read_flow_runs(deployment_filter=DeploymentFilter(
            id=DeploymentFilterId(any_=[first.deployment_id])))
        reruns = [r for r in flow_runs if r.id != first.id and r.parameters.get("run_id") == run_id]
        if reruns:
            assert len(reruns) == 1, reruns
            return reruns[0]
        time.sleep(1)
    raise AssertionError(f"the rerun automation started no flow run for {run_id} within {timeout_s} s")


def _wait_for_line(log: Path, text: str, client, flow_run_id, timeout_s: float = RUN_TIMEOUT_S) -> float:
    """time.monotonic() when a line containing `text` first appears in the trainer's log of this attempt."""
    start = log.stat().st_size if log.exists() else 0  # the killed attempt's lines stay above
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists():
            with open(log, "rb") as f:
                f.seek(min(start, log.stat().st_size))
                if text.encode() in f.read():
                    return time.monotonic()
        assert not client.read_flow_run(flow_run_id).state.is_final(), f"the rerun ended before {text!r}"
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in {log} within {timeout_s} s")
