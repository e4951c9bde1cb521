"""Held-out evaluation of one model: plan, generate, score, aggregate, write the per-problem table.

Only generation depends on the backend (a `Generator`: transformers on CPU here, vLLM on GPU clusters in
vllm_runner.py); `run_eval` does everything else the same way for both. `evaluate_model` always generates;
`evaluate_cached` reuses an earlier result of the same model files on the same problems with the same
generation settings (base models are evaluated once, not nightly).
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from verl_grpo.config import RunConfig
from verl_grpo.contracts import DatasetVersion, EvalReport
from verl_grpo.errors import ConfigError, DataError
from verl_grpo.evaluate.generation import Generation, GenerationParams, Generator, HFGenerator
from verl_grpo.evaluate.metrics import aggregate, sampled_metrics, score_row
from verl_grpo.evaluate.models import model_key, resolve_model_dir
from verl_grpo.evaluate.problems import EvalProblem, load_split_frame, select_subset, subset_digest, to_problems
from verl_grpo.store import Store, eval_cache_table, eval_table

Scorer = Callable[[str, str, str, dict | None], Any]
Progress = Callable[[int, int], None]
_RUN_MODEL = re.compile(r"/runs/(?P<run_id>[^/]+)/model/?$")


@dataclass(frozen=True)
class EvalPlan:
    """Everything fixed before generation: which problems, how to generate, and the resulting settings key."""

    problems: list[EvalProblem]
    greedy: GenerationParams
    sampled: GenerationParams | None
    settings_key: str
    split: str


def plan_eval(
    cfg: RunConfig,
    dataset: DatasetVersion,
    store: Store,
    *,
    samples: int = 0,
    temperature: float | None = None,
    top_p: float | None = None,
) -> EvalPlan:
    """Load the split, pick the seeded subset and fix generation settings (no model involved)."""
    if samples < 0:
        raise ConfigError(f"eval samples must be >= 0 (0 disables pass@k/maj@k), got {samples}")
    split = cfg.eval.split
    frame = load_split_frame(dataset, split, store)
    problems = to_problems(frame, select_subset(len(frame), cfg.eval.limit, cfg.eval.seed))
    if not problems:
        raise DataError(f"split {split!r} of dataset {dataset.name}@{dataset.hash} is empty; set eval.split "
                        "to a split with rows")
    budget = cfg.eval.max_new_tokens or cfg.algorithm.max_response_length
    greedy = GenerationParams(max_new_tokens=budget, batch_size=cfg.eval.batch_size)
    sampled = None
    if samples:
        sampled = GenerationParams(
            max_new_tokens=budget, batch_size=max(1, cfg.eval.batch_size // samples), samples=samples, do_sample=True,
            temperature=cfg.algorithm.temperature if temperature is None else temperature,
            top_p=cfg.algorithm.top_p if top_p is None else top_p, seed=cfg.eval.seed,
        )
    blob = json.dumps({
        "dataset": dataset.hash, "split": split, "subset": subset_digest(problems), "greedy": greedy.key_fields(),
        "sampled": sampled.key_fields() if sampled else None,
    }, sort_keys=True)
    return EvalPlan(problems, greedy, sampled, hashlib.sha256(blob.encode()).hexdigest()[:16], split)


def evaluate_model(
    cfg: RunConfig,
    model_uri_or_path: str,
    dataset: DatasetVersion,
    store: Store,
    *,
    out_rel: str | None = None,
    run_id: str | None = None,
    progress: Progress | None = None,
    samples: int = 0,
    temperature: float | None = None,
    top_p: float | None = None,
    threads: int | None = None,
    scorer: Scorer | None = None,
) -> EvalReport:
    """Greedy mean@1 (plus pass@k/maj@k when `samples` > 0) of a model on the held-out split.

    The per-problem table goes to `out_rel` (relative to the store root), by default
    `runs/{run_id}/eval/{split}.parquet` (run_id given, or read off a `runs/{run_id}/model` URI).
    `threads` caps torch CPU threads while generating (default: trainer.threads, else torch's default).
    """
    plan = plan_eval(cfg, dataset, store, samples=samples, temperature=temperature, top_p=top_p)
    if out_rel is None:
        out_rel = eval_table(run_id, plan.split) if run_id else _default_table(model_uri_or_path, store, plan.split)
    model_dir = resolve_model_dir(model_uri_or_path, store)
    generator = HFGenerator(model_dir, cfg.model.dtype, threads or cfg.trainer.threads)
    return run_eval(plan, model_uri_or_path, generator, store, out_rel, progress=progress, scorer=scorer)


def evaluate_cached(
    cfg: RunConfig,
    model_uri_or_path: str,
    dataset: DatasetVersion,
    store: Store,
    *,
    progress: Progress | None = None,
    samples: int = 0,
    temperature: float | None = None,
    top_p: float | None = None,
    threads: int | None = None,
    scorer: Scorer | None = None,
) -> EvalReport:
    """Like evaluate_model, but an earlier result for the same model files and settings is returned as is.

    Cache entry: `eval-cache/{model_key}/{split}-{settings}.parquet` plus `.json` (the report), written last.
    """
    plan = plan_eval(cfg, dataset, store, samples=samples, temperature=temperature, top_p=top_p)
    model_dir = resolve_model_dir(model_uri_or_path, store)
    table_rel = eval_cache_table(model_key(model_uri_or_path, model_dir), plan.split, plan.settings_key)
    report_rel = table_rel.removesuffix(".parquet") + ".json"
    if store.exists(report_rel) and store.exists(table_rel):
        cached = EvalReport.model_validate_json(store.read_text(report_rel))
        return cached.model_copy(update={"model_uri": model_uri_or_path})
    generator = HFGenerator(model_dir, cfg.model.dtype, threads or cfg.trainer.threads)
    report = run_eval(plan, model_uri_or_path, generator, store, table_rel, progress=progress, scorer=scorer)
    store.write_text(report.model_dump_json(indent=2), report_rel)
    return report


def score_problems(
    problems: Sequence[EvalProblem],
    prompts: Sequence[str],
    greedy: Sequence[Generation],
    sampled: Sequence[Sequence[Generation]] | None,
    scorer: Scorer,
) -> tuple[pd.DataFrame, dict[str, float]]:
    """Per-problem table and aggregated metrics of given responses (no model involved)."""
    rows, votes = [], []
    for i, (problem, prompt, gen) in enumerate(zip(problems, prompts, greedy, strict=True)):
        components = _components(problem.data_source, scorer)
        scored = score_row(scorer, problem.data_source, gen.text, problem.ground_truth, problem.extra_info,
                           components)
        row = {"id": problem.id, "index": problem.index, "data_source": problem.data_source, "prompt": prompt,
               "response": gen.text, "ground_truth": problem.ground_truth, "response_tokens": gen.tokens,
               "finished": gen.finished, **scored}
        if sampled is not None:
            results = [score_row(scorer, problem.data_source, s.text, problem.ground_truth, problem.extra_info,
                                 components) for s in sampled[i]]
            votes.append([(r["pred"], r["correct"]) for r in results])
            row["sampled_responses"] = [s.text for s in sampled[i]]
            row["sampled_correct"] = sum(r["correct"] for r in results)
        rows.append(row)
    metrics = aggregate(rows)
    if votes:
        metrics.update(sampled_metrics(votes))
    return pd.DataFrame(rows), metrics


def run_eval(
    plan: EvalPlan,
    model_uri: str,
    generator: Generator,
    store: Store,
    out_rel: str,
    *,
    progress: Progress | None = None,
    scorer: Scorer | None = None,
) -> EvalReport:
    """Generate the plan's responses with `generator`, score them, write the table to `out_rel`; the report."""
    prompts = generator.render_prompts([p.messages for p in plan.problems])
    greedy, sampled = generate(generator, prompts, plan, progress)
    table, metrics = score_problems(plan.problems, prompts, greedy, sampled, scorer or _default_scorer())
    table_uri = _write_table(table, store, out_rel)
    return EvalReport(model_uri=model_uri, split=plan.split, n=len(prompts), metrics=metrics, table_uri=table_uri,
                      settings_key=plan.settings_key)


def generate(
    generator: Generator, prompts: Sequence[str], plan: EvalPlan, progress: Progress | None = None,
) -> tuple[list[Generation], list[list[Generation]] | None]:
    """Greedy responses (one per prompt) and, when the plan samples, `samples` responses per prompt."""
    n = len(prompts)
    report, close = _progress_reporter(progress, n * (2 if plan.sampled else 1))
    try:
        greedy = [g[0] for g in generator.generate(prompts, plan.greedy, lambda d, _: report(d))]
        sampled = None
        if plan.sampled:
            sampled = generator.generate(prompts, plan.sampled, lambda d, _: report(n + d))
    finally:
        close()
    return greedy, sampled


def _progress_reporter(progress: Progress | None, total: int) -> tuple[Callable[[int], None], Callable[[], None]]:
    """(report(done), close()) forwarding to the callback, or to a tqdm bar when there is none."""
    if progress is not None:
        return (lambda done: progress(done, total)), (lambda: None)
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="eval", unit="gen")
    return (lambda done: bar.update(done - bar.n)), bar.close


def _write_table(table: pd.DataFrame, store: Store, out_rel: str) -> str:
    with tempfile.TemporaryDirectory(prefix="verl-grpo-eval-") as tmp:
        local = Path(tmp) / "table.parquet"
        table.to_parquet(local, index=False)
        return store.put_file(local, out_rel)


def _default_table(model: str, store: Store, split: str) -> str:
    match = _RUN_MODEL.search(model)
    if match and model.startswith(store.uri + "/"):
        return eval_table(match["run_id"], split)
    raise ConfigError(f"model {model!r} is not a run's model in the store ({store.uri}/runs/<run_id>/model); "
                      "pass run_id or out_rel for where the eval table goes, or use evaluate_cached for base models")


def _components(data_source: str, scorer: Scorer) -> set[str] | None:
    """The project scorer's weighted components of this dataset (not its counters); None for other scorers."""
    from verl_grpo import rewards

    if scorer is not rewards.compute_score:
        return None
    return set(rewards.WEIGHTS[rewards.dataset_of(data_source)])


def _default_scorer() -> Scorer:
    from verl_grpo.rewards import compute_score

    return compute_score
