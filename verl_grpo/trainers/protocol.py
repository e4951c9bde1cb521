"""The contract both training backends keep with the pipeline, the providers and each other.

A backend is a `Trainer` (plan the training command of a run; read its own log lines back as `TrainProgress`)
plus the processes that command starts. Those processes share one worker protocol:

- exit codes: 0 done, 2 the user must fix something, 75 a retry resumes from the last checkpoint, 1 any other
  failure (`exit_code`); a provider turns them back into error types without reading messages;
- files: `metrics.jsonl` (one JSON object per step, beside the run and inside every checkpoint), the run's
  `train_result.json` in the store (names and store paths from `verl_grpo.layout`), and a local worker's
  `result.json` / `error.json` in its work dir;
- local files are replaced atomically (`write_text_atomic`): a crash leaves the old content or the new one;
- a resume trusts only the store: `restore_latest` leaves exactly its latest complete checkpoint on local disk;
- one `TrainResult.summary` vocabulary (`final_reward`, `final_loss`, `mean_reward`, …) built by `summarize`.

This module is imported by every cluster-side entry, so it imports nothing heavy.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from verl_grpo.errors import ConfigError, DataError, InfraError, VerlGrpoError
from verl_grpo.layout import METRICS_FILE, STEP_PREFIX, TRAIN_RESULT

if TYPE_CHECKING:
    from verl_grpo.checkpoints import CheckpointStore
    from verl_grpo.config import RunConfig
    from verl_grpo.contracts import CheckpointRef, Cluster, DatasetVersion, TrainSpec
    from verl_grpo.store import Store

__all__ = [
    "ERROR_FILE", "EXIT_FAILED", "EXIT_OK", "EXIT_RETRYABLE", "EXIT_USER_ERROR", "METRICS_FILE", "RESULT_FILE",
    "STEP_PREFIX", "TRAIN_RESULT", "LocalCheckpoints", "SummaryNames", "TrainProgress", "Trainer", "exit_code",
    "numbers", "restore_latest", "summarize", "write_json_atomic", "write_jsonl_atomic", "write_text_atomic",
]

EXIT_OK, EXIT_FAILED, EXIT_USER_ERROR, EXIT_RETRYABLE = 0, 1, 2, 75
RESULT_FILE = "result.json"
"""A local worker's TrainResult in its work dir: proof of success when the exit code of a reattached process is lost."""
ERROR_FILE = "error.json"
"""A failed local worker's `{type, message, retryable}` in its work dir."""


def exit_code(exc: BaseException) -> int:
    """The exit code a worker reports an error with: 2 user fix, 75 retryable, 1 failure."""
    if isinstance(exc, (ConfigError, DataError)):
        return EXIT_USER_ERROR
    if isinstance(exc, InfraError):
        return EXIT_RETRYABLE
    return EXIT_FAILED


