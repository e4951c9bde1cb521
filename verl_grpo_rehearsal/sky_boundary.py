"""Drop-in for `verl_grpo.providers.skypilot.boundary` that submits to the local rehearsal instead of SkyPilot.

Stands in for SkyPilot's API server, jobs controller and clouds: `launch_managed` writes the job under
`$VERL_GRPO_REHEARSAL_DIR/jobs/<id>/` and starts a detached `verl_grpo_rehearsal.controller` that owns it; every
other function reads or signals that directory, so any process (a provider is built fresh per call) sees the
same jobs. Existing clusters (`sky exec`) are directories made by `create_cluster`. Runs for real: SkyPilot's own
YAML loaders (re-exported below, and used by the controller) and everything the controller runs on the nodes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock

from verl_grpo.providers.skypilot.boundary import (
    JobRecord,
    catalog_dir,
    catalog_offers,
    catalog_region_prices,
    check_recovery_strategy,
    kubernetes_spot_label,
    load_job_group,
    load_task,
)
from verl_grpo_rehearsal import ENV_DIR, ENV_DRIVER, ENV_FAIL_AT, ENV_MAIN_PPO, ENV_PREEMPT_AT

__all__ = [
    "JobRecord", "cancel", "cancel_cluster_job", "catalog_dir", "catalog_offers", "catalog_region_prices",
    "check_recovery_strategy", "kubernetes_spot_label",
    "cluster_queue", "cluster_status", "create_cluster", "exec_on_cluster", "is_no_cloud_access", "launch_managed",
    "load_job_group", "load_task", "queue", "stop_all", "summary", "tail_cluster_logs", "tail_logs",
]
"""SkyPilot's own loaders and catalog are re-exported: the provider calls them through this module."""

MANAGED_TERMINAL = frozenset((
    "SUCCEEDED", "FAILED", "FAILED_SETUP", "FAILED_PRECHECKS", "FAILED_NO_RESOURCE", "FAILED_CONTROLLER",
    "CANCELLED"))
CLUSTER_TERMINAL = frozenset(("SUCCEEDED", "FAILED", "FAILED_SETUP", "FAILED_DRIVER", "CANCELLED"))
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
CONTROLLER_START_S = 60.0
"""How long a submitted job may go without a recorded controller pid before it counts as dead (the submitting
process died between starting the controller and recording it)."""
"""The checkout whose `verl_grpo` the controller runs (put on its PYTHONPATH)."""


class RehearsalError(RuntimeError):
    """The rehearsal itself is misused (no state dir, unknown job); not a SkyPilot error."""


def state_dir() -> Path:
    """`$VERL_GRPO_REHEARSAL_DIR`, created on first use."""
    value = os.environ.get(ENV_DIR)
    if not value:
        raise RehearsalError(f"{ENV_DIR} is not set: the rehearsal keeps all its state there")
    path = Path(value).absolute()
    path.mkdir(parents=True, exist_ok=True)
    return path


def cluster_dir(cluster_name: str) -> Path:
    return state_dir() / "clusters" / cluster_name


def job_dir(job_id: int, cluster_name: str | None = None) -> Path:
    base = cluster_dir(cluster_name) if cluster_name else state_dir()
    return base / "jobs" / str(job_id)


# --- submit -------------------------------------------------------------------------------------------------


def launch_managed(yaml_str: str, name: str, secrets: Mapping[str, str], job_group: bool) -> int:
    """Submit a managed job (or job group) named `name`; returns its job id. The controller parses the YAML."""
    return _submit(state_dir(), yaml_str, name, secrets, {"kind": "managed", "job_group": job_group})


def create_cluster(cluster_name: str, num_nodes: int = 1) -> Path:
    """An existing, UP cluster of `num_nodes` nodes (as `sky launch` would leave one) that `sky exec` can target.
    Its nodes keep their home and /tmp between jobs; no process survives from one job to the next."""
    path = cluster_dir(cluster_name)
    path.mkdir(parents=True, exist_ok=True)
    _write_json(path / "cluster.json", {"name": cluster_name, "num_nodes": num_nodes, "status": "UP",
                                        "created_at": time.time()})
    return path


def exec_on_cluster(cluster_name: str, yaml_str: str, secrets: Mapping[str, str]) -> int:
    """Run a task on an existing cluster like `sky exec`: workdir synced, no setup, no file_mounts."""
    if cluster_status(cluster_name) != "UP":
        raise ValueError(f"cluster {cluster_name!r} does not exist or is not UP")
    name = str(_yaml_name(yaml_str) or "sky-cmd")
    return _submit(cluster_dir(cluster_name), yaml_str, name, secrets, {"kind": "cluster", "cluster": cluster_name})


