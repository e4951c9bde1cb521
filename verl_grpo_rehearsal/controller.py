"""The rehearsal's jobs controller: `python -m verl_grpo_rehearsal.controller JOB_DIR` owns one job until it ends.

Stands in for SkyPilot's jobs controller and for the VMs it provisions: every node of every task is a set of
unprivileged Linux namespaces on this machine (a fresh PID namespace, so killing a node kills everything it started,
like a preempted VM; a mount namespace with the node's own /tmp and an /etc/hosts that resolves the job group's
`<task>-<rank>.<group>` names to 127.0.0.1; the job's own network namespace, see `network`). Runs for real:
SkyPilot's YAML loaders, the workdir sync (git-tracked and untracked-not-ignored files), file_mounts from the store
(s3 via fsspec) or local paths, bucket mounts in MOUNT_CACHED mode (`cached_mount`: a dir per node, written back to
the bucket asynchronously), the task's setup and run scripts, ray. Stood in: GPUs (SKYPILOT_NUM_GPUS_PER_NODE is
only reported, and `nvidia-smi` reports the rehearsed driver), package installs and verl's trainer (see `shims`),
preemptions (injected at verl step numbers). Decided by SkyPilot's own code: whether a failed setup or run is
restarted (its jobs recovery strategy executor: max_restarts_on_errors, recover_on_exit_codes) and whether a task's
spot request can be placed on its cloud (the cloud's feature check).

Log format of `run.log`: the first primary task's rank-0 lines are written unprefixed (so `step:N - ...` stays at
line start for our parsers); every other node's lines as `(<task>, rank=<r>) <line>`; the controller's own lines
as `rehearsal: <what happened>`.
"""

from __future__ import annotations

import asyncio
import collections
import configparser
import ctypes
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl_grpo.evaluate.vllm_runner import ENV_CPU_THREADS
from verl_grpo.providers.skypilot.checks import profile_with_keys
from verl_grpo.trainers.verl.commit import COMMITTED_LINE
from verl_grpo_rehearsal import (
    ENV_DRIVER,
    ENV_FAIL_AT,
    ENV_MAIN_PPO,
    ENV_ON_NODE,
    ENV_PREEMPT_PENDING,
    STANDIN_THREADS,
)
from verl_grpo_rehearsal.cached_mount import CachedMount, bucket_fs
from verl_grpo_rehearsal.network import JobNetwork, listening_on_host, loopback_ports
from verl_grpo_rehearsal.node_env import ENV_BASE_ENV
from verl_grpo_rehearsal.shims import GPU_SHIMS, write_shims
from verl_grpo_rehearsal.sky_boundary import (
    PACKAGE_ROOT,
    append_event,
    read_json,
    update_state,
)

STEP_LINE = re.compile(r"^step:(\d+) - ")
"""verl's console step line; the primary task's rank 0 is watched for it to inject preemptions."""
PREEMPT_GRACE_S = 25.0
"""An injected preemption at step N lands once step N's own checkpoint is committed (so the recovery has something
to restore), at step N+1's line, or this long after step N's line, whichever comes first."""
POLL_S = 0.1
RECOVERY_WAIT_S = 1.0
"""Pause between killing a preempted task's nodes and relaunching it (SkyPilot re-provisions here)."""
LOG_TAIL_LINES = 15
BASE_ENV = "python"
"""A node's bare Python environment, in its root (kept with a cluster's nodes between `sky exec` jobs)."""
NAMESPACE_FLAGS = ("--user", "--map-root-user", "--mount", "--pid", "--fork", "--mount-proc", "--kill-child")
NEEDS_NAMESPACES = ("the rehearsal needs unprivileged user namespaces "
                    "(`unshare --user --map-root-user --mount --pid --fork` must work on this machine)")
PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: a forked child must not load libraries


class JobLog:
    """The job's combined `run.log`, written by one reader thread per node and by the controller."""

    def __init__(self, path: Path):
        self._file = path.open("a", buffering=1, errors="replace")
        self._lock = threading.Lock()

    def write(self, line: str) -> None:
        with self._lock:
            self._file.write(line + "\n")

    def say(self, what: str) -> None:
        self.write(f"rehearsal: {what}")


