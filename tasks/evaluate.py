"""Evaluation tasks: one task per model, or with eval.shards > 1 one task per shard plus one that scores them."""

from __future__ import annotations

from collections.abc import Sequence

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture
from prefect.task_runners import TaskRunner

from tasks.policy import RETRY_DELAYS_S, retry_on_infra_errors
from verl_grpo import pipeline
from verl_grpo.config import RunConfig
from verl_grpo.contracts import DatasetVersion, EvalReport
from verl_grpo.evaluate import EvalShard, evaluate_cached, evaluate_model, evaluate_shard, write_run_report
from verl_grpo.store import Store


@task(name="evaluate", cache_policy=NO_CACHE, retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_on_infra_errors)
def evaluate(cfg: RunConfig, model_uri: str, dataset: DatasetVersion, run_id: str) -> EvalReport:
    return pipeline.evaluate(cfg, model_uri, dataset, run_id)


@task(name="evaluate-base", cache_policy=NO_CACHE, retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_on_infra_errors)
def evaluate_base(cfg: RunConfig, dataset: DatasetVersion) -> EvalReport:
    """The base model on the same split and settings; cached in the store across runs."""
    return pipeline.evaluate_base(cfg, dataset)


@task(name="evaluate-shard", cache_policy=NO_CACHE, retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_on_infra_errors)
def eval_shard(cfg: RunConfig, model_uri: str | None, dataset: DatasetVersion, shard: int) -> EvalShard | None:
    """Responses of one shard: of the trained model at model_uri, or of the base model (model_uri None; None
    when its eval is already cached)."""
    store = Store.from_config(cfg.storage)
    if model_uri is None:
        return evaluate_shard(cfg, _base_model(cfg), dataset, store, shard, cached=True, **pipeline.eval_options(cfg))
    return evaluate_shard(cfg, model_uri, dataset, store, shard, **pipeline.eval_options(cfg))


@task(name="finish-eval", cache_policy=NO_CACHE, retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_on_infra_errors)
def finish_eval(cfg: RunConfig, model_uri: str | None, dataset: DatasetVersion, run_id: str | None,
                shards: Sequence[EvalShard | None]) -> EvalReport:
    """Score the shards' responses like one unsharded eval: the base model's report goes to the eval cache, the
    trained model's beside its run."""
    store = Store.from_config(cfg.storage)
    if model_uri is None:
        return evaluate_cached(cfg, _base_model(cfg), dataset, store, shards=shards, **pipeline.eval_options(cfg))
    report = evaluate_model(cfg, model_uri, dataset, store, run_id=run_id, shards=[s for s in shards if s],
                            **pipeline.eval_options(cfg))
    write_run_report(store, run_id, report)
    return report


def submit_eval(runner: TaskRunner, cfg: RunConfig, dataset: DatasetVersion, model_uri: str | None = None,
                run_id: str | None = None) -> PrefectFuture[EvalReport]:
    """Submit one model's eval to `runner`: the base model (model_uri None) or the trained model of run_id.

    With eval.shards > 1, one evaluate-shard task per shard and a finish-eval task that waits for them. The
    trained model on skypilot is evaluated by one vLLM job on GPUs, never sharded.
    """
    if cfg.eval.shards == 1 or (model_uri is not None and cfg.infra.provider != "local"):
        if model_uri is None:
            return runner.submit(evaluate_base, {"cfg": cfg, "dataset": dataset})
        return runner.submit(evaluate, {"cfg": cfg, "model_uri": model_uri, "dataset": dataset, "run_id": run_id})
    shards = [runner.submit(eval_shard, {"cfg": cfg, "model_uri": model_uri, "dataset": dataset, "shard": i})
              for i in range(cfg.eval.shards)]
    return runner.submit(finish_eval, {"cfg": cfg, "model_uri": model_uri, "dataset": dataset, "run_id": run_id,
                                       "shards": shards})


def _base_model(cfg: RunConfig) -> str:
    from verl_grpo.models import resolve_model

    return str(resolve_model(cfg.model.name))
