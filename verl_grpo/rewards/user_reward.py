"""The user's own reward function (`reward.path`, `reward.name`), with verl's signature, guarded.

`compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict` runs in worker processes
(`_user_reward_worker.py`, started on first use and kept), so a call that hangs is stopped at `reward.timeout_s`: its
worker is killed and replaced. Every result is normalised to one dict: `score`, `acc` (the function's own, else the
score), `failed` (0 or 1) and the function's numeric components. A call that raises, times out or returns no finite
number scores 0 with `failed` 1; the first failure of a process is printed with its reason, the rest are counted
(`FailureGuard` stops a run whose function fails on every row of its first step).
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import logging
import math
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_grpo.errors import ConfigError
from verl_grpo.procs import kill_piped_worker

log = logging.getLogger(__name__)

WORKER_SCRIPT = Path(__file__).with_name("_user_reward_worker.py")
LOAD_TIMEOUT_S = 120.0
"""How long the import of the user's file may take (it may import torch or a tokenizer)."""
FAILED = "failed"
"""The key of the normalised result that says the call failed (1.0) or not (0.0)."""
FAILED_METRIC = "reward/failed"
"""A training step's count of rows whose reward call failed (the step line's `failed=`; summed in the summary)."""
RESERVED = frozenset({"score", "acc", FAILED, "pred"})
_HEADER = struct.Struct(">I")