class Node:
    """One node of one attempt of a task: an `unshare` process whose PID 1 is a bash agent that runs setup,
    waits for the controller's go (setup done on every node, as SkyPilot), runs `run`, and stays alive (with
    whatever daemons the run left, e.g. a worker's raylet) until the controller kills the namespace."""

    def __init__(self, task: TaskRun, rank: int, state: Path, root: Path):
        self.task, self.rank, self.state, self.root = task, rank, state, root
        self.attempt = task.attempt
        self.proc: subprocess.Popen | None = None
        self.reader: threading.Thread | None = None
        self.setup_rc: int | None = None
        self.run_rc: int | None = None
        self.mounts: list[CachedMount] = []
        """This node's MOUNT_CACHED bucket mounts (storage mounts of the task)."""

    @property
    def prefix(self) -> str:
        return "" if self.task.watch_steps and self.rank == 0 else f"({self.task.name}, rank={self.rank}) "

    def start(self, env: dict[str, str], cwd: Path, run_setup: bool, view: HostView) -> None:
        (self.state / "setup.sh").write_text(self.task.task.setup or "")
        (self.state / "run.sh").write_text(self.task.task.run or "")
        agent = self.state / "node.sh"
        agent.write_text(_agent_script(self.state, self.root / "tmp", cwd, run_setup, view))
        self.proc = subprocess.Popen(
            [*self.task.job.network.enter, "unshare", *NAMESPACE_FLAGS, "bash", str(agent)], env=env,
            cwd=str(self.root), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent)
        self.reader = threading.Thread(target=self._read, daemon=True, name=f"{self.task.name}-{self.rank}")
        self.reader.start()

    def _read(self) -> None:
        assert self.proc and self.proc.stdout
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\r\n")
            self.task.log.write(self.prefix + line)
            self.task.tail.append(f"{self.prefix}{line}")
            if self.rank == 0 and self.task.watch_steps and self.attempt == self.task.attempt:
                if match := STEP_LINE.match(line):
                    self.task.saw_step(int(match.group(1)))
                elif match := COMMITTED_LINE.match(line):
                    self.task.saw_commit(int(match.group(1)))

    def poll_codes(self) -> tuple[bool, bool]:
        """Read newly written exit codes; returns (setup code new, run code new)."""
        new_setup = new_run = False
        if self.setup_rc is None and (self.state / "setup.rc").exists():
            self.setup_rc, new_setup = int((self.state / "setup.rc").read_text()), True
        if self.run_rc is None and (self.state / "run.rc").exists():
            self.run_rc, new_run = int((self.state / "run.rc").read_text()), True
        return new_setup, new_run

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def go(self) -> None:
        (self.state / "go").touch()

    def flush_mounts(self) -> None:
        """The run exited: its cached mounts upload what is pending (SkyPilot's epilogue waits for that)."""
        for mount in self.mounts:
            mount.flush()

    def kill(self) -> None:
        """SIGKILL the namespace's init (and unshare): the kernel kills every process in the PID namespace. Its
        cached mounts stop at once: writes not uploaded yet are lost, as with a preempted VM."""
        for mount in self.mounts:
            mount.drop()
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        if self.reader is not None:
            self.reader.join(timeout=5)


