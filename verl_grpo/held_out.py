"""Held-out evaluation as the pipeline asks for it: one entry point per question, every setting read from the config.

- `evaluate_trained`: how good is a run's trained model? The report is stored beside the run. A provider that
  evaluates on its own cluster (`Provider.evaluates_on_cluster`: vLLM on GPUs) runs it as a job there and the
  report is read back from the store; otherwise transformers generate on this machine.
- `evaluate_base`: how good was the model before training? Through the eval cache, so nightly retrains reuse it;
  `evaluate_cached_model` asks the same of any model directory, store URI or name.
- `warm_start_model` + `evaluate_cached_model`: how good was the run's warm start (SFT) alone? Through the cache
  too (a resumed run does not evaluate it again); what lies between it and the trained model is GRPO's doing.
- `evaluate_trained_without_tools`: for a run with the search tool, how good is its trained model without it?
- `evaluate_champion`: how good is the registered champion under tonight's settings? Also through the cache.
- `shard_count`, `generate_shard`, `score_shards`: the trained or base model's eval split over eval.shards tasks
  that run concurrently; `score_shards` gives exactly the report one unsharded call gives.

Scoring and aggregation are the same code (runner.py) on every path.

"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from verl_grpo.config import RunConfig
from verl_grpo.config.search import uses_search
from verl_grpo.contracts import DatasetVersion, EvalReport
from verl_grpo.errors import InfraError
from verl_grpo.evaluate.runner import (
    EvalShard,
    Progress,
    evaluate_cached,
    evaluate_model,
    evaluate_shard,
    without_tools,
    without_tools_split,
    write_run_report,
)
from verl_grpo.providers.base import LineSink
from verl_grpo.store import Store
from verl_grpo.store_layout import eval_report, eval_table, warm_start_model_dir, warm_start_result


@dataclass(frozen=True)
class RunModel:
    """A run's trained model: what a sharded eval of the trained model names (None names the base model)."""

    run_id: str
    model_uri: str


@dataclass(frozen=True)
class WarmStartModel:
    """A run's warm-start model, as a sharded eval names it: evaluated on this machine through the eval cache."""

    model_uri: str


EvalTarget = RunModel | WarmStartModel | None
"""Which model an eval task runs: a run's trained model, its warm start, or (None) the base model."""


def evaluate_trained(cfg: RunConfig, dataset: DatasetVersion, run_id: str, model_uri: str, *,
                     progress: Progress | None = None, on_line: LineSink | None = None) -> EvalReport:
    """The trained model of `run_id` on the held-out split; its report is stored beside the run.

    progress gets (done, total) while this machine generates; on_line gets the log lines of a job on the provider.
    """
    from verl_grpo.providers import follow_job, get_provider

    provider = get_provider(cfg.infra.provider)
    store = Store.from_config(cfg.storage)
    if provider.evaluates_on_cluster:
        job = provider.submit_eval(cfg, run_id, model_uri, dataset)
        state = follow_job(provider, job, on_line)  # raises the typed error of a failed job
        if state.phase != "SUCCEEDED":
            raise InfraError(f"run {run_id}: eval job {job.name} ended {state.phase} ({state.failure_reason}); "
                             "retry the evaluate step")
        return EvalReport.model_validate_json(store.read_text(eval_report(run_id, cfg.eval.split)))
    report = evaluate_model(cfg, model_uri, dataset, store, out_rel=eval_table(run_id, cfg.eval.split),
                            progress=progress)
    write_run_report(store, run_id, report)
    return report


def evaluate_trained_without_tools(cfg: RunConfig, dataset: DatasetVersion, run_id: str, model_uri: str, *,
                                   progress: Progress | None = None) -> EvalReport | None:
    """The trained model of a run with tools, evaluated again with none offered (its report beside the run's, split
    `<split>-without-tools`); None for a run without tools. A provider that evaluates on its cluster ran this pass in
    the trained model's eval job (`vllm_runner.run_spec`): its report is read back, so call this after
    `evaluate_trained` there."""
    if not uses_search(cfg):
        return None
    store = Store.from_config(cfg.storage)
    split = without_tools_split(cfg.eval.split)
    if without_tools_after_trained(cfg):
        if not store.exists(eval_report(run_id, split)):
            raise InfraError(f"run {run_id}: its eval job left no report without tools ({eval_report(run_id, split)}"
                             "); retry the evaluate step")
        return EvalReport.model_validate_json(store.read_text(eval_report(run_id, split)))
    report = evaluate_model(without_tools(cfg), model_uri, dataset, store, out_rel=eval_table(run_id, split),
                            progress=progress)
    store.write_text(report.model_dump_json(indent=1), eval_report(run_id, split))
    return report