@dataclass(frozen=True)
class UserReward:
    """Where the user's function is, and its per-call time limit: all a process needs to score with it."""

    path: str
    """A `.py` file or an importable module `pkg.module`."""
    name: str = "compute_score"
    timeout_s: float = 10.0
    components: tuple[str, ...] | None = None
    """Fixed component keys of every result (verl needs one key set for all rows): missing ones are 0, others are
    dropped; None keeps whatever numeric fields the function returns."""

    @classmethod
    def of(cls, cfg: Any) -> UserReward | None:
        """The run's user reward (cfg.reward), None when the task's own scorer scores it."""
        reward = cfg.reward
        return cls(reward.path, reward.name, reward.timeout_s) if reward.path else None

    @property
    def label(self) -> str:
        return f"{self.name} in {self.path} (reward.path)"

    def source_file(self) -> Path | None:
        """The file that defines the function: the `.py` path, or the module's file (found without importing it)."""
        if self.path.endswith(".py"):
            return Path(self.path)
        try:
            spec = importlib.util.find_spec(self.path)
        except (ImportError, ValueError):
            return None
        return Path(spec.origin) if spec is not None and spec.origin and spec.has_location else None

    def fingerprint(self) -> str:
        """sha256 of the function's name and its file's bytes: what decides the scores (eval-cache keys)."""
        digest = hashlib.sha256(f"{self.path}\0{self.name}\0".encode())
        source = self.source_file()
        if source is not None and source.is_file():
            digest.update(source.read_bytes())
        return digest.hexdigest()[:16]

    def check(self) -> None:
        """Import the function in a worker now: ConfigError in one line when the file or module, a package it
        imports, or the function is missing."""
        _pool(self).check()

    def __call__(self, data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None,
                 **kwargs: Any) -> dict[str, Any]:
        """verl's scorer signature (extra keyword arguments verl passes are not forwarded)."""
        return self.score(data_source, solution_str, ground_truth, extra_info)

    def score(self, data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, Any]:
        result, error = self.score_or_error(data_source, solution_str, ground_truth, extra_info)
        if error is not None:
            _report_failure(self, error)
        return result

    def score_or_error(self, data_source: Any, solution_str: str, ground_truth: Any,
                       extra_info: Any = None) -> tuple[dict[str, Any], str | None]:
        """The normalised result, and why the call failed (None when it did not)."""
        outcome, value = _pool(self).call((data_source, solution_str, ground_truth, extra_info), self.timeout_s)
        result, error = normalise(value, self.components) if outcome == "ok" else (None, value)
        return (failed_result(self.components), error) if error is not None else (result, None)

    def score_many(self, data_sources: Sequence[Any], texts: Sequence[str], truths: Sequence[Any],
                   extra_infos: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        extra_infos = list(extra_infos) if extra_infos is not None else [None] * len(texts)
        return [self.score(d, t, g, e) for d, t, g, e in zip(data_sources, texts, truths, extra_infos, strict=True)]


def normalise(value: Any, components: Sequence[str] | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """(the result as one dict, None), or (None, why it is no score) for a value that is not a finite number or a
    dict with a finite `score`."""
    if isinstance(value, Mapping):
        if "score" not in value:
            return None, f"returned a dict without 'score' (keys: {', '.join(map(str, list(value)[:8]))})"
        score, why = _finite(value["score"], "its 'score'")
        if why:
            return None, why
        acc, _ = _finite(value.get("acc", score), "acc")
        out: dict[str, Any] = {"score": score, "acc": score if acc is None else acc, FAILED: 0.0}
        for key, item in value.items():
            if key not in RESERVED and (components is None or key in components):
                number, bad = _finite(item, key)
                if bad is None:
                    out[str(key)] = number
        if value.get("pred") is not None:
            out["pred"] = str(value["pred"])
    else:
        score, why = _finite(value, "it")
        if why:
            return None, why
        out = {"score": score, "acc": score, FAILED: 0.0}
    for key in components or ():
        out.setdefault(key, 0.0)
    return out, None


def failed_result(components: Sequence[str] | None = None) -> dict[str, Any]:
    return {"score": 0.0, "acc": 0.0, FAILED: 1.0, **{key: 0.0 for key in components or ()}}


def _finite(value: Any, what: str) -> tuple[float | None, str | None]:
    if isinstance(value, bool):
        return float(value), None
    if isinstance(value, (str, bytes)):  # "1" is text the function returned, not a score
        return None, f"{what} is a {type(value).__name__} ({str(value)[:20]!r}), not a number"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None, f"{what} is a {type(value).__name__}, not a number"
    if not math.isfinite(number):
        return None, f"{what} is {number}, not a finite number"
    return number, None


def step_metrics(results: Sequence[Mapping[str, Any]], count_failures: bool = True) -> dict[str, float]:
    """A step's metrics of its scored rows: each numeric component's mean (`rewards/<key>/mean`, TRL's naming) and,
    with `count_failures` (a run scored by the user's function), the count of failed calls (FAILED_METRIC)."""
    keys = dict.fromkeys(k for r in results for k, v in r.items()
                         if k not in RESERVED and isinstance(v, (int, float)) and not isinstance(v, bool))
    out = {f"rewards/{key}/mean": sum(float(r.get(key, 0.0)) for r in results) / max(len(results), 1) for key in keys}
    if count_failures:
        out[FAILED_METRIC] = float(sum(float(r.get(FAILED, 0.0)) >= 1.0 for r in results))
    return out


class FailureGuard:
    """Stops a run whose reward function failed on every row of its first step: after `first_rows` scored rows
    with no success since this process started, `check` raises one ConfigError naming the function."""

    def __init__(self, reward: UserReward, first_rows: int):
        self.reward = reward
        self.first_rows = max(1, first_rows)
        self.rows = 0
        self.succeeded = False
        self.first_error: str | None = None

    def check(self, results: Sequence[Mapping[str, Any]]) -> None:
        if self.succeeded or self.rows >= self.first_rows:
            return
        self.rows += len(results)
        self.succeeded = any(float(r.get(FAILED, 0.0)) < 1.0 for r in results)
        if not self.succeeded and self.rows >= self.first_rows:
            first = _first_errors.get(self.reward, "see the log above")
            raise ConfigError(f"reward function {self.reward.label} failed on every row of the first step "
                              f"({self.rows} rows; first: {first}); fix it, then check it on a few responses with "
                              "`verl-grpo score -c <your config> FILE.jsonl`")


_first_errors: dict[UserReward, str] = {}
_failure_counts: dict[UserReward, int] = {}
_report_lock = threading.Lock()


def _report_failure(reward: UserReward, error: str) -> None:
    """Print the first failure of this process in full, then every 100th as a count."""
    with _report_lock:
        count = _failure_counts[reward] = _failure_counts.get(reward, 0) + 1
        _first_errors.setdefault(reward, error)
    if count == 1:
        print(f"reward: {reward.label} failed on a row, which scores 0: {error} (further failures are counted: "
              "`failed` in the step lines and the eval)", file=sys.stderr, flush=True)
    elif count % 100 == 0:
        print(f"reward: {reward.label} has failed on {count} rows in this process", file=sys.stderr, flush=True)


class _Worker:
    """One worker process running the user's function; frames are pickles with a 4-byte length."""

    def __init__(self, reward: UserReward):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))}
        self.proc = subprocess.Popen([sys.executable, str(WORKER_SCRIPT), reward.path, reward.name],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     start_new_session=True)
        self._buf = b""
        hello = self.read(time.monotonic() + LOAD_TIMEOUT_S)
        if hello is None or hello[0] != "ok":
            why = hello[1] if hello else f"it did not load within {LOAD_TIMEOUT_S:.0f}s"
            self.kill()
            raise ConfigError(f"reward function {reward.label} cannot be used: {why}; fix reward.path / reward.name "
                              "or install what it imports")

    def call(self, request: tuple, deadline: float) -> tuple[str, Any] | None:
        try:
            blob = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
            self.proc.stdin.write(_HEADER.pack(len(blob)) + blob)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        return self.read(deadline)

    def read(self, deadline: float) -> tuple[str, Any] | None:
        """The next frame, or None when the worker died or the deadline passed."""
        fd = self.proc.stdout.fileno()
        while True:
            if len(self._buf) >= _HEADER.size:
                (size,) = _HEADER.unpack(self._buf[:_HEADER.size])
                if len(self._buf) >= _HEADER.size + size:
                    frame = self._buf[_HEADER.size:_HEADER.size + size]
                    self._buf = self._buf[_HEADER.size + size:]
                    return pickle.loads(frame)
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None
            self._buf += chunk

    def kill(self) -> None:
        kill_piped_worker(self.proc)