class TaskRun:
    """One task of the job through its attempts: launch nodes, watch exit codes, restart on errors, recover from
    injected preemptions. Statuses are SkyPilot's ManagedJobStatus values (JobStatus for `sky exec` jobs)."""

    def __init__(self, job: JobController, index: int, task: Any, primary: bool, watch_steps: bool):
        self.job, self.index, self.task, self.primary = job, index, task, primary
        self.name = str(task.name or job.info["name"])
        self.log = job.log
        self.watch_steps = watch_steps
        self.exec_mode = job.exec_mode
        self.status = "PENDING"
        self.failure_reason: str | None = None
        self.attempt = 0
        self.nodes: list[Node] = []
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self.executor = None if self.exec_mode else recovery_executor(task, job.info, index)
        """SkyPilot's own jobs recovery strategy executor for this task: decides restarts after user-code failures
        (`sky exec` restarts nothing)."""
        self.recovery_count = 0
        self.preempt_at = set() if self.exec_mode else set(job.info.get("preempt_at") or [])
        self.used_steps: set[int] = set()
        self.preempt_step: int | None = None
        self.armed: tuple[int, float] | None = None
        """(step, deadline) of a preemption waiting for its step's commit."""
        self.relaunch_at: float | None = None
        self.terminate_at: float | None = None
        self.running = False

    @property
    def terminal(self) -> bool:
        return self.status in ("SUCCEEDED", "FAILED", "FAILED_SETUP", "CANCELLED")

    def saw_step(self, step: int) -> None:
        """Called from a reader thread; the main loop does the killing."""
        if self.armed is not None and step > self.armed[0]:
            self._fire()
        if step in self.preempt_at and step not in self.used_steps and self.preempt_step is None:
            self.used_steps.add(step)
            self.armed = (step, time.monotonic() + PREEMPT_GRACE_S)

    def saw_commit(self, step: int) -> None:
        if self.armed is not None and step >= self.armed[0]:
            self._fire()

    def _fire(self) -> None:
        if self.armed is not None:
            self.preempt_step, self.armed = self.armed[0], None

    def launch(self) -> None:
        self.attempt += 1
        self.running = False
        self.tail.clear()
        if self.status == "PENDING":
            self.status = "SETTING_UP" if self.exec_mode else "STARTING"
        num_nodes = int(self.task.num_nodes or 1)
        self.nodes = []
        for rank in range(num_nodes):
            state = self.job.path / f"attempt-{self.attempt}" / _safe(self.name) / f"node-{rank}"
            root = self.job.cluster_path / f"node-{rank}" if self.exec_mode else state
            state.mkdir(parents=True, exist_ok=True)
            for sub in ("home", "tmp"):
                (root / sub).mkdir(parents=True, exist_ok=True)
            _install_sky_uv(root / "home", self.job.path / "shims")
            self.nodes.append(Node(self, rank, state, root))
        for node in self.nodes:
            self._prepare(node)
        self.job.event("task_launched", task=self.name, attempt=self.attempt, num_nodes=num_nodes)
        self.log.say(f"task {self.name}: attempt {self.attempt} on {num_nodes} node(s)")
        for node in self.nodes:
            cwd = node.root / "workdir" if self.task.workdir else node.root / "home"
            node.start(self._env(node), cwd, run_setup=not self.exec_mode, view=self.job.host_view)

    def _prepare(self, node: Node) -> None:
        workdir = node.root / "workdir"
        if workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir()
        if isinstance(self.task.workdir, str):
            sync_workdir(Path(self.task.workdir).expanduser(), workdir)
        hosts = Path("/etc/hosts").read_text()
        if self.job.group_name and self.job.group_hostnames:
            names = [f"127.0.0.1 {t.name}-{r}.{self.job.group_name}"
                     for t in self.job.tasks for r in range(int(t.task.num_nodes or 1))]
            hosts = hosts.rstrip("\n") + "\n# rehearsal: job group hosts\n" + "\n".join(names) + "\n"
        (node.state / "hosts").write_text(hosts)
        if not self.exec_mode:  # `sky exec` does not sync file_mounts
            for dst, src in (self.task.file_mounts or {}).items():
                materialize_mount(str(src), node_path(node.root, str(dst)), self._mount_credentials(dst, str(src)))
            for dst, storage in (getattr(self.task, "storage_mounts", None) or {}).items():
                mode = getattr(storage.mode, "value", str(storage.mode))
                if mode != "MOUNT_CACHED":
                    raise ValueError(f"file_mounts {dst}: the rehearsal stands in for bucket mounts in MOUNT_CACHED "
                                     f"mode only (got {mode})")
                credentials = self._mount_credentials(dst, str(storage.source))
                mount = CachedMount(str(storage.source), node_path(node.root, str(dst)), bucket_fs(credentials))
                mount.start()
                node.mounts.append(mount)

    def _mount_credentials(self, dst: str, src: str) -> Callable[[str], str | None]:
        """What SkyPilot authenticates a bucket mount or an s3:// file_mount with: the cloud's credentials, never the
        task's envs or secrets (sky/clouds/aws.py get_credential_file_mounts). On AWS (or a task pinned to no cloud)
        that is the nodes' IAM role, stood in by this machine's AWS environment; elsewhere only an uploaded
        ~/.aws/credentials; AWS keys in the environment are not uploaded."""
        endpoint = self._env_value("AWS_ENDPOINT_URL")
        if not src.startswith("s3://"):
            return lambda key: None
        cloud = _pinned_cloud(self.task)
        if cloud in (None, "aws"):
            return lambda key: endpoint if key == "AWS_ENDPOINT_URL" else os.environ.get(key)
        found = profile_with_keys(os.environ)
        if found is None:
            raise MountWithoutCredentials(
                f"file_mounts {dst} ({src}): SkyPilot authenticates it on {cloud} only with an uploaded "
                "~/.aws/credentials, and this machine's has no keys; AWS keys in the environment or the task's secrets "
                "are never used for mounts (sky/clouds/aws.py): fetch it in the task with its secrets instead")
        profile, shared = found
        parser = configparser.ConfigParser()
        parser.read(shared)
        values = {"AWS_ACCESS_KEY_ID": parser.get(profile, "aws_access_key_id"),
                  "AWS_SECRET_ACCESS_KEY": parser.get(profile, "aws_secret_access_key", fallback=None),
                  "AWS_SESSION_TOKEN": parser.get(profile, "aws_session_token", fallback=None),
                  "AWS_ENDPOINT_URL": endpoint}
        return values.get

    def _env_value(self, key: str) -> str | None:
        secrets = _secret_values(self.task)
        return (self.task.envs or {}).get(key) or secrets.get(key) or self.job.secrets.get(key) \
            or os.environ.get(key)

    def _env(self, node: Node) -> dict[str, str]:
        num_nodes = len(self.nodes)
        info = self.job.info
        env = {
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "PYTHONUNBUFFERED": "1",  # stream logs as SkyPilot's log tailing shows them
            **{k: str(v) for k, v in (self.task.envs or {}).items()},
            **_secret_values(self.task),
            "HOME": str(node.root / "home"),
            "USER": os.environ.get("USER", "root"),
            # A bare interpreter first (the shims, then the node's base env), never this machine's venv: the node
            # has only what its setup installs (node_env).
            "PATH": f"{self._shims_path()}:{node.root / BASE_ENV}/bin:/usr/local/bin:/usr/bin:/bin",
            ENV_BASE_ENV: str(node.root / BASE_ENV),
            ENV_ON_NODE: "1",
            ENV_CPU_THREADS: str(STANDIN_THREADS),  # the eval's vLLM stood in by transformers on the CPU
            "SKYPILOT_NODE_RANK": str(node.rank),
            "SKYPILOT_NODE_IPS": "\n".join(["127.0.0.1"] * num_nodes),
            "SKYPILOT_NUM_NODES": str(num_nodes),
            "SKYPILOT_NUM_GPUS_PER_NODE": str(_gpus_per_node(self.task)),
            "SKYPILOT_TASK_ID": f"sky-managed-{int(info['submitted_at'])}_{info['name']}_{info['job_id']}"
                                f"-{self.index}",
            "SKYPILOT_CLUSTER_INFO": json.dumps({
                "cluster_name": info.get("cluster") or f"{_safe(self.name)}-{info['job_id']}",
                "cloud": "Rehearsal", "region": "local", "zone": None}),
        }
        if self.job.group_name:
            env["SKYPILOT_JOBGROUP_NAME"] = self.job.group_name
        if self.watch_steps and self.preempt_at - self.used_steps:
            env[ENV_PREEMPT_PENDING] = ",".join(map(str, sorted(self.preempt_at - self.used_steps)))
        if info.get("fail_at"):
            env[ENV_FAIL_AT] = str(info["fail_at"])
        if info.get("main_ppo"):
            env[ENV_MAIN_PPO] = str(info["main_ppo"])
        if info.get("driver"):
            env[ENV_DRIVER] = str(info["driver"])
        return env

    def _shims_path(self) -> str:
        """The shims on a node's PATH: `nvidia-smi`'s stand-in only where the task asks for accelerators (a CPU node
        has no nvidia-smi: `command not found`)."""
        shims = self.job.path / "shims"
        return f"{shims}:{shims / GPU_SHIMS}" if _gpus_per_node(self.task) else str(shims)

    def poll(self, now: float) -> None:
        if self.terminal:
            return
        if self.terminate_at is not None and now >= self.terminate_at:
            self.kill_nodes()
            self._end("CANCELLED", None)
            self.job.event("auxiliary_terminated", task=self.name)
            self.log.say(f"task {self.name}: auxiliary terminated (all primary tasks ended)")
            return
        if self.relaunch_at is not None:
            if now >= self.relaunch_at:
                self.relaunch_at = None
                self.launch()
            return
        if self.armed is not None and time.monotonic() >= self.armed[1]:
            self._fire()
        if self.preempt_step is not None:
            self._preempt(now)
            return
        for node in self.nodes:
            new_setup, new_run = node.poll_codes()
            if new_setup and not self.exec_mode:
                self.job.event("node_setup_exited", task=self.name, attempt=self.attempt, rank=node.rank,
                               exit_code=node.setup_rc)
            if new_run:
                node.flush_mounts()
                self.job.event("node_run_exited", task=self.name, attempt=self.attempt, rank=node.rank,
                               exit_code=node.run_rc)
        failed_setup = [n for n in self.nodes if n.setup_rc not in (None, 0)]
        if failed_setup:
            first = failed_setup[0]
            desc = f"Setup failed with exit code {first.setup_rc} on node rank {first.rank}"
            self._user_failure("FAILED_SETUP", [n.setup_rc for n in failed_setup],  # type: ignore[misc]
                               desc, f"{desc} of task {self.name}")
            return
        if not self.running and all(n.setup_rc == 0 for n in self.nodes):
            for node in self.nodes:
                node.go()
            self.running = True
            self.status = "RUNNING"
            self.job.event("run_started", task=self.name, attempt=self.attempt)
            return
        failed_run = [n for n in self.nodes if n.run_rc not in (None, 0)]
        if failed_run:
            codes: list[int] = [n.run_rc for n in failed_run]  # type: ignore[misc]
            desc = f"Job exited with exit code {codes[0]}" if len(codes) == 1 else f"Job exited with exit codes {codes}"
            self._user_failure("FAILED", codes, desc, f"{desc} (task {self.name}, attempt {self.attempt})")
            return
        if self.running and all(n.run_rc == 0 for n in self.nodes):
            self._end("SUCCEEDED", None)
            return
        dead = next((n for n in self.nodes if not n.alive()), None)
        if dead is not None:  # the agent itself died (not a run exit): treat like a lost node
            time.sleep(0.2)
            dead.poll_codes()
            if dead.setup_rc is None or (self.running and dead.run_rc is None):
                self.kill_nodes()
                self._end("FAILED", f"node rank {dead.rank} of task {self.name} died unexpectedly. "
                                    f"Log tail:\n{self._tail()}")

    def _preempt(self, now: float) -> None:
        step = self.preempt_step
        self.preempt_step = None
        self.kill_nodes()
        self.log.say(f"task {self.name}: preempted at step {step} (every node killed); recovering")
        self.job.event("preempted", task=self.name, attempt=self.attempt, step=step)
        self._recover("preempted", now + RECOVERY_WAIT_S)

    def _user_failure(self, status: str, codes: list[int], desc: str, reason: str) -> None:
        """A failed setup (FAILED_SETUP) or run (FAILED) with these exit codes: restarted when SkyPilot's executor
        says so (sky/jobs/controller.py does this for every status in JobStatus.user_code_failure_states(): an exit
        code in recover_on_exit_codes restarts without counting, any other counts against max_restarts_on_errors),
        else the task ends with that status and `reason` (with the log's tail)."""
        from sky.skylet import job_lib

        self.kill_nodes()
        executor = self.executor
        if executor is None or job_lib.JobStatus(status) not in job_lib.JobStatus.user_code_failure_states() \
                or not executor.should_restart_on_failure(exit_codes=codes):
            self._end(status, f"{reason}. Log tail:\n{self._tail()}")
            return
        matched = [c for c in codes if c in executor.recover_on_exit_codes]
        if matched:
            detail = f"exit code(s) {matched} matched recover_on_exit_codes {executor.recover_on_exit_codes}"
            self.job.event("recovered_on_exit_code", task=self.name, attempt=self.attempt, status=status,
                           exit_codes=codes, recover_on_exit_codes=executor.recover_on_exit_codes)
        else:
            detail = f"restart {executor.restart_cnt_on_failure} of {executor.max_restarts_on_errors} on errors"
            self.job.event("restarted_after_error", task=self.name, attempt=self.attempt, status=status,
                           exit_codes=codes, restart=executor.restart_cnt_on_failure,
                           max_restarts_on_errors=executor.max_restarts_on_errors)
        self.log.say(f"task {self.name}: {desc}; {detail}")
        self._recover(f"user code failed ({desc}; {detail})", time.time())

    def _recover(self, reason: str, relaunch_at: float) -> None:
        self.status = "RECOVERING"
        self.recovery_count += 1  # SkyPilot counts failure-driven recoveries: preemptions and restarts on errors
        self.job.event("recovering", task=self.name, reason=reason, recovery_count=self.recovery_count)
        self.relaunch_at = relaunch_at

    def _end(self, status: str, reason: str | None) -> None:
        self.status, self.failure_reason = status, reason
        self.job.event("task_ended", task=self.name, status=status, failure_reason=reason)
        self.log.say(f"task {self.name}: {status}" + (f": {reason.splitlines()[0]}" if reason else ""))

    def cancel(self) -> None:
        self.kill_nodes()
        if not self.terminal:
            self._end("CANCELLED", None)

    def kill_nodes(self) -> None:
        for node in self.nodes:
            node.kill()

    def _tail(self) -> str:
        return "\n".join(self.tail)


