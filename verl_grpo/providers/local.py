"""The `local` provider: training runs as a process on this machine, in a per-run work dir.

A job is one process group. Its pid and command are recorded in the work dir so a retried step (or a
re-run of the CLI) reattaches to a live job instead of starting a second one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from verl_grpo.config import RunConfig
from verl_grpo.contracts import Cluster, Job, JobState, RunCost, TrainSpec
from verl_grpo.local_paths import state_dir
from verl_grpo.procs import die_with_parent, pid_alive, runs_command, stop_process_group
from verl_grpo.services.local_group import services_env, start_local_services, stop_local_services
from verl_grpo.trainers.exits import ERROR_FILE, RESULT_FILE

_JOB_FILE = "job.json"
_LOG_FILE = "train.log"
_TAIL_LINES = 30


class LocalProvider:
    name = "local"
    evaluates_on_cluster = False  # transformers generate on this machine

    def __init__(self, root: Path | None = None, cancel_grace_s: float = 30.0):
        self.root = Path(root) if root else state_dir() / "work"
        self.cancel_grace_s = cancel_grace_s
        self._children: dict[int, subprocess.Popen] = {}

    def up(self, cfg: RunConfig, run_id: str) -> Cluster:
        workdir = self.root / run_id
        workdir.mkdir(parents=True, exist_ok=True)
        services = start_local_services(cfg, run_id, workdir)
        return Cluster(provider=self.name, name=f"local-{run_id}", workdir=str(workdir),
                       endpoints=services.endpoints if services else {}, on_this_machine=True)

    def submit(self, cluster: Cluster, spec: TrainSpec) -> Job:
        workdir = Path(cluster.workdir)
        name = f"verl-grpo-{spec.run_id}"
        live = self._live_job(workdir)
        if live is not None:
            return live
        log_path = workdir / _LOG_FILE
        # The run's services (URLs, token file) reach the trainer exactly as the SkyPilot job group exports them.
        env = {**os.environ, **spec.env, **services_env(workdir)}
        with open(log_path, "ab") as log:
            offset = log.tell()  # earlier attempts' lines stay above; this job's output starts here
            proc = subprocess.Popen(
                spec.command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=die_with_parent,
            )
        self._children[proc.pid] = proc
        (workdir / _JOB_FILE).write_text(json.dumps({"pid": proc.pid, "name": name, "command": spec.command,
                                                     "log_offset": offset}))
        return Job(provider=self.name, id=str(proc.pid), name=name, log_path=str(log_path), log_offset=offset)

    def status(self, job: Job) -> JobState:
        pid = int(job.id)
        child = self._children.get(pid)
        if child is not None:
            code = child.poll()
            if code is None:
                return JobState(phase="RUNNING")
            return self._finished(job, code)
        if pid_alive(pid):
            return JobState(phase="RUNNING")
        # Reattached process that is gone: its exit code is unknowable; the worker's result file tells success.
        result = Path(job.log_path).parent / RESULT_FILE
        return JobState(phase="SUCCEEDED") if result.is_file() else self._finished(job, -signal.SIGKILL)

    def logs(self, job: Job, follow: bool = False) -> Iterator[str]:
        path = Path(job.log_path)
        while not path.exists():
            if not follow or self.status(job).phase != "RUNNING":
                return
            time.sleep(0.2)
        with open(path, errors="replace") as f:
            f.seek(job.log_offset)
            while True:
                line = f.readline()
                if line:
                    yield line.rstrip("\n")
                    continue
                if not follow or self.status(job).phase != "RUNNING":
                    yield from (rest.rstrip("\n") for rest in f.readlines())
                    return
                time.sleep(0.2)

    def cancel(self, job: Job) -> None:
        pid = int(job.id)
        if not pid_alive(pid) and pid not in self._children:
            return
        if stop_process_group(pid, self.cancel_grace_s, lambda _: self.status(job).phase == "RUNNING", poll_s=0.2):
            self._reap(pid)

    def run_cost(self, cfg: RunConfig, run_id: str) -> RunCost | None:
        """This machine bills nothing: no cloud cost."""
        return None

    def down(self, cluster: Cluster) -> None:
        job = self._live_job(Path(cluster.workdir))
        if job is not None:
            self.cancel(job)
        stop_local_services(cluster.workdir)

    def _live_job(self, workdir: Path) -> Job | None:
        record = workdir / _JOB_FILE
        if not record.is_file():
            return None
        data = json.loads(record.read_text())
        pid = int(data["pid"])
        if not runs_command(pid, data["command"]):
            return None
        return Job(provider=self.name, id=str(pid), name=data["name"], log_path=str(workdir / _LOG_FILE),
                   log_offset=data.get("log_offset", 0))

    def _finished(self, job: Job, code: int) -> JobState:
        if code == 0:
            return JobState(phase="SUCCEEDED")
        if code < 0 or code in (128 + signal.SIGKILL, 128 + signal.SIGTERM):
            sig = -code if code < 0 else code - 128
            return JobState(
                phase="FAILED",
                preempted=True,
                failure_reason=f"training process was killed by signal {signal.Signals(sig).name}",
            )
        reported = _reported_error(Path(job.log_path).parent)
        reason = f"exit code {code}: {reported['message']}" if reported else f"exit code {code}"
        return JobState(phase="FAILED", failure_reason=f"{reason}\n{_tail(Path(job.log_path))}",
                        error_type=reported.get("type") if reported else None)

    def _reap(self, pid: int) -> None:
        child = self._children.get(pid)
        if child is not None:
            child.wait(timeout=10)


def _reported_error(workdir: Path) -> dict | None:
    """The training process's own account of its failure (`error.json`: type, message), if it wrote one."""
    try:
        return json.loads((workdir / ERROR_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _tail(path: Path, lines: int = _TAIL_LINES) -> str:
    if not path.is_file():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