def without_tools_after_trained(cfg: RunConfig) -> bool:
    """Whether the eval without tools must wait for the trained model's eval: it is read from that eval's job."""
    from verl_grpo.providers import get_provider

    return uses_search(cfg) and get_provider(cfg.infra.provider).evaluates_on_cluster


def evaluate_base(cfg: RunConfig, dataset: DatasetVersion, *, progress: Progress | None = None) -> EvalReport:
    """The base model (model.name) on the same split and settings, cached across runs."""
    return evaluate_cached_model(cfg, dataset, None, progress=progress)


def evaluate_cached_model(cfg: RunConfig, dataset: DatasetVersion, model: str | None, *,
                          progress: Progress | None = None) -> EvalReport:
    """Any model (a directory, store URI or model name; None: the base model) on this machine, through the eval
    cache: the same model files under the same settings are generated once."""
    store = Store.from_config(cfg.storage)
    return evaluate_cached(cfg, model or base_model(cfg), dataset, store, progress=progress)


def warm_start_model(cfg: RunConfig, run_id: str) -> str | None:
    """The store URI of the warm-start model run_id committed (`runs/{run_id}/warm_start/model`), or None when the
    run had no warm start."""
    store = Store.from_config(cfg.storage)
    if not cfg.warm_start.enabled or not store.exists(warm_start_result(run_id)):
        return None
    return store.url(warm_start_model_dir(run_id))


def evaluate_champion(cfg: RunConfig, dataset: DatasetVersion) -> EvalReport:
    """The current champion re-evaluated with tonight's settings, so a settings change never blocks a promotion.

    Cached by the model files' content hash, so a later night with the same champion generates nothing.
    """
    from verl_grpo.registry import download_version

    with tempfile.TemporaryDirectory(prefix="champion-") as dst:
        model_dir = download_version(cfg.tracking.mlflow_uri, cfg.registered_model_name, "champion", Path(dst))
        return evaluate_cached_model(cfg, dataset, str(model_dir))


def shard_count(cfg: RunConfig, model: EvalTarget) -> int:
    """How many tasks one model's eval is split into: eval.shards, but one for a trained model that the provider
    evaluates by a job on its cluster (that job is never sharded)."""
    if isinstance(model, RunModel) and cfg.eval.shards > 1:
        from verl_grpo.providers import get_provider

        if get_provider(cfg.infra.provider).evaluates_on_cluster:
            return 1
    return cfg.eval.shards


def generate_shard(cfg: RunConfig, dataset: DatasetVersion, shard: int, model: EvalTarget = None
                   ) -> EvalShard | None:
    """Responses of one shard: of a run's trained model, or of a cached model (the base model when `model` is None,
    or a warm start; None when its eval is already cached)."""
    store = Store.from_config(cfg.storage)
    if isinstance(model, RunModel):
        return evaluate_shard(cfg, model.model_uri, dataset, store, shard)
    return evaluate_shard(cfg, _cached_model_uri(cfg, model), dataset, store, shard, cached=True)


def score_shards(cfg: RunConfig, dataset: DatasetVersion, shards: Sequence[EvalShard | None],
                 model: EvalTarget = None) -> EvalReport:
    """Score every shard's responses like one unsharded eval: a cached model's report (the base model, a warm
    start) goes to the eval cache, a trained model's beside its run."""
    store = Store.from_config(cfg.storage)
    if not isinstance(model, RunModel):
        return evaluate_cached(cfg, _cached_model_uri(cfg, model), dataset, store, shards=shards)
    report = evaluate_model(cfg, model.model_uri, dataset, store, out_rel=eval_table(model.run_id, cfg.eval.split),
                            shards=[s for s in shards if s])
    write_run_report(store, model.run_id, report)
    return report


def _cached_model_uri(cfg: RunConfig, model: WarmStartModel | None) -> str:
    return base_model(cfg) if model is None else model.model_uri


def base_model(cfg: RunConfig) -> str:
    """The local directory of the config's base model (model.name), built or fetched on first use."""
    from verl_grpo.models import resolve_model

    return str(resolve_model(cfg.model.name))