class JobController:
    """Owns one job dir: parses the YAML, runs its tasks' nodes, writes state.json and events.jsonl."""

    def __init__(self, path: Path):
        self.path = path
        self.info = read_json(path / "job.json")
        self.exec_mode = self.info.get("kind") == "cluster"
        self.cluster_path = Path(self.info["state_dir"]) / "clusters" / str(self.info.get("cluster"))
        self.log = JobLog(path / "run.log")
        self._live_status = "RUNNING"
        self.cancel_requested = False
        self.secrets: dict[str, str] = {}
        self.tasks: list[TaskRun] = []
        self.group_name: str | None = None
        self.group_hostnames = False
        """Whether the group's tasks resolve `<task>-<rank>.<group>`: only where SkyPilot gives job-group hostnames."""
        self.primaries_done = False
        self._published: tuple[Any, ...] | None = None
        self.termination_delay: dict[str, int] = {}
        self.host_view = HostView([Path(self.info["state_dir"]), PACKAGE_ROOT / "verl_grpo",
                                   PACKAGE_ROOT / "verl_grpo_rehearsal", Path(sys.prefix),
                                   Path(sys.base_prefix)])
        self.network: JobNetwork | None = None
        """The job's own network namespace, which every node of every task joins (`network`)."""

    def event(self, name: str, **fields: Any) -> None:
        append_event(self.path, name, **fields)

    def run(self) -> None:
        self._set_state(controller_pid=os.getpid())
        self.event("controller_started", pid=os.getpid())
        if (self.path / "cancel_requested").exists():
            return self._finish("CANCELLED", None)
        secrets_file = self.path / "secrets.json"
        try:
            self.secrets = json.loads(secrets_file.read_text())
            try:
                self._load()
            except Exception as e:  # SkyPilot's loaders reject the YAML: what `sky jobs launch` would refuse
                self.event("prechecks_failed", error=f"{type(e).__name__}: {e}")
                return self._finish("FAILED_PRECHECKS", f"{type(e).__name__}: {e}")
            refusals = [] if self.exec_mode else [r for t in self.tasks if (r := no_launchable_spot(t.task, t.name))]
            if refusals:  # SkyPilot's optimizer finds no feasible resources: ProvisionPrechecksError, no node started
                reason = "; ".join(refusals)
                self.event("no_launchable_resource", error=reason)
                self.log.say(reason)
                return self._finish("FAILED_PRECHECKS", reason)
            if not _namespaces_work():
                self.log.say(NEEDS_NAMESPACES)
                return self._finish("FAILED_PRECHECKS", NEEDS_NAMESPACES)
            write_shims(self.path / "shims", sys.executable, PACKAGE_ROOT)
            self._start_network()
            self._supervise()
        except Exception as e:
            self.log.say(f"controller error: {type(e).__name__}: {e}")
            traceback.print_exc()
            for task in self.tasks:
                task.kill_nodes()
            self._finish("FAILED_DRIVER" if self.exec_mode else "FAILED_CONTROLLER", f"{type(e).__name__}: {e}")
        finally:
            secrets_file.unlink(missing_ok=True)
            if self.network is not None:
                self.network.stop()
                shutil.rmtree(self.network.sock_dir, ignore_errors=True)

    def _start_network(self) -> None:
        """The job's network namespace, with the endpoints on this machine that its tasks name by URL relayed in."""
        values = [*self.secrets.values()]
        for task in self.tasks:
            values += [str(v) for v in (task.task.envs or {}).values()] + list(_secret_values(task.task).values())
        ports = [port for port in loopback_ports(values) if listening_on_host(port)]
        # A short path: Unix socket paths are limited to 107 bytes; the controller and the relay see the host's /tmp.
        self.network = JobNetwork(Path(tempfile.mkdtemp(prefix="verl-grpo-net-")), ports)
        self.network.start(preexec_fn=_die_with_parent)
        if ports:
            self.log.say(f"job network: its own namespace; relayed from this machine: "
                         f"{', '.join(f'127.0.0.1:{p}' for p in ports)}")

    def _load(self) -> None:
        from verl_grpo.providers.skypilot import boundary

        yaml_str = (self.path / "task.yaml").read_text()
        if self.info.get("job_group"):
            dag = boundary.load_job_group(yaml_str, self.secrets)
            self.group_name = str(dag.name)
            self.group_hostnames = dag.inter_connection is True or all(_on_kubernetes(t) for t in dag.tasks)
            if not self.group_hostnames:
                self.log.say("rehearsal: this job group neither sets `inter_connection: true` nor pins every task to "
                             "Kubernetes: SkyPilot 0.14.1 gives job-group hostnames only on Kubernetes "
                             "(sky/optimizer.py), so its tasks resolve none of `<task>-<rank>.<group>` here either")
            primaries = list(dag.primary_tasks or []) or [t.name for t in dag.tasks]
            first_primary = next(t.name for t in dag.tasks if t.name in primaries)
            self.tasks = [TaskRun(self, i, t, t.name in primaries, watch_steps=t.name == first_primary)
                          for i, t in enumerate(dag.tasks)]
            self.termination_delay = {t.name: dag.get_termination_delay_secs(t.name) for t in dag.tasks}
        else:
            task = boundary.load_task(yaml_str, self.secrets)
            self.tasks = [TaskRun(self, 0, task, True, watch_steps=True)]
            self.termination_delay = {}
            if self.exec_mode:
                cluster = read_json(self.cluster_path / "cluster.json")
                if int(task.num_nodes or 1) > int(cluster["num_nodes"]):
                    raise ValueError(f"task needs {task.num_nodes} nodes, cluster {cluster['name']} has "
                                     f"{cluster['num_nodes']}")

    def _supervise(self) -> None:
        for task in self.tasks:
            task.launch()
        self._publish()
        while True:
            if self.cancel_requested or (self.path / "cancel_requested").exists():
                self.event("cancel_requested")
                self.log.say("cancel requested: killing every node")
                for task in self.tasks:
                    task.cancel()
                return self._finish("CANCELLED", None)
            now = time.time()
            for task in self.tasks:
                was_terminal = task.terminal
                task.poll(now)
                if task.terminal and not was_terminal and not task.primary and not self.primaries_done \
                        and task.status != "SUCCEEDED":
                    self.event("auxiliary_failed", task=task.name, status=task.status)
                    self.log.say(f"auxiliary task {task.name} ended {task.status} before the primary tasks")
            self._after_primaries(now)
            self._publish()
            if all(task.terminal for task in self.tasks):
                break
            time.sleep(POLL_S)
        for task in self.tasks:
            task.kill_nodes()  # a job group keeps every cluster until the job ends, as SkyPilot
        status, reason = self._final()
        self._finish(status, reason)

    def _after_primaries(self, now: float) -> None:
        """Once every primary task has ended, auxiliaries go after their termination_delay (at once when a
        primary did not succeed), as sky/jobs/controller.py does."""
        primaries = [t for t in self.tasks if t.primary]
        if self.primaries_done or not all(t.terminal for t in primaries):
            return
        self.primaries_done = True
        all_ok = all(t.status == "SUCCEEDED" for t in primaries)
        for task in self.tasks:
            if not task.primary and not task.terminal:
                delay = self.termination_delay.get(task.name, 0) if all_ok else 0
                task.terminate_at = now + delay
                self.event("auxiliary_terminating", task=task.name, delay_s=delay)

    def _final(self) -> tuple[str, str | None]:
        """The first primary not succeeded decides; else a failed auxiliary fails the group (SkyPilot's job
        group reports success only when every task succeeded; terminated auxiliaries do not count)."""
        for task in self.tasks:
            if task.primary and task.status != "SUCCEEDED":
                return task.status, task.failure_reason
        for task in self.tasks:
            if not task.primary and task.status not in ("SUCCEEDED", "CANCELLED"):
                return "FAILED", f"auxiliary task {task.name} ended {task.status}: {task.failure_reason}"
        return "SUCCEEDED", None

    def _status(self) -> str:
        """The live job's status is its (first) primary's; once the primary has ended the job keeps the last status
        it showed (RUNNING while auxiliaries drain; a job whose setup failed never showed RUNNING), so a final
        status is only ever reported once the job has really ended."""
        primary = next(t for t in self.tasks if t.watch_steps)
        if not primary.terminal:
            self._live_status = primary.status
        return self._live_status

    def _publish(self) -> None:
        """The job's status, recovery count and task statuses into its state file, when one of them changed (this
        runs every poll)."""
        published = (self._status(), sum(t.recovery_count for t in self.tasks), {t.name: t.status for t in self.tasks})
        if published != self._published:
            self._published = published
            self._set_state(status=published[0], recovery_count=published[1], tasks=published[2])

    def _finish(self, status: str, reason: str | None) -> None:
        recovery_count = sum(t.recovery_count for t in self.tasks)
        # The event first: whoever sees the ended state (a log tail that stops on it) finds the event too.
        self.event("job_ended", status=status, failure_reason=reason, recovery_count=recovery_count)
        self._set_state(status=status, failure_reason=reason, recovery_count=recovery_count,
                        tasks={t.name: t.status for t in self.tasks}, ended_at=time.time())
        self.log.say(f"job {self.info['job_id']} {status}" + (f": {reason.splitlines()[0]}" if reason else ""))

    def _set_state(self, **changes: Any) -> None:
        update_state(self.path, **changes)


