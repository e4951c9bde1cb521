"""The chain's steps (verl_grpo.chain.Steps) as Prefect tasks: retries, logs and artifacts per step, and the
evals running concurrently on the run's task runner."""

from __future__ import annotations

from prefect.futures import PrefectFuture
from prefect.runtime import flow_run
from prefect.settings import PREFECT_UI_URL

from verl_grpo.chain import Evals, ResolvedRun
from verl_grpo.contracts import Cluster, DatasetVersion, ModelVersion, TrainResult
from verl_grpo.eval_plan import BASE, TRAINED, TRAINED_WITHOUT_TOOLS, WARM_START, eval_plan
from verl_grpo.held_out import (
    EvalTarget,
    RunModel,
    WarmStartModel,
    warm_start_model,
    without_tools_after_trained,
)
from verl_grpo_flows.task_runners import task_runner
from verl_grpo_tasks.evaluate import evaluate_without_tools, submit_eval
from verl_grpo_tasks.prepare import prepare_data
from verl_grpo_tasks.provision import provision, teardown
from verl_grpo_tasks.register import register
from verl_grpo_tasks.train import train, train_tag


class PrefectSteps:
    def prepare(self, run: ResolvedRun) -> DatasetVersion:
        return prepare_data(run)

    def provision(self, run: ResolvedRun) -> Cluster:
        return provision(run)

    def train(self, run: ResolvedRun, dataset: DatasetVersion, cluster: Cluster) -> TrainResult:
        return train.with_options(tags={train_tag(run)})(run, dataset, cluster)

    def evaluate(self, run: ResolvedRun, dataset: DatasetVersion, result: TrainResult) -> Evals:
        """The evals of the run's eval plan (eval_plan.eval_plan) at once, each after those it waits for, on threads
        or Ray workers (local or a cluster)."""
        warm_uri = warm_start_model(run.cfg, run.run_id)
        model = RunModel(run.run_id, result.model_uri)
        targets: dict[str, EvalTarget] = {BASE: None, TRAINED: model}
        if warm_uri:
            targets[WARM_START] = WarmStartModel(warm_uri)
        plan = eval_plan(run.cfg, warm_start=bool(warm_uri),
                         without_tools_after_trained=without_tools_after_trained(run.cfg))
        with task_runner(run.cfg.orchestration) as runner:
            futures: dict[str, PrefectFuture] = {}
            for step in plan:
                wait_for = [futures[name] for name in step.waits_for] or None
                futures[step.name] = (
                    runner.submit(evaluate_without_tools, {"run": run, "dataset": dataset, "trained": model},
                                  wait_for=wait_for) if step.name == TRAINED_WITHOUT_TOOLS
                    else submit_eval(runner, run, dataset, targets[step.name], wait_for=wait_for))
            return Evals(**{name: future.result() for name, future in futures.items()})

    def register(self, run: ResolvedRun, dataset: DatasetVersion, result: TrainResult, evals: Evals) -> ModelVersion:
        return register(run, dataset, result, evals, tracking_tags(run))

    def teardown(self, run: ResolvedRun, cluster: Cluster) -> None:
        teardown(run, cluster)


def tracking_tags(run: ResolvedRun) -> dict[str, str]:
    """Prefect provenance for the MLflow run (the git source is recorded by the registry itself); the flow labels
    its run with the run id as name (verl_grpo_flows.verl_grpo.label_flow_run)."""
    return {
        "prefect.flow_run_id": str(flow_run.id or ""),
        # Prefect's ui_url reads "None/flow-runs/..." where no UI serves the run (an ephemeral API, as `make run`'s)
        "prefect.flow_run_url": str(flow_run.ui_url or "") if PREFECT_UI_URL.value() else "",
        "prefect.flow_run_name": run.run_id if flow_run.id else "",
    }
