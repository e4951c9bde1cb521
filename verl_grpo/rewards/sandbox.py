"""Execution pool for untrusted MBPP programs: persistent workers, one jailed process per program.

Each worker is a small stdlib-only process (`_sandbox_worker.py`) started with a scrubbed
environment. It forks a fresh jail per program (own PID + mount namespace, private /tmp, uid
nobody, rlimits, no network; see that module). The pool hands jobs to idle workers from any number
of threads; a worker that hangs or dies is killed and replaced, and its sample scores 0 with a reason.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from verl_grpo.errors import InfraError
from verl_grpo.procs import kill_piped_worker

WORKER_SCRIPT = Path(__file__).with_name("_sandbox_worker.py")
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MEMORY_BYTES = 1 << 30
DEFAULT_FSIZE_BYTES = 1 << 20
DEFAULT_NPROC = 64
# Beyond the program's own timeout: supervisor start-up and reporting, then the pool gives up on the worker.
WORKER_GRACE_S = 5.0
WORKER_START_TIMEOUT_S = 30.0
ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL")


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one program: how many of its tests passed, and why it ended."""

    passed: int
    total: int
    reason: str

    @property
    def pass_rate(self) -> float:
        return self.passed / self.total if self.total else 0.0


Job = tuple[str, Sequence[str], str]
"""(code, tests, setup_code) as given to `ExecutionPool.map`."""


class _Worker:
    """One worker process and its line protocol."""

    def __init__(self, home: Path):
        env = {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ}
        self.proc = subprocess.Popen(
            [sys.executable, "-I", str(WORKER_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=home,
            start_new_session=True,
        )
        self._buf = b""
        hello = self._read_line(time.monotonic() + WORKER_START_TIMEOUT_S)
        if hello is None:
            self.kill()
            raise InfraError(f"sandbox worker {WORKER_SCRIPT} did not start within {WORKER_START_TIMEOUT_S:.0f}s")
        info = json.loads(hello)
        self.isolation: str = info["isolation"]
        self.network: str = info["network"]

    def request(self, job: dict, deadline: float) -> dict | None:
        """Send one job; the parsed answer, or None when the worker died or missed the deadline."""
        try:
            self.proc.stdin.write(json.dumps(job).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        line = self._read_line(deadline)
        return json.loads(line) if line is not None else None

    def _read_line(self, deadline: float) -> bytes | None:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def kill(self) -> None:
        kill_piped_worker(self.proc)


class ExecutionPool:
    """Run `(code, tests, setup_code)` programs in jailed processes; thread-safe.

    workers: parallel programs (default: CPU count). timeout_s: wall-clock limit per program.
    """

    def __init__(
        self,
        workers: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
        fsize_bytes: int = DEFAULT_FSIZE_BYTES,
        nproc: int = DEFAULT_NPROC,
    ):
        self.size = workers or os.cpu_count() or 1
        if self.size < 1 or timeout_s <= 0:
            raise ValueError(f"workers must be >= 1 and timeout_s > 0 (got workers={workers}, timeout_s={timeout_s})")
        self.timeout_s = float(timeout_s)
        self._limits = {"memory_bytes": memory_bytes, "fsize_bytes": fsize_bytes, "nproc": nproc}
        self._home = Path(tempfile.mkdtemp(prefix="verl-grpo-sandbox-"))
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self._owner_pid = os.getpid()
        self._next_id = 0
        self.replaced = 0
        """How many workers were killed and replaced (hung or crashed)."""
        with ThreadPoolExecutor(self.size) as ex:
            started = list(ex.map(lambda _: _Worker(self._home), range(self.size)))
        for w in started:
            self._idle.put(w)
        self._live = len(started)
        self.isolation = started[0].isolation
        """`namespaces` (PID/mount/network namespaces, private /tmp) or `basic` (rlimits, uid, blocked sockets)."""
        self.network = started[0].network

    def run(self, code: str, tests: Sequence[str], setup_code: str = "") -> ExecResult:
        """Run one program and its assert lines; a test passes only when its line ran without raising."""
        self._check_usable()
        tests = [str(t) for t in tests]
        with self._lock:
            self._next_id += 1
            job_id = self._next_id
        job = {
            "id": job_id,
            "code": code,
            "tests": tests,
            "setup_code": setup_code or "",
            "timeout_s": self.timeout_s,
            **self._limits,
        }
        worker = self._acquire()
        try:
            answer = worker.request(job, time.monotonic() + self.timeout_s + WORKER_GRACE_S)
        except BaseException:
            self._replace(worker)
            raise
        if answer is None or answer.get("id") != job_id:
            self._replace(worker)
            return ExecResult(0, len(tests), "sandbox worker hung or crashed; replaced it")
        self._idle.put(worker)
        return ExecResult(int(answer["passed"]), int(answer["total"]), str(answer["reason"]))

    def map(self, jobs: Iterable[Job]) -> list[ExecResult]:
        """Run many programs in parallel (one per worker); results in input order."""
        jobs = list(jobs)
        if not jobs:
            return []
        with ThreadPoolExecutor(min(self.size, len(jobs))) as ex:
            return list(ex.map(lambda j: self.run(j[0], j[1], j[2] if len(j) > 2 else ""), jobs))

    def close(self) -> None:
        """Stop every worker (idempotent)."""
        if self._closed or os.getpid() != self._owner_pid:
            return
        self._closed = True
        while True:
            try:
                self._idle.get_nowait().kill()
            except queue.Empty:
                break
        shutil.rmtree(self._home, ignore_errors=True)

    def __enter__(self) -> "ExecutionPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _acquire(self) -> _Worker:
        """An idle worker; starts one when a replacement failed to start earlier."""
        with self._lock:
            start_new = self._idle.empty() and self._live < self.size
            if start_new:
                self._live += 1
        if not start_new:
            return self._idle.get()
        try:
            return _Worker(self._home)
        except InfraError:
            with self._lock:
                self._live -= 1
            raise

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self.replaced += 1
            self._live -= 1
        if self._closed:
            return
        new = _Worker(self._home)  # InfraError propagates; _acquire retries the start on the next run()
        with self._lock:
            self._live += 1
        self._idle.put(new)

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("ExecutionPool is closed")
        if os.getpid() != self._owner_pid:
            raise RuntimeError("ExecutionPool was created in another process; use get_pool() in this one")


_pool: ExecutionPool | None = None
_pool_lock = threading.Lock()


def get_pool() -> ExecutionPool:
    """The process-wide pool (created on first use, one worker per core, closed at exit)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool._owner_pid != os.getpid() or _pool._closed:
            _pool = ExecutionPool()
            atexit.register(_pool.close)
        return _pool
