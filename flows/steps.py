"""The chain's steps (verl_grpo.chain.Steps) as Prefect tasks: retries, logs and artifacts per step, and the
evals running concurrently on the run's task runner."""

from __future__ import annotations

from prefect.runtime import flow_run
from prefect.settings import PREFECT_UI_URL

from flows.task_runners import task_runner
from tasks.evaluate import evaluate_without_tools, submit_eval
from tasks.prepare import prepare_data
from tasks.provision import provision, teardown
from tasks.register import register
from tasks.train import train, train_tag
from verl_grpo.chain import Evals, ResolvedRun
from verl_grpo.config.search import uses_search
from verl_grpo.contracts import Cluster, DatasetVersion, ModelVersion, TrainResult
from verl_grpo.evaluate.held_out import RunModel, WarmStartModel, warm_start_model, without_tools_after_trained


class PrefectSteps:
    def prepare(self, run: ResolvedRun) -> DatasetVersion:
        return prepare_data(run)

    def provision(self, run: ResolvedRun) -> Cluster:
        return provision(run)

    def train(self, run: ResolvedRun, dataset: DatasetVersion, cluster: Cluster) -> TrainResult:
        return train.with_options(tags={train_tag(run)})(run, dataset, cluster)

    def evaluate(self, run: ResolvedRun, dataset: DatasetVersion, result: TrainResult) -> Evals:
        """Base (cached across runs), warm start (when the run had one) and trained model at once (and, for a run with
        the search tool, the trained model without it), on threads or Ray workers (local or a cluster)."""
        warm_uri = warm_start_model(run.cfg, run.run_id)
        with task_runner(run.cfg.orchestration) as runner:
            base = submit_eval(runner, run, dataset)
            warm = submit_eval(runner, run, dataset, WarmStartModel(warm_uri)) if warm_uri else None
            model = RunModel(run.run_id, result.model_uri)
            trained = submit_eval(runner, run, dataset, model)
            plain = runner.submit(evaluate_without_tools, {"run": run, "dataset": dataset, "trained": model},
                                  wait_for=[trained] if without_tools_after_trained(run.cfg) else None) \
                if uses_search(run.cfg) else None
            return Evals(base=base.result(), trained=trained.result(), warm_start=warm.result() if warm else None,
                         trained_without_tools=plain.result() if plain else None)

    def register(self, run: ResolvedRun, dataset: DatasetVersion, result: TrainResult, evals: Evals) -> ModelVersion:
        return register(run, dataset, result, evals, tracking_tags(run))

    def teardown(self, run: ResolvedRun, cluster: Cluster) -> None:
        teardown(run, cluster)


def tracking_tags(run: ResolvedRun) -> dict[str, str]:
    """Prefect provenance for the MLflow run (the git source is recorded by the registry itself); the flow labels
    its run with the run id as name (flows.verl_grpo.label_flow_run)."""
    return {
        "prefect.flow_run_id": str(flow_run.id or ""),
        # Prefect's ui_url reads "None/flow-runs/..." where no UI serves the run (an ephemeral API, as `make run`'s)
        "prefect.flow_run_url": str(flow_run.ui_url or "") if PREFECT_UI_URL.value() else "",
        "prefect.flow_run_name": run.run_id if flow_run.id else "",
    }
