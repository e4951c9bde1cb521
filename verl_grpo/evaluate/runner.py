"""Held-out evaluation of one model: plan, generate, score, aggregate, write the per-problem table.

Only generation depends on the backend (a `Generator`: transformers on CPU here, vLLM on GPU clusters in
vllm_runner.py); `run_eval` does everything else the same way for both. `evaluate_model` always generates;
`evaluate_cached` reuses an earlier result of the same model files on the same problems with the same
generation settings (base models are evaluated once, not nightly).

Generation can be split into shards (eval.shards) that run as separate tasks: `generate_shard` produces one
shard's responses (`evaluate_shard` from a config), `finish_eval` merges them back into plan order and scores,
aggregates and writes exactly as one unsharded `run_eval` (which is itself one shard plus `finish_eval`).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from verl_grpo.config import RunConfig
from verl_grpo.config.search import tool_result_tokens, uses_search
from verl_grpo.contracts import DatasetVersion, EvalReport
from verl_grpo.errors import ConfigError, DataError, InfraError
from verl_grpo.evaluate.eval_tools import eval_tools, tool_names
from verl_grpo.evaluate.generation import Generation, GenerationParams, Generator, HFGenerator, encode_prompts
from verl_grpo.evaluate.metrics import aggregate, sampled_metrics, score_row
from verl_grpo.evaluate.models import model_key, resolve_model_dir
from verl_grpo.evaluate.problems import EvalProblem, load_split_frame, select_subset, subset_digest, to_problems
from verl_grpo.rewards.user_reward import UserReward
from verl_grpo.store import Store
from verl_grpo.store_layout import eval_cache_report, eval_cache_table, eval_report, eval_table, run_of_model

Scorer = Callable[[str, str, str, dict | None], Any]
Progress = Callable[[int, int], None]
# transformers' from_pretrained is not thread-safe (concurrent loads can leave tied weights "missing", randomly
# re-initialised, or on the meta device), and the flow evaluates models in parallel threads.
_MODEL_LOAD = threading.Lock()


@dataclass(frozen=True)
class EvalPlan:
    """Everything fixed before generation: which problems, how to generate, and the resulting settings key."""

    problems: list[EvalProblem]
    greedy: GenerationParams
    sampled: GenerationParams | None
    settings_key: str
    split: str
    scorer: Scorer | None = None
    """The run's own reward function (reward.path) when it has one; None: the task's own scorer."""


@dataclass(frozen=True)
class EvalShard:
    """One shard's responses: the plan positions it generated (indexes into plan.problems), their rendered
    prompts, the greedy responses and, when the plan samples, the sampled responses of each."""

    positions: list[int]
    prompts: list[str]
    greedy: list[Generation]
    sampled: list[list[Generation]] | None = None


def plan_eval(cfg: RunConfig, dataset: DatasetVersion, store: Store, tools: Sequence[str] | None = None) -> EvalPlan:
    """Load the split, pick the seeded subset and fix generation settings from cfg.eval (no model involved).

    `tools`: what the generator offers the model (default: the run's, `eval_tools.tool_names`)."""
    samples, temperature, top_p = cfg.eval.samples, cfg.eval.temperature, cfg.eval.top_p
    split = cfg.eval.split
    frame = load_split_frame(dataset, split, store)
    problems = to_problems(frame, select_subset(len(frame), cfg.eval.limit, cfg.eval.seed))
    if not problems:
        raise DataError(f"split {split!r} of dataset {dataset.name}@{dataset.hash} is empty; set eval.split "
                        "to a split with rows")
    tools = tool_names(cfg) if tools is None else list(tools)
    budget = (cfg.eval.max_new_tokens or cfg.algorithm.max_response_length) + (tool_result_tokens(cfg) if tools else 0)
    greedy = GenerationParams(max_new_tokens=budget, batch_size=cfg.eval.batch_size)
    sampled = None
    if samples:
        sampled = GenerationParams(
            max_new_tokens=budget, batch_size=max(1, cfg.eval.batch_size // samples), samples=samples, do_sample=True,
            temperature=cfg.algorithm.temperature if temperature is None else temperature,
            top_p=cfg.algorithm.top_p if top_p is None else top_p, seed=cfg.eval.seed,
        )
    user = UserReward.of(cfg)
    blob = json.dumps({
        "dataset": dataset.hash, "split": split, "subset": subset_digest(problems), "greedy": greedy.key_fields(),
        "sampled": sampled.key_fields() if sampled else None,
        **({"tools": tools, "max_tool_turns": cfg.services.retrieval.max_tool_turns} if tools else {}),
        **({"reward": user.fingerprint()} if user else {}),  # a cached base eval is scored by this very function
    }, sort_keys=True)
    return EvalPlan(problems, greedy, sampled, hashlib.sha256(blob.encode()).hexdigest()[:16], split, user)


def evaluate_model(
    cfg: RunConfig,
    model_uri_or_path: str,
    dataset: DatasetVersion,
    store: Store,
    *,
    out_rel: str | None = None,
    progress: Progress | None = None,
    shards: Sequence[EvalShard] | None = None,
) -> EvalReport:
    """Greedy mean@1 (plus pass@k/maj@k when `samples` > 0) of a model on the held-out split.

    The per-problem table goes to `out_rel` (relative to the store root; a run's is `store_layout.eval_table(run_id,
    split)`), by default the run's that a `runs/{run_id}/model` URI names.
    `shards`: the responses of every shard (`evaluate_shard` 0..eval.shards-1); given, nothing is generated here.
    """
    plan = plan_eval(cfg, dataset, store)
    if out_rel is None:
        out_rel = _default_table(model_uri_or_path, store, plan.split)
    if shards is not None:
        return finish_eval(plan, model_uri_or_path, shards, store, out_rel)
    model_dir = resolve_model_dir(model_uri_or_path, store)
    generator = _load_generator(cfg, model_dir)
    return run_eval(plan, model_uri_or_path, generator, store, out_rel, progress=progress)


def evaluate_cached(
    cfg: RunConfig,
    model_uri_or_path: str,
    dataset: DatasetVersion,
    store: Store,
    *,
    progress: Progress | None = None,
    scorer: Scorer | None = None,
    shards: Sequence[EvalShard | None] | None = None,
) -> EvalReport:
    """Like evaluate_model, but an earlier result for the same model files and settings is returned as is.

    Cache entry: `eval-cache/{model_key}/{split}-{settings}.parquet` plus `.json` (the report), written last.
    `shards`: the responses of every shard (`evaluate_shard(..., cached=True)`, None where the cache already
    held the result); given, nothing is generated here.
    """
    plan = plan_eval(cfg, dataset, store)
    model_dir = resolve_model_dir(model_uri_or_path, store)
    table_rel, report_rel = _cache_entry(model_uri_or_path, model_dir, plan)
    if cached := _read_cached(store, table_rel, report_rel):
        return cached.model_copy(update={"model_uri": model_uri_or_path})
    if shards is not None:
        if any(shard is None for shard in shards):
            raise InfraError(f"the eval cache entry {report_rel} that shards found has gone from the store "
                             "(deleted meanwhile); retry the evaluation")
        report = finish_eval(plan, model_uri_or_path, [s for s in shards if s is not None], store, table_rel,
                             scorer=scorer)
    else:
        generator = _load_generator(cfg, model_dir)
        report = run_eval(plan, model_uri_or_path, generator, store, table_rel, progress=progress, scorer=scorer)
    store.write_text(report.model_dump_json(indent=2), report_rel)
    return report


def evaluate_shard(
    cfg: RunConfig,
    model_uri_or_path: str,
    dataset: DatasetVersion,
    store: Store,
    shard: int,
    *,
    cached: bool = False,
    progress: Progress | None = None,
) -> EvalShard | None:
    """Responses of shard `shard` of cfg.eval.shards (whole generation batches; see shard_positions).

    Pass all shards' results to evaluate_model / evaluate_cached (`shards=`) to score them. With `cached`
    (models evaluated through evaluate_cached) it returns None, generating nothing, when the cache holds the result.
    """
    plan = plan_eval(cfg, dataset, store)
    model_dir = resolve_model_dir(model_uri_or_path, store)
    if cached and _read_cached(store, *_cache_entry(model_uri_or_path, model_dir, plan)):
        return None
    generator = _load_generator(cfg, model_dir)
    return generate_shard(plan, generator, shard, cfg.eval.shards, progress)


def write_run_report(store: Store, run_id: str, report: EvalReport) -> str:
    """Store a run's EvalReport beside its table (`runs/{run_id}/eval/{split}.json`); its URI."""
    return store.write_text(report.model_dump_json(indent=1), eval_report(run_id, report.split))


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
        if gen.tool_calls is not None:
            row.update(tool_calls=gen.tool_calls, searched=gen.tool_calls > 0, transcript=gen.transcript)
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
    return finish_eval(plan, model_uri, [generate_shard(plan, generator, progress=progress)], store, out_rel,
                       scorer=scorer)


def generate_shard(
    plan: EvalPlan, generator: Generator, shard: int = 0, shards: int = 1, progress: Progress | None = None,
) -> EvalShard:
    """The responses of shard `shard` of `shards` of the plan (all of it when shards is 1)."""
    if shards > 1 and plan.sampled is not None:
        raise ConfigError(f"eval.shards={shards} with eval.samples={plan.sampled.samples}: sampled responses depend "
                          "on the random draws of every earlier batch, so shards would change them; set "
                          "eval.shards=1 or eval.samples=0")
    prompts = generator.render_prompts([p.messages for p in plan.problems])
    positions = list(range(len(prompts)))
    if shards > 1:
        positions = shard_positions(_prompt_lengths(generator, prompts), plan.greedy.batch_size, shard, shards)
    mine = [prompts[i] for i in positions]
    greedy, sampled = generate(generator, mine, plan, progress)
    return EvalShard(positions, mine, greedy, sampled)


def shard_positions(prompt_lengths: Sequence[int], batch_size: int, shard: int, shards: int) -> list[int]:
    """Plan positions of shard `shard` of `shards`: whole generation batches, dealt out round-robin.

    The generator batches prompts longest first (generation.generate sorts them the same stable way); giving
    each shard whole batches of that order, in that order, makes every padded batch exactly the batch one
    unsharded pass builds, so greedy responses are identical, not merely equal up to float rounding.
    """
    if shards < 1 or not 0 <= shard < shards:
        raise ConfigError(f"eval shard {shard} of {shards}: the shard index must be in 0..shards-1 (eval.shards >= 1)")
    order = sorted(range(len(prompt_lengths)), key=lambda i: prompt_lengths[i], reverse=True)
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    return [position for batch in batches[shard::shards] for position in batch]


def finish_eval(
    plan: EvalPlan,
    model_uri: str,
    shards: Sequence[EvalShard],
    store: Store,
    out_rel: str,
    *,
    scorer: Scorer | None = None,
) -> EvalReport:
    """Merge the shards' responses back into plan order, score, aggregate and write the table to `out_rel`."""
    prompts, greedy, sampled = merge_shards(shards, len(plan.problems))
    table, metrics = score_problems(plan.problems, prompts, greedy, sampled, scorer or plan.scorer or _default_scorer())
    table_uri = _write_table(table, store, out_rel)
    return EvalReport(model_uri=model_uri, split=plan.split, n=len(prompts), metrics=metrics, table_uri=table_uri,
                      settings_key=plan.settings_key)


def merge_shards(
    shards: Sequence[EvalShard], n: int,
) -> tuple[list[str], list[Generation], list[list[Generation]] | None]:
    """(prompts, greedy, sampled) in plan order; every position 0..n-1 must come from exactly one shard."""
    slots: dict[int, tuple[str, Generation, list[Generation] | None]] = {}
    for shard in shards:
        sampled = shard.sampled or [None] * len(shard.positions)
        for position, prompt, gen, samples in zip(shard.positions, shard.prompts, shard.greedy, sampled, strict=True):
            if position in slots or not 0 <= position < n:
                raise ConfigError(f"eval shards overlap or exceed the plan's {n} problems (position {position}); "
                                  "pass the results of shards 0..eval.shards-1 of the same plan, each once")
            slots[position] = (prompt, gen, samples)
    if len(slots) != n:
        missing = sorted(set(range(n)) - set(slots))
        raise ConfigError(f"eval shards cover {len(slots)} of {n} problems (missing positions {missing[:5]}...); "
                          "pass the results of every shard 0..eval.shards-1")
    ordered = [slots[i] for i in range(n)]
    has_samples = any(shard.sampled is not None for shard in shards)
    return ([p for p, _, _ in ordered], [g for _, g, _ in ordered],
            [list(s or []) for _, _, s in ordered] if has_samples else None)


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


def _load_generator(cfg: RunConfig, model_dir: Path) -> Generator:
    """The model on this machine's CPU, capped at eval.threads torch threads (default trainer.threads), offered the
    run's tools (evaluate.eval_tools) when it has any."""
    with _MODEL_LOAD:
        generator = HFGenerator(model_dir, cfg.model.dtype, cfg.eval.threads or cfg.trainer.threads)
    return with_run_tools(cfg, generator)


WITHOUT_TOOLS = "without-tools"
"""Suffix of the split name under which a run's trained model evaluated without its tools is stored."""


def without_tools_split(split: str) -> str:
    return f"{split}-{WITHOUT_TOOLS}"


def without_tools(cfg: RunConfig) -> RunConfig:
    """The run's config with no tool for its evaluation (the retrieval-server left out)."""
    plain = cfg.model_copy(deep=True)
    plain.services.enabled = [name for name in cfg.services.enabled if name != "retrieval"]
    return plain


def with_run_tools(cfg: RunConfig, generator: Generator) -> Generator:
    """The generator, offering the model the run's tools (evaluate.eval_tools) when it trained with any."""
    if not uses_search(cfg):
        return generator
    from verl_grpo.evaluate.tool_loop import ToolLoopGenerator

    return ToolLoopGenerator(generator, eval_tools(cfg), cfg.services.retrieval.max_tool_turns, cfg.model.name,
                             result_room=tool_result_tokens(cfg))


def _prompt_lengths(generator: Generator, prompts: Sequence[str]) -> list[int]:
    """Token count of each prompt, encoded as the generator encodes it (the order it batches in)."""
    tokenizer = getattr(generator, "tokenizer", None)
    if tokenizer is None:
        raise ConfigError(f"{type(generator).__name__} has no tokenizer, so its batches cannot be sharded; "
                          "set eval.shards=1")
    return [len(ids) for ids in encode_prompts(tokenizer, prompts)]


def _cache_entry(model_uri_or_path: str, model_dir: Path, plan: EvalPlan) -> tuple[str, str]:
    """(table, report) paths of a model's cached eval under the plan's settings."""
    key = model_key(model_uri_or_path, model_dir)
    return (eval_cache_table(key, plan.split, plan.settings_key), eval_cache_report(key, plan.split, plan.settings_key))


def _read_cached(store: Store, table_rel: str, report_rel: str) -> EvalReport | None:
    if store.exists(report_rel) and store.exists(table_rel):
        return EvalReport.model_validate_json(store.read_text(report_rel))
    return None


def _write_table(table: pd.DataFrame, store: Store, out_rel: str) -> str:
    with tempfile.TemporaryDirectory(prefix="verl-grpo-eval-") as tmp:
        local = Path(tmp) / "table.parquet"
        table.to_parquet(local, index=False)
        return store.put_file(local, out_rel)


def _default_table(model: str, store: Store, split: str) -> str:
    run_id = run_of_model(model)
    if run_id and model.startswith(store.uri + "/"):
        return eval_table(run_id, split)
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