# --- node preparation ---------------------------------------------------------------------------------------


def sync_workdir(src: Path, dst: Path) -> None:
    """Copy `src` as SkyPilot syncs a workdir: git-tracked and untracked-not-ignored files only (all files when
    `src` is not a git checkout)."""
    listed = subprocess.run(["git", "-C", str(src), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True)
    if listed.returncode != 0:
        shutil.copytree(src, dst, dirs_exist_ok=True, symlinks=True)
        return
    for rel in filter(None, listed.stdout.decode().split("\0")):
        source = src / rel
        if not source.exists() and not source.is_symlink():
            continue  # tracked but deleted in the working tree
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)


def node_path(root: Path, dst: str) -> Path:
    """Where a path the node sees lies on this machine: /tmp is the node's tmp/, ~ (and relative) its home/."""
    if dst.startswith("~"):
        dst = dst[1:].lstrip("/")
    if dst == "/tmp" or dst.startswith("/tmp/"):
        return root / "tmp" / dst[len("/tmp"):].lstrip("/")
    if dst.startswith("/"):
        raise ValueError(f"file_mounts destination {dst}: the rehearsal maps only /tmp/... and ~/... into a node")
    return root / "home" / dst


def materialize_mount(src: str, dst: Path, env_value: Any) -> None:
    """Copy one file_mounts source (s3:// object or prefix, or a local path) to `dst`."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.startswith("s3://"):
        import fsspec

        fs = fsspec.filesystem(
            "s3", key=env_value("AWS_ACCESS_KEY_ID"), secret=env_value("AWS_SECRET_ACCESS_KEY"),
            token=env_value("AWS_SESSION_TOKEN"), client_kwargs={"endpoint_url": env_value("AWS_ENDPOINT_URL")})
        if fs.isdir(src):
            fs.get(src.rstrip("/") + "/", str(dst), recursive=True)
        else:
            fs.get_file(src, str(dst))
        return
    source = Path(src).expanduser()
    if source.is_dir():
        shutil.copytree(source, dst, dirs_exist_ok=True)
    else:
        shutil.copy2(source, dst)


def _agent_script(state: Path, node_tmp: Path, cwd: Path, run_setup: bool, view: HostView) -> str:
    """The node's init (PID 1 of its namespaces): mounts, setup, wait for go, run, then stay up."""
    q = shlex.quote
    mounts = []
    for path in view.keep_under_tmp:  # paths under the host's /tmp the node still needs stay visible
        inside = node_tmp / path.relative_to("/tmp")
        inside.mkdir(parents=True, exist_ok=True)
        mounts.append(f"mount --bind {q(str(path))} {q(str(inside))}")
    mounts += [f"mount --rbind {q(str(node_tmp))} /tmp", f"mount --bind {q(str(state / 'hosts'))} /etc/hosts"]
    mounts += view.hide_commands(Path("/tmp") / ".rehearsal-keep")
    s = q(str(state))
    setup = f"bash {s}/setup.sh; rc=$?" if run_setup else "rc=0"
    return f"""#!/bin/bash
# rehearsal node agent: PID 1 of this node's namespaces
{' && '.join(mounts)} || {{ echo "rehearsal: could not set up the node's mounts"; echo 97 > {s}/setup.rc; \
exec sleep infinity; }}
cd {q(str(cwd))}
{setup}
echo $rc > {s}/setup.rc.tmp && mv {s}/setup.rc.tmp {s}/setup.rc
[ "$rc" = 0 ] || exec sleep infinity
while [ ! -e {s}/go ]; do sleep 0.05; done
bash {s}/run.sh; rc=$?
echo $rc > {s}/run.rc.tmp && mv {s}/run.rc.tmp {s}/run.rc
exec sleep infinity
"""


