"""The Trainer interface: how a run config becomes a training command. A new backend is one new module."""

from __future__ import annotations

from typing import Protocol

from verl_grpo.config import RunConfig
from verl_grpo.contracts import Cluster, DatasetVersion, TrainSpec
from verl_grpo.store import Store


class Trainer(Protocol):
    name: str

    def check(self, cfg: RunConfig) -> str:
        """Validate the backend mapping of cfg offline (raise ConfigError); return a one-line description."""

    def plan(self, cfg: RunConfig, dataset: DatasetVersion, store: Store, run_id: str, cluster: Cluster) -> TrainSpec:
        """Validate and render the training command offline; no side effects beyond writing the spec file."""
