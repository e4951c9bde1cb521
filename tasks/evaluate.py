"""Evaluation tasks: one task per model (base, warm start, trained), or with eval.shards > 1 one task per shard plus
one that scores them."""

from __future__ import annotations

from collections.abc import Sequence

from prefect import task
from prefect.futures import PrefectFuture
from prefect.task_runners import TaskRunner

from verl_grpo import held_out
from verl_grpo.chain import ResolvedRun
from verl_grpo.contracts import DatasetVersion, EvalReport
from verl_grpo.evaluate.runner import EvalShard
from verl_grpo.held_out import EvalTarget, RunModel, WarmStartModel
from verl_grpo_tasks.policy import RETRIED_STEP


@task(name="evaluate", **RETRIED_STEP)
def evaluate(run: ResolvedRun, dataset: DatasetVersion, trained: RunModel) -> EvalReport:
    return held_out.evaluate_trained(run.cfg, dataset, trained.run_id, trained.model_uri)


@task(name="evaluate-base", **RETRIED_STEP)
def evaluate_base(run: ResolvedRun, dataset: DatasetVersion) -> EvalReport:
    """The base model on the same split and settings; cached in the store across runs."""
    return held_out.evaluate_base(run.cfg, dataset)


@task(name="evaluate-warm-start", **RETRIED_STEP)
def evaluate_warm_start(run: ResolvedRun, dataset: DatasetVersion, warm_start: WarmStartModel) -> EvalReport:
    """The run's warm-start model on the same split and settings; cached by its files."""
    return held_out.evaluate_cached_model(run.cfg, dataset, warm_start.model_uri)


@task(name="evaluate-without-tools", **RETRIED_STEP)
def evaluate_without_tools(run: ResolvedRun, dataset: DatasetVersion, trained: RunModel) -> EvalReport | None:
    """The trained model again with no tool offered (a run with the search tool); None for a run without tools."""
    return held_out.evaluate_trained_without_tools(run.cfg, dataset, trained.run_id, trained.model_uri)


@task(name="evaluate-shard", **RETRIED_STEP)
def eval_shard(run: ResolvedRun, dataset: DatasetVersion, shard: int, model: EvalTarget) -> EvalShard | None:
    return held_out.generate_shard(run.cfg, dataset, shard, model)


@task(name="finish-eval", **RETRIED_STEP)
def finish_eval(run: ResolvedRun, dataset: DatasetVersion, shards: Sequence[EvalShard | None],
                model: EvalTarget) -> EvalReport:
    return held_out.score_shards(run.cfg, dataset, shards, model)


def submit_eval(runner: TaskRunner, run: ResolvedRun, dataset: DatasetVersion, model: EvalTarget = None,
                wait_for: Sequence[PrefectFuture] | None = None) -> PrefectFuture[EvalReport]:
    """Submit one model's eval to `runner`, started once `wait_for` have finished: the base model (model None), a
    run's warm start or its trained model; split into evaluate-shard tasks and a finish-eval task that waits for them
    when held_out.shard_count says so."""
    shards = held_out.shard_count(run.cfg, model)
    if shards == 1:
        if model is None:
            return runner.submit(evaluate_base, {"run": run, "dataset": dataset}, wait_for=wait_for)
        if isinstance(model, WarmStartModel):
            return runner.submit(evaluate_warm_start, {"run": run, "dataset": dataset, "warm_start": model},
                                 wait_for=wait_for)
        return runner.submit(evaluate, {"run": run, "dataset": dataset, "trained": model}, wait_for=wait_for)
    parts = [runner.submit(eval_shard, {"run": run, "dataset": dataset, "shard": i, "model": model},
                           wait_for=wait_for) for i in range(shards)]
    return runner.submit(finish_eval, {"run": run, "dataset": dataset, "shards": parts, "model": model})
