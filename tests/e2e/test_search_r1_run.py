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
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient
from prefect_serving import processes_with_env
from prefect_template import seeded_test_harness

from verl_grpo import plain_steps
from verl_grpo.chain import Outcome
from verl_grpo.config import load_config
from verl_grpo.contracts import EvalReport
from verl_grpo.local_paths import data_mirror_dir, state_dir
from verl_grpo.store import Store, strip_scheme
from verl_grpo.store_layout import eval_report
from verl_grpo_rehearsal import sky_boundary
from verl_grpo_rehearsal.session import rehearsal_session

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # ~2.5 min alone on 2 cores, most of it the warm start

SEARCH = [
    "services.enabled=[retrieval]", "services.termination_delay_s=0", "services.retrieval.index_kind=bm25",
    "services.retrieval.max_tool_turns=1", "services.retrieval.default_top_k=1",
    "algorithm.max_response_length=96",  # the call is 59 tiny-BPE tokens
    "algorithm.temperature=0.3",  # the tiny model's call JSON survives sampling at a low temperature
    "eval.limit=4", "eval.max_new_tokens=96",  # the eval's responses may search too
]
"""The search settings of both tests: one passage per search, one search per response."""


def _demo_corpus(tmp_path: Path) -> Path:
    """The first article of the SQuAD dev corpus (Super Bowl 50, 54 paragraphs): the index builds in seconds."""
    squad = json.loads((data_mirror_dir() / "squad" / "dev-v1.1.json").read_text())
    out = tmp_path / "corpus.json"
    out.write_text(json.dumps({"version": squad["version"], "data": squad["data"][:1]}))
    return out


@dataclass
class SearchRun:
    """What `search_run` leaves: the run's overrides, its streamed lines, its outcome and retrieval-server logs."""

    overrides: list[str]
    lines: list[str]
    outcome: Outcome
    training_log: str
    """The run's retrieval-server during training."""
    eval_logs: list[str]
    """The retrieval-servers of its evaluations."""
    left: list[str]
    """Retrieval-server processes of the run still alive after it."""
    corpus: Path


@pytest.fixture(scope="module")
def search_run(tiny_run, tiny_model_dir, tmp_path_factory) -> SearchRun:
    """A TRL run whose model learns to call `search`, read by both tests: the second rehearses a GPU launch with it."""
    tmp = tmp_path_factory.mktemp("search-run")
    corpus = _demo_corpus(tmp)
    overrides = [
        *tiny_run, f"model.name={tiny_model_dir}", f"storage.uri=file://{tmp / 'store'}",
        f"tracking.mlflow_uri=sqlite:///{tmp / 'mlflow.db'}", *SEARCH, f"services.retrieval.corpus={corpus}",
        "services.retrieval.max_result_chars=400",  # 166 tokens of room
        "algorithm.total_steps=2", "warm_start.enabled=true", "warm_start.search_share=1.0", "warm_start.steps=300",
        "warm_start.batch_size=2", "warm_start.lr=3e-3",
        # The 2-layer model learns to write the article's title (one for the whole demo corpus) in 200 steps; copying
        # each question into the call's JSON it does not learn.
        "warm_start.search_query=title",
    ]
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as env:  # a module's world: the per-test state dir is not set up yet
        env.setenv("VERL_GRPO_HOME", str(tmp / "state"))
        outcome = plain_steps.run_pipeline(["gsm8k"], overrides, on_line=lines.append)
        work = state_dir() / "work"
        return SearchRun(
            overrides=overrides, lines=lines, outcome=outcome,
            training_log=(work / outcome.run.run_id / "services" / "retrieval-server.log").read_text(),
            eval_logs=[p.read_text() for p in (work / "eval-services").glob("*/services/retrieval-server.log")],
            left=[p for p in processes_with_env(f"VERL_GRPO_HOME={state_dir()}") if "retrieval_server" in p],
            corpus=corpus)


def test_search_calls_reach_the_retrieval_server_and_the_call_rate_is_tracked(search_run):
    overrides, lines, outcome = search_run.overrides, search_run.lines, search_run.outcome
    assert any(line.startswith("tools: search") for line in lines)
    log = search_run.training_log
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
    [eval_log] = search_run.eval_logs
    eval_calls = len(re.findall(r"search: 1 query", eval_log))
    assert eval_calls == round(sum(r.metrics["tool_calls_per_response"] * r.n for r in (
        outcome.evals.base, outcome.evals.warm_start, outcome.evals.trained)))
    assert not search_run.left
    print(f"search calls: {len(calls)}; tool-call rate per step: {rates}; queries: {calls[:4]}; eval tool use "
          f"{outcome.evals.trained.metrics['tool_use_rate']}")