class _Pool:
    """Worker processes of one function, shared by the threads of this process; one call per worker at a time."""

    def __init__(self, reward: UserReward, max_workers: int):
        self.reward = reward
        self.max_workers = max_workers
        self.idle: list[_Worker] = []
        self.started = 0
        self.available = threading.Condition()

    def check(self) -> None:
        self._release(self._take())

    def call(self, request: tuple, timeout_s: float) -> tuple[str, Any]:
        worker = self._take()
        answer = worker.call(request, time.monotonic() + timeout_s)
        if answer is None:
            code = worker.proc.poll()
            worker.kill()
            self._drop()
            why = f"timed out after {timeout_s:g}s (reward.timeout_s)" if code is None else \
                f"its worker process died (exit code {code})"
            return "error", why
        self._release(worker)
        return answer

    def _take(self) -> _Worker:
        with self.available:
            while not self.idle and self.started >= self.max_workers:
                self.available.wait()
            if self.idle:
                return self.idle.pop()
            self.started += 1
        try:
            return _Worker(self.reward)
        except BaseException:
            self._drop()
            raise

    def _release(self, worker: _Worker) -> None:
        with self.available:
            self.idle.append(worker)
            self.available.notify()

    def _drop(self) -> None:
        with self.available:
            self.started -= 1
            self.available.notify()

    def close(self) -> None:
        with self.available:
            workers, self.idle = self.idle, []
        for worker in workers:
            worker.kill()


_pools: dict[tuple[str, str], _Pool] = {}
_pools_lock = threading.Lock()


def _pool(reward: UserReward) -> _Pool:
    key = (reward.path, reward.name)
    with _pools_lock:
        if key not in _pools:
            _pools[key] = _Pool(reward, max_workers=min(8, os.cpu_count() or 1))
        return _pools[key]


def close_pools() -> None:
    """Stop every worker process (at exit; a worker also ends when this process's pipe to it closes)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()


atexit.register(close_pools)