SYSTEM_DIRS = frozenset(("bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "run", "sbin", "sys",
                         "tmp", "usr", "var"))
"""Top-level directories a real node has too (its OS); every other top-level directory of this machine (the checkout,
shared data, home directories with their ~/.aws and ~/.sky, /opt, /work, ...) is hidden from a node."""


def _outermost(paths: list[Path]) -> list[Path]:
    unique = sorted(set(paths))
    return [p for p in unique if not any(p != q and p.is_relative_to(q) for q in unique)]


class HostView:
    """What of this machine's files a node sees: the OS directories, its own /tmp and home, and only the paths the
    rehearsal itself needs (its state dir with the nodes' roots, the interpreter its venvs are made from, and the
    shims' code and packages, which the node's venv links to). Everything else is covered by an empty tmpfs, as a
    fresh VM has none of this machine's files: a task that reads the checkout, shared data or ~/.aws fails here
    as it would on the cloud."""

    def __init__(self, keep: list[Path], root: Path = Path("/")):
        tmp = root / "tmp"
        resolved = _outermost([p.resolve() for p in keep if p.resolve() != tmp])
        self.keep_under_tmp = [p for p in resolved if p.is_relative_to(tmp)]
        self.hidden = sorted(entry for entry in root.iterdir() if entry.name not in SYSTEM_DIRS
                             and entry.is_dir() and not entry.is_symlink())
        self.keep_hidden = [p for p in resolved if any(p.is_relative_to(h) for h in self.hidden)]

    def hide_commands(self, stage: Path) -> list[str]:
        """Mount commands (after /tmp is the node's): park each kept path, cover the hidden directories, then put the
        kept paths back where they were and drop the parking places."""
        q = shlex.quote
        parked = [stage / str(i) for i in range(len(self.keep_hidden))]
        out = [f"mkdir -p {q(str(spot))} && mount --rbind {q(str(path))} {q(str(spot))}"
               for path, spot in zip(self.keep_hidden, parked)]
        out += [f"mount -t tmpfs -o mode=755 rehearsal-hidden {q(str(path))}" for path in self.hidden]
        for path, spot in zip(self.keep_hidden, parked):
            out.append(f"mkdir -p {q(str(path))} && mount --rbind {q(str(spot))} {q(str(path))} "
                       f"&& umount -l {q(str(spot))}")
        if parked:
            out.append(f"rm -rf {q(str(stage))}")
        return out