TURNS = re.compile(r"rehearsal: step (\d+) agent loops: \d+ rollouts, \d+ generate calls so far, turns per rollout "
                   r"([\d,]+)$", re.MULTILINE)


def test_a_gpu_launch_rehearsal_runs_verls_tool_loop_against_the_job_groups_retrieval_server(search_run, tmp_path):
    """`verl-grpo launch -c squad` of the searching model (a job group: the retrieval-server beside the verl trainer),
    rehearsed on nodes that have only what their setup installs: verl's own AgentLoopWorker and tool_agent loop load
    our tool from infra/verl/search_tool.yaml on the trainer node and call the group's retrieval-server by its hostname
    (built from the corpus the launch published to the store), and verl's reward loader scores with the QA reward;
    the vLLM eval node offers the tool too, answered by a retrieval-server of its own over the same store, then
    evaluates without it."""
    model = search_run.outcome.train.model_uri.removeprefix("file://")
    overrides = [
        *SEARCH, f"model.name={model}", f"services.retrieval.corpus={search_run.corpus}",
        # verl drops a tool result that would overflow the rollout (tool_agent_loop.py); the tiny BPE spends 2.3
        # characters a token, under the 3 that config.search.CHARS_PER_TOKEN bounds real vocabularies with
        "services.retrieval.max_result_chars=300",
        "algorithm.total_steps=2", "algorithm.save_freq=2", "algorithm.train_batch_size=2", "algorithm.rollouts=4",
        "warm_start.enabled=false", "eval.batch_size=4", "trainer.backend=verl", "infra.provider=skypilot",
        "skypilot.shape=job_group", "skypilot.termination_delay=2s", "skypilot.max_restarts_on_errors=0",
    ]
    cfg = load_config(["squad"], overrides)
    with seeded_test_harness(), rehearsal_session(cfg, root=tmp_path / "rehearsal") as session:
        from verl_grpo_flows.verl_grpo import verl_grpo

        run_overrides = [*overrides, *session.overrides]
        summary = verl_grpo(config=["squad"], overrides=run_overrides)
        jobs = [sky_boundary.summary(r.job_id) for r in sky_boundary.queue()]
        store = Store.from_config(load_config(["squad"], run_overrides).storage)
        trained, plain = (EvalReport.model_validate_json(store.read_text(eval_report(summary["run_id"], split)))
                          for split in ("test", "test-without-tools"))
        with store.fs.open(strip_scheme(trained.table_uri), "rb") as f:
            table = pd.read_parquet(f)  # the eval node's per-problem table, in the rehearsal's S3

    assert summary["steps"] == 2
    train_job = next(j for j in jobs if not j["name"].endswith("-eval"))
    assert train_job["status"] == "SUCCEEDED" and train_job["tasks"]["retrieval-server"] == "CANCELLED"
    log = (Path(train_job["job_dir"]) / "run.log").read_text()
    assert ("rehearsal: rollouts in verl's AgentLoopWorker (tool_agent loop by default), tools search loaded from "
            "infra/verl/search_tool.yaml") in log
    turns = [int(t) for m in TURNS.finditer(log) for t in m[2].split(",")]
    assert len(turns) == 2 * 2 * 4  # steps × prompts × rollouts
    # 2 turns: an answer, or a call whose result had no room left; 4: a call, its result, the answer after it
    assert set(turns) <= {2, 4} and turns.count(4) >= 1
    searches = re.findall(r"^\(retrieval-server, rank=0\) .* search: 1 query, top_k=1, first 'Super Bowl 50'", log,
                          flags=re.MULTILINE)
    assert len(searches) >= turns.count(4)  # each result the loop merged came from the group's retrieval-server

    eval_job = next(j for j in jobs if j["name"].endswith("-eval"))
    assert eval_job["status"] == "SUCCEEDED"
    assert trained.metrics["tool_use_rate"] > 0
    searched = table[table["searched"]]
    # the eval node's own retrieval-server (over the index the group's server left in the store) answered each call
    assert len(searched) and searched["transcript"].str.contains("Doc 1(Title: Super Bowl 50) ", regex=False).all()
    # The eval job evaluated the model once more with no tool offered, and the flow read that report back after it
    assert plain.n == trained.n and "tool_use_rate" not in plain.metrics and plain.settings_key != trained.settings_key
    assert summary["tools"].startswith("search tool: used in ")  # the summary says what the tool carries
    print(f"turns per rollout {turns}; {len(searches)} searches; eval node tool use {trained.metrics['tool_use_rate']}")