def run_entry(entry: str, body: Callable[[], None]) -> int:
    """Run a cluster entry point's body; one of our errors ends it with one line on stderr and the exit code that
    says who fixes it (the provider maps the code to a retry or a failure)."""
    try:
        body()
    except VerlGrpoError as e:
        print(f"{entry}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return exit_code(e)
    return 0


# ---- progress --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainProgress:
    """One training step as the trainer's log reports it (for progress bars and reward charts)."""

    step: int
    total_steps: int
    reward: float | None
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def percent(self) -> float:
        return 100.0 * min(self.step, self.total_steps) / max(self.total_steps, 1)


def numbers(pairs: Iterable[Sequence[str]]) -> dict[str, float]:
    """`{key: float(value)}` of the (key, value) pairs of a log line whose value is a number; others are dropped."""
    out = {}
    for key, value in pairs:
        try:
            out[key.strip()] = float(value)
        except ValueError:
            continue
    return out


class Trainer(Protocol):
    """A training backend: how a run config becomes a training command, and how its log reports progress.

    Its step metrics carry the signal vocabulary of `verl_grpo.trainers.signal`, and its processes warn (or stop)
    when the learning signal is gone; a backend whose processes cannot sets `signal_watched_in_log = True`, and
    `pipeline.train` watches its parsed step lines instead.
    """

    name: str

    def check(self, cfg: RunConfig) -> str:
        """Validate the backend mapping of cfg offline (raise ConfigError); return a one-line description."""

    def plan(self, cfg: RunConfig, dataset: DatasetVersion, store: Store, run_id: str, cluster: Cluster) -> TrainSpec:
        """Validate and render the training command offline; no side effects beyond writing the spec file."""

    def parse_progress(self, line: str, total_steps: int) -> TrainProgress | None:
        """The TrainProgress one line of this backend's training log reports, or None for any other line."""


# ---- atomic local files ----------------------------------------------------------------------------------------------

def write_text_atomic(path: Path, text: str) -> Path:
    """Replace `path` with `text` at once (temp file in the same dir, fsync, rename): readers and crashes see the
    old file or the new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: Path, data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=1))


def write_jsonl_atomic(path: Path, records: Iterable[Mapping[str, Any]]) -> Path:
    """One JSON object per line (numpy and torch scalars become floats)."""
    return write_text_atomic(path, "".join(json.dumps(r, default=float) + "\n" for r in records))


# ---- restore ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LocalCheckpoints:
    """A backend's checkpoint directories on local disk: `{root}/{prefix}{step}`."""

    root: Path
    prefix: str

    def step_dir(self, step: int) -> Path:
        return Path(self.root) / f"{self.prefix}{step}"

    def steps(self) -> list[int]:
        out = []
        for p in Path(self.root).glob(f"{self.prefix}*"):
            suffix = p.name[len(self.prefix):]
            if p.is_dir() and suffix.isdigit():
                out.append(int(suffix))
        return sorted(out)


def restore_latest(checkpoints: CheckpointStore, run_id: str, local: LocalCheckpoints,
                   keep_undeletable: bool = False) -> tuple[CheckpointRef, Path] | None:
    """Make `local` hold exactly the store's latest complete checkpoint of the run; its ref and dir, or None.

    Local step dirs other than the restored one are deleted, and files of the restored dir that its manifest does
    not list (an interrupted local save of the same step) are removed, so a resume only ever sees files whose
    sha256 matched the manifest. keep_undeletable: a leftover that cannot be deleted stays (for a backend that
    resumes from the directory it is handed, never from a scan of the root).
    """
    ref = checkpoints.latest_complete(run_id)
    Path(local.root).mkdir(parents=True, exist_ok=True)
    for step in local.steps():
        if ref is None or step != ref.step:
            shutil.rmtree(local.step_dir(step), ignore_errors=keep_undeletable)
    if ref is None:
        return None
    step_dir = local.step_dir(ref.step)
    listed = {entry["path"] for entry in checkpoints.restore(ref, step_dir)["files"]}
    for path in [p for p in step_dir.rglob("*") if p.is_file() and p.relative_to(step_dir).as_posix() not in listed]:
        path.unlink()
    return ref, step_dir


# ---- summary ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SummaryNames:
    """How one backend's metric names become `TrainResult.summary` names."""

    final: Mapping[str, str]
    """Metric of the last training step → its summary name."""
    reward: str
    """The per-step reward; its mean over all training steps is `mean_reward`."""
    final_prefixes: Mapping[str, str] = field(default_factory=dict)
    """Metric-name prefix → the prefix its summary name gets (`rewards/` → `final_rewards/`)."""
    first_step: int = 0
    """Records of earlier steps are not training steps (verl logs its initial validation as step 0)."""
    totals: tuple[str, ...] = ()
    """Run totals the trainer reports at the end, kept under their own names (HF's `train_runtime`, …)."""

    def summary_name(self, key: str) -> str | None:
        if key in self.final:
            return self.final[key]
        for prefix, renamed in self.final_prefixes.items():
            if key.startswith(prefix):
                return renamed + key[len(prefix):]
        return None


def summarize(records: Sequence[Mapping[str, Any]], names: SummaryNames,
              totals: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Last-training-step metrics under their summary names, the mean reward over all steps, and the run totals."""
    out: dict[str, float] = {}
    train = [r for r in records if r["step"] >= names.first_step]
    if train:
        for key, value in train[-1].items():
            name = names.summary_name(key)
            if name is not None and _is_number(value):
                out[name] = float(value)
        rewards = [r[names.reward] for r in train if _is_number(r.get(names.reward))]
        if rewards:
            out["mean_reward"] = sum(rewards) / len(rewards)
    for key in names.totals:
        value = (totals or {}).get(key)
        if _is_number(value):
            out[key] = float(value)
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float))