def _submit(base: Path, yaml_str: str, name: str, secrets: Mapping[str, str], extra: dict[str, Any]) -> int:
    jobs = base / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    with FileLock(str(base / "jobs.lock")):
        counter = base / "next_job_id"
        job_id = int(counter.read_text()) if counter.exists() else 1
        counter.write_text(str(job_id + 1))
        path = jobs / str(job_id)
        path.mkdir()
    (path / "task.yaml").write_text(yaml_str)
    fd = os.open(path / "secrets.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(dict(secrets), f)
    preempt_at = [int(s) for s in os.environ.get(ENV_PREEMPT_AT, "").replace(" ", "").split(",") if s]
    _write_json(path / "job.json", {
        "job_id": job_id, "name": name, "submitted_at": time.time(), "preempt_at": preempt_at,
        "fail_at": os.environ.get(ENV_FAIL_AT), "main_ppo": os.environ.get(ENV_MAIN_PPO),
        "driver": os.environ.get(ENV_DRIVER) or None,
        "state_dir": str(state_dir()), **extra})
    status = "PENDING"
    _write_json(path / "state.json", {"status": status, "recovery_count": 0, "failure_reason": None})
    append_event(path, "job_submitted", name=name, **extra)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    with open(path / "controller.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "verl_grpo_rehearsal.controller", str(path)], cwd=str(path), env=env,
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    update_state(path, controller_pid=proc.pid)
    _CHILDREN.append(proc)
    return job_id


_CHILDREN: list[subprocess.Popen] = []
"""Controllers started by this process: polled so they do not linger as zombies."""


# --- observe ------------------------------------------------------------------------------------------------


def queue() -> list[JobRecord]:
    """All managed jobs, newest first, statuses as `ManagedJobStatus` values (one row per job: for a job group,
    the group's status)."""
    return [_job_record(path) for path in _job_dirs(state_dir())]


def cluster_status(cluster_name: str) -> str | None:
    """"UP" for a cluster made by `create_cluster`; None when there is no such cluster."""
    info = cluster_dir(cluster_name) / "cluster.json"
    return str(read_json(info)["status"]) if info.is_file() else None


def cluster_queue(cluster_name: str) -> list[JobRecord]:
    """Jobs of an existing cluster, newest first, statuses as `JobStatus` values."""
    return [_job_record(path) for path in _job_dirs(cluster_dir(cluster_name))]


def tail_logs(job_id: int, follow: bool) -> Iterator[str]:
    """Lines of a managed job's combined log from the start; with follow, until the job ends."""
    return _tail(_existing(job_dir(job_id)), follow)


def tail_cluster_logs(cluster_name: str, job_id: int, follow: bool) -> Iterator[str]:
    """Lines of a cluster job's log from the start; with follow, until the job ends."""
    return _tail(_existing(job_dir(job_id, cluster_name)), follow)


def summary(job_id: int, cluster_name: str | None = None) -> dict[str, Any]:
    """The job's final (or current) record and every event it logged, for the rehearsal report."""
    path = _existing(job_dir(job_id, cluster_name))
    record = _job_record(path)
    state = read_json(path / "state.json")
    events_file = path / "events.jsonl"
    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()] \
        if events_file.exists() else []
    return {"job_id": record.job_id, "name": record.name, "status": record.status,
            "recovery_count": record.recovery_count, "failure_reason": record.failure_reason,
            "tasks": state.get("tasks", {}), "job_dir": str(path), "events": events}


def is_no_cloud_access(exc: BaseException) -> bool:
    """The rehearsal always has its one "cloud": this machine."""
    return False


# --- cancel and teardown ------------------------------------------------------------------------------------


def cancel(job_id: int) -> None:
    """Cancel a managed job: its controller kills every node and ends the job CANCELLED."""
    _cancel(_existing(job_dir(job_id)))


def cancel_cluster_job(cluster_name: str, job_id: int) -> None:
    """Cancel one job on an existing cluster (the cluster stays UP)."""
    _cancel(_existing(job_dir(job_id, cluster_name)))


def stop_all(timeout: float = 30.0) -> None:
    """Cancel every live job (managed and on clusters) and wait until their controllers have exited; a controller
    still alive at the deadline is killed with its process group. Leaves no rehearsal process behind."""
    base = state_dir()
    paths = list(_job_dirs(base)) + [p for c in sorted((base / "clusters").glob("*")) for p in _job_dirs(c)]
    live = [p for p in paths if _controller_alive(p)]
    for path in live:
        _cancel(path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_controller_alive(p) for p in live):
        time.sleep(0.1)
    for path in live:
        if _controller_alive(path):
            _signal_group(path, signal.SIGKILL)
    _reap()


def _cancel(path: Path) -> None:
    if read_json(path / "state.json")["status"] in MANAGED_TERMINAL | CLUSTER_TERMINAL:
        return
    (path / "cancel_requested").touch()
    _signal_group(path, signal.SIGTERM)


def _signal_group(path: Path, sig: int) -> None:
    pid = read_json(path / "state.json").get("controller_pid")
    if pid and _controller_alive(path):
        try:
            os.killpg(int(pid), sig)  # the controller leads its own session: its pid is its group id
        except ProcessLookupError:
            pass


# --- on-disk state (shared with the controller) -------------------------------------------------------------


def _job_dirs(base: Path) -> list[Path]:
    jobs = base / "jobs"
    if not jobs.is_dir():
        return []
    found = [p for p in jobs.iterdir() if p.name.isdigit() and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name), reverse=True)