class MountWithoutCredentials(RuntimeError):
    """A bucket mount SkyPilot would have no credentials for on the task's cloud."""


def _install_sky_uv(home: Path, shims: Path) -> None:
    """What SkyPilot's runtime setup leaves on every node it provisions: its own uv under ~/.local/bin
    (sky/skylet/constants.py SKY_UV_INSTALL_DIR), here the uv shim."""
    uv = home / ".local" / "bin" / "uv"
    if not uv.exists():
        uv.parent.mkdir(parents=True, exist_ok=True)
        uv.symlink_to(shims / "uv")


def _pinned_cloud(task: Any) -> str | None:
    """The one cloud every resource of the task names (lower case), else None."""
    clouds = {str(r.cloud).lower() for r in (task.resources or ()) if r.cloud is not None}
    return clouds.pop() if len(clouds) == 1 and all(r.cloud is not None for r in task.resources) else None


def _on_kubernetes(task: Any) -> bool:
    return any(str(r.cloud).lower() == "kubernetes" for r in (task.resources or ()) if r.cloud is not None)


def recovery_executor(task: Any, info: dict[str, Any], index: int) -> Any:
    """SkyPilot's jobs recovery strategy executor for `task`, made as its jobs controller makes it: the task's
    `job_recovery` with the launch defaults filled in (sky/utils/dag_utils.py, as `sky jobs launch` does), then
    `StrategyExecutor.make` (sky/jobs/recovery_strategy.py). Made on a copy holding only the task's resources:
    make() drops job_recovery from the task it is given, the rehearsal's task keeps its own."""
    from sky import backends, dag as dag_lib, task as task_lib
    from sky.jobs import recovery_strategy
    from sky.utils import dag_utils

    stand_in = task_lib.Task(name=task.name)
    stand_in.set_resources(type(task.resources)(task.resources))
    dag = dag_lib.Dag()
    dag.add(stand_in)
    dag_utils.fill_default_config_in_dag_for_job_launch(dag)
    cluster_name = info.get("cluster") or f"{_safe(str(task.name or info['name']))}-{info['job_id']}"
    return recovery_strategy.StrategyExecutor.make(
        cluster_name, backends.CloudVmRayBackend(), stand_in, int(info["job_id"]), index, pool=None, starting=set(),
        starting_lock=asyncio.Lock(), starting_signal=asyncio.Condition())


