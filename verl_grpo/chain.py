"""The pipeline's one chain: prepare → provision → train → evaluate (base, warm start, trained) → register, with
teardown always and the run marked failed on any error.

The Prefect flow (flows/verl_grpo.py), `plain_steps.run_pipeline` and the CLI's partial commands all run `run_chain`;
they differ only in the `Steps` that carry out each step: Prefect tasks (retries, logs, artifacts per step) or the
plain functions of plain_steps.py. Every step gets the run as resolved once (`ResolvedRun`), never the config strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from verl_grpo import runs
from verl_grpo.config import RunConfig
from verl_grpo.contracts import Cluster, DatasetVersion, EvalReport, ModelVersion, TrainResult
from verl_grpo.store import Store


@dataclass(frozen=True)
class ResolvedRun:
    """A run as resolved once at its start: the validated config, stored as `runs/{run_id}/config.yaml`."""

    cfg: RunConfig
    run_id: str
    resumed: bool
    """True when run_id names a run begun earlier (it continues from its last committed checkpoint)."""

    @property
    def store(self) -> Store:
        """The run's store (storage.*), opened anew each time: a run crosses processes, its store's client does not."""
        return Store.from_config(self.cfg.storage)


@dataclass(frozen=True)
class Evals:
    """A run's held-out reports, all on the same problems and settings."""

    base: EvalReport
    """The base model (model.name), cached across runs."""
    trained: EvalReport
    warm_start: EvalReport | None = None
    """The run's warm-start (SFT) model, cached by its files; None for a run without a warm start. Between it and
    `trained` lies what GRPO itself did."""
    trained_without_tools: EvalReport | None = None
    """The trained model once more with no tool offered, for a run with the search tool evaluated on this machine
    (None otherwise): how much of its score the tool carries."""


class Steps(Protocol):
    """What carries out each step of the chain; every method is one step, in chain order."""

    def prepare(self, run: ResolvedRun) -> DatasetVersion: ...

    def provision(self, run: ResolvedRun) -> Cluster: ...

    def train(self, run: ResolvedRun, dataset: DatasetVersion, cluster: Cluster) -> TrainResult: ...

    def evaluate(self, run: ResolvedRun, dataset: DatasetVersion, result: TrainResult) -> Evals:
        """The base, warm-start (when the run had one) and trained models on the held-out split."""

    def register(self, run: ResolvedRun, dataset: DatasetVersion, result: TrainResult,
                 evals: Evals) -> ModelVersion: ...

    def teardown(self, run: ResolvedRun, cluster: Cluster) -> None: ...


@dataclass(frozen=True)
class Outcome:
    """What the chain produced; the eval and registry fields stay None when it stopped after training."""

    run: ResolvedRun
    dataset: DatasetVersion
    train: TrainResult
    evals: Evals | None = None
    version: ModelVersion | None = None


LastStep = Literal["train", "register"]


def run_chain(run: ResolvedRun, steps: Steps, through: LastStep = "register") -> Outcome:
    """Run the steps in order up to `through`; the cluster is torn down whatever happens, and an error marks the
    run failed (it stays resumable: a re-run with its run_id continues from the last committed checkpoint)."""
    try:
        dataset = steps.prepare(run)
        cluster = steps.provision(run)
        try:
            result = steps.train(run, dataset, cluster)
            if through == "train":
                return Outcome(run, dataset, result)
            evals = steps.evaluate(run, dataset, result)
            version = steps.register(run, dataset, result, evals)
        finally:
            steps.teardown(run, cluster)
    except BaseException as e:
        mark_failed(run, e)
        raise
    return Outcome(run, dataset, result, evals, version)


def mark_failed(run: ResolvedRun, error: BaseException) -> None:
    runs.mark_run(run.store, run.run_id, "failed", error=f"{type(error).__name__}: {error}")
