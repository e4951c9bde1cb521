"""A Search-R1 run on the retrieval demo corpus: TRL's multi-turn rollouts call `search`, which the retrieval-server
(a separate process) answers; its log shows the calls and the tool-call rate per step reaches metrics.jsonl and
MLflow.

The tiny model emits no tool call it was never shown: the warm start teaches the call format on Search-R1
trajectories built from the same corpus (warm_start.search_share=1, calls that look up the article's title; 300
steps of 2 rows are what the 2-layer random-init model needs to write the call's JSON without slips), then GRPO
samples with the tool offered.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from mlflow import MlflowClient
from prefect_serving import processes_with_env

from verl_grpo import plain_steps
from verl_grpo.config import load_config
from verl_grpo.local_paths import data_mirror_dir, state_dir

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # ~2.5 min alone on 2 cores, most of it the warm start


def _demo_corpus(tmp_path: Path) -> Path:
    """The first article of the SQuAD dev corpus (Super Bowl 50, 54 paragraphs): the index builds in seconds."""
    squad = json.loads((data_mirror_dir() / "squad" / "dev-v1.1.json").read_text())
    out = tmp_path / "corpus.json"
    out.write_text(json.dumps({"version": squad["version"], "data": squad["data"][:1]}))
    return out


def test_search_calls_reach_the_retrieval_server_and_the_call_rate_is_tracked(tiny_overrides, tmp_path):
    overrides = [
        *tiny_overrides,
        "services.enabled=[retrieval]", "services.termination_delay_s=0", "services.retrieval.index_kind=bm25",
        f"services.retrieval.corpus={_demo_corpus(tmp_path)}", "services.retrieval.max_tool_turns=1",
        "services.retrieval.default_top_k=1", "services.retrieval.max_result_chars=400",  # 166 tokens of room
        "algorithm.total_steps=2", "algorithm.max_response_length=96",  # the call is 59 tiny-BPE tokens
        "algorithm.temperature=0.3",  # the tiny model's call JSON survives sampling at a low temperature
        "warm_start.enabled=true", "warm_start.search_share=1.0", "warm_start.steps=300", "warm_start.batch_size=2",
        "warm_start.lr=3e-3", "eval.limit=4", "eval.max_new_tokens=96",  # the eval's responses may search too
        # The 2-layer model learns to write the article's title (one for the whole demo corpus) in 200 steps; copying
        # each question into the call's JSON it does not learn.
        "warm_start.search_query=title",
    ]
    lines: list[str] = []
    outcome = plain_steps.run_pipeline(["gsm8k"], overrides, on_line=lines.append)

    assert any(line.startswith("tools: search") for line in lines)
    log = (state_dir() / "work" / outcome.run.run_id / "services" / "retrieval-server.log").read_text()
    calls = re.findall(r"search: 1 query, top_k=1, first '([^']*)'", log)  # the call names no top_k
    assert calls, "the retrieval-server's log shows no search call"

    records = [json.loads(line) for line in
               Path(outcome.train.metrics_uri.removeprefix("file://")).read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    rates = [r["tools/call_frequency"] for r in records]
    assert all(0 <= rate <= 1 for rate in rates) and max(rates) > 0
    # Every call the metric counts that did not fail (bad arguments) reached the server; the warm start calls none.
    completions = 2 * 2  # train_batch_size × rollouts per step
    assert len(calls) == round(sum(r["tools/call_frequency"] * (1 - r["tools/failure_frequency"]) * completions
                                   for r in records))

    cfg = load_config(["gsm8k"], overrides)
    client = MlflowClient(tracking_uri=cfg.tracking.mlflow_uri)
    history = client.get_metric_history(outcome.version.mlflow_run_id, "train/tools/call_frequency")
    assert [(m.step, m.value) for m in history] == [(r["step"], r["tools/call_frequency"]) for r in records]
    # The evaluations offer the tool too (base, warm start and trained alike), answered by a retrieval-server of
    # their own; the run's teardown stopped it.
    for report in (outcome.evals.base, outcome.evals.warm_start, outcome.evals.trained):
        assert 0 <= report.metrics["tool_use_rate"] <= 1 and "tool_calls_per_response" in report.metrics
    assert outcome.evals.trained.metrics["tool_use_rate"] > 0
    # ... and the trained model once more without it: the same problems, no tool offered
    plain = outcome.evals.trained_without_tools
    assert plain.n == outcome.evals.trained.n and "tool_use_rate" not in plain.metrics
    assert plain.settings_key != outcome.evals.trained.settings_key
    [eval_log] = (state_dir() / "work" / "eval-services").glob("*/services/retrieval-server.log")
    eval_calls = len(re.findall(r"search: 1 query", eval_log.read_text()))
    assert eval_calls == round(sum(r.metrics["tool_calls_per_response"] * r.n for r in (
        outcome.evals.base, outcome.evals.warm_start, outcome.evals.trained)))
    assert not [p for p in processes_with_env(f"VERL_GRPO_HOME={state_dir()}") if "retrieval_server" in p]
    print(f"search calls: {len(calls)}; tool-call rate per step: {rates}; queries: {calls[:4]}; eval tool use "
          f"{outcome.evals.trained.metrics['tool_use_rate']}")