def no_launchable_spot(task: Any, name: str) -> str | None:
    """Why SkyPilot finds no launchable resource for a task that asks use_spot, or None: every one of its resources
    asks spot on a cloud whose own feature check (sky/clouds/cloud.py check_features_are_supported, which SkyPilot's
    optimizer runs on each candidate) refuses SPOT_INSTANCE. A resource that names no cloud, or does not ask spot,
    is launchable as far as the rehearsal can tell."""
    refused = []
    for resources in task.resources or []:
        if not resources.use_spot or resources.cloud is None:
            return None
        why = _spot_refused(resources)
        if why is None:
            return None
        refused.append(f"asks use_spot on {resources.cloud}: {why}")
    return f"No launchable resource: task {name} {'; '.join(refused)}" if refused else None


def _spot_refused(resources: Any) -> str | None:
    """SkyPilot's reason the resources' cloud does not offer spot, or None. Offline: on Kubernetes SkyPilot looks for
    a spot label on the nodes of each kubeconfig context, then for a spot-capable `kubernetes.autoscaler` in its
    config; the rehearsal sees no cluster, so SkyPilot's check runs with one context whose nodes it cannot list (no
    spot label) and the config as it is, never touching a cluster or needing the Kubernetes client."""
    from unittest import mock

    from sky import clouds, exceptions
    from sky.provision.kubernetes import utils as kubernetes_utils

    feature = clouds.CloudImplementationFeatures.SPOT_INSTANCE
    try:
        with mock.patch.object(clouds.Kubernetes, "existing_allowed_contexts",
                               classmethod(lambda cls, silent=False: [None])), \
                mock.patch.object(kubernetes_utils, "get_kubernetes_nodes", lambda *args, **kwargs: []):
            resources.cloud.check_features_are_supported(resources, {feature})
    except exceptions.NotSupportedError as e:
        rows = [line.strip() for line in str(e).splitlines()]
        why = next((row[len(feature.value):].strip() for row in rows if row.startswith(feature.value + " ")), None)
        why = why or " ".join(" ".join(rows).split())
        if isinstance(resources.cloud, clouds.Kubernetes):
            why += (" (rehearsal: no cluster's nodes seen; SkyPilot allows spot on Kubernetes only on nodes with a "
                    "spot label or with a spot-capable kubernetes.autoscaler in its config)")
        return why
    return None


def _gpus_per_node(task: Any) -> int:
    for resources in task.resources or []:
        if resources.accelerators:
            return int(sum(resources.accelerators.values()))
    return 0


def _secret_values(task: Any) -> dict[str, str]:
    out = {}
    for key, value in (getattr(task, "secrets", None) or {}).items():
        if value is not None:
            out[key] = value.get_secret_value() if hasattr(value, "get_secret_value") else str(value)
    return out


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", *NAMESPACE_FLAGS, "true"], capture_output=True)
    return probe.returncode == 0


def _die_with_parent() -> None:
    """In the node's unshare (before exec): SIGKILL it when the controller dies, so no node outlives it."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m verl_grpo_rehearsal.controller JOB_DIR", file=sys.stderr)
        return 2
    controller = JobController(Path(argv[0]).absolute())
    signal.signal(signal.SIGTERM, lambda *_: setattr(controller, "cancel_requested", True))
    controller.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