def _existing(path: Path) -> Path:
    if not (path / "state.json").is_file():
        raise RehearsalError(f"no rehearsal job at {path}")
    return path


def _job_record(path: Path) -> JobRecord:
    job = read_json(path / "job.json")
    # Liveness first, state second: a controller writes its terminal state before it exits, so one
    # that exits between the two reads is seen as finished, never as dead.
    alive = _controller_alive(path)
    state = read_json(path / "state.json")
    status = state["status"]
    failure_reason = state.get("failure_reason")
    terminal = MANAGED_TERMINAL if job.get("kind") == "managed" else CLUSTER_TERMINAL
    if status not in terminal and not alive:
        _reap()
        (path / "secrets.json").unlink(missing_ok=True)  # the job has ended: its controller cannot clean up
        if (path / "cancel_requested").exists():  # killed by the cancel before it could handle it
            status = "CANCELLED"
        else:
            status = "FAILED_CONTROLLER" if job.get("kind") == "managed" else "FAILED_DRIVER"
            failure_reason = failure_reason or "the rehearsal controller process died while the job was live"
    timeline = _timeline(path, state) if status in terminal else {}
    return JobRecord(job_id=int(job["job_id"]), name=str(job["name"]), status=status,
                     recovery_count=int(state.get("recovery_count") or 0), failure_reason=failure_reason,
                     submitted_at=job.get("submitted_at"), **timeline)


def _timeline(path: Path, state: dict[str, Any]) -> dict[str, float | None]:
    """An ended job's timeline as `sky jobs queue` reports it: start_at (the controller began provisioning),
    end_at, and job_duration (seconds its command ran, summed over attempts; the longest-running task of a group)."""
    events_file = path / "events.jsonl"
    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()] \
        if events_file.exists() else []
    start_at = next((e["ts"] for e in events if e["event"] == "controller_started"), None)
    end_at = state.get("ended_at") or (events[-1]["ts"] if events else None)
    running: dict[str, float] = {}
    ran: dict[str, float] = {}
    for e in events:
        task = e.get("task")
        if e["event"] == "run_started":
            running[task] = e["ts"]
        elif e["event"] in ("recovering", "task_ended") and task in running:
            ran[task] = ran.get(task, 0.0) + e["ts"] - running.pop(task)
    for task, since in running.items():  # killed with the job (e.g. an auxiliary after the primaries ended)
        ran[task] = ran.get(task, 0.0) + (end_at or since) - since
    return {"start_at": start_at, "end_at": end_at, "job_duration": max(ran.values(), default=None)}


def _controller_alive(path: Path) -> bool:
    """Whether the job's controller process runs (not a zombie, and really this job's controller)."""
    pid = read_json(path / "state.json").get("controller_pid")
    if not pid:
        # `_submit` records the pid just after starting the controller: a job listed before that is starting, not
        # dead (reading it as dead deleted the secrets the controller was about to read).
        return time.time() - float(read_json(path / "job.json").get("submitted_at", 0)) < CONTROLLER_START_S
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = _cmdline(int(pid))
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    # An empty cmdline is a process inside execve: `Popen` returns once the exec has closed its pipe, before the
    # kernel has laid out the new program's arguments. On a busy machine a status read can land in that window
    # (reading it as dead deleted the secrets the controller was about to read: FAILED_CONTROLLER in CI).
    return not cmdline or str(path) in cmdline


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")


def _reap() -> None:
    for proc in list(_CHILDREN):
        if proc.poll() is not None:
            _CHILDREN.remove(proc)


def _tail(path: Path, follow: bool) -> Iterator[str]:
    log = path / "run.log"
    while follow and not log.exists() and not _is_over(path):
        time.sleep(0.1)
    if not log.exists():
        return
    with log.open("r", errors="replace") as f:
        pending = ""
        while True:
            chunk = f.readline()
            if chunk:
                pending += chunk
                if pending.endswith("\n"):
                    yield pending[:-1]
                    pending = ""
                continue
            if not follow:
                break
            if _is_over(path):
                rest = f.read()  # the controller may have written its last lines before the final state
                if not rest:
                    break
                pending += rest
                continue
            time.sleep(0.1)
        if pending:
            yield from pending.splitlines()


def _is_over(path: Path) -> bool:
    status = _job_record(path).status
    return status in MANAGED_TERMINAL or status in CLUSTER_TERMINAL


def _yaml_name(yaml_str: str) -> str | None:
    import yaml

    docs = [d for d in yaml.safe_load_all(yaml_str) if isinstance(d, dict)]
    return docs[0].get("name") if docs else None


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def update_state(path: Path, **changes: Any) -> None:
    with FileLock(str(path / "state.lock")):
        state = read_json(path / "state.json")
        state.update(changes)
        _write_json(path / "state.json", state)


def append_event(path: Path, event: str, **fields: Any) -> None:
    with (path / "events.jsonl").open("a") as f:
        f.write(json.dumps({"ts": round(time.time(), 3), "event": event, **fields}) + "\n")
