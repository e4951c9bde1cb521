"""The contract every training backend keeps with the pipeline: a `Trainer` plans the training command of a run and
reads its own log lines back as `TrainProgress`.

Its processes keep a worker protocol built from small modules beside this one: exit codes and result files
(`exits`), atomic local files (`atomic_files`), a resume from the store's latest complete checkpoint
(`local_checkpoints`) and one summary vocabulary (`run_summary`); files and store paths are named in
`verl_grpo.store_layout`. This module is imported by every cluster-side entry, so it imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from verl_grpo.config import RunConfig
    from verl_grpo.contracts import Cluster, DatasetVersion, TrainSpec
    from verl_grpo.store import Store

__all__ = ["TrainProgress", "Trainer", "numbers"]


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
    `plain_steps.train` watches its parsed step lines instead.
    """

    name: str

    def check(self, cfg: RunConfig) -> str:
        """Validate the backend mapping of cfg offline (raise ConfigError); return a one-line description."""

    def plan(self, cfg: RunConfig, dataset: DatasetVersion, store: Store, run_id: str, cluster: Cluster) -> TrainSpec:
        """Validate and render the training command offline; no side effects beyond writing the spec file."""

    def parse_progress(self, line: str, total_steps: int) -> TrainProgress | None:
        """The TrainProgress one line of this backend's training log reports, or None for any other line."""
