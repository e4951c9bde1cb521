"""The held-out rows as MLflow evaluation traces, against a real MLflow tracking store (SQLite in tmp_path)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from mlflow.tracing.client import TracingClient
from mlflow.tracing.constant import TraceMetadataKey

from verl_grpo.registry import tracking
from verl_grpo.registry.eval_records import (
    CORRECT,
    EXPECTATION,
    FLIP_TAG,
    SCORE,
    evaluation_compare_url,
    flips_first,
    log_eval_records,
    question_of,
)

CHATML = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
          "<|im_start|>user\nJanet has 3 apples. How many now?\nPut the answer after ####.<|im_end|>\n"
          "<|im_start|>assistant\n")
LLAMA3 = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_the_question_of_a_chatml_prompt_is_its_user_turn():
    assert question_of(CHATML) == "Janet has 3 apples. How many now?\nPut the answer after ####."


def test_the_question_of_other_prompts():
    assert question_of("  What is 2+2?\n") == "What is 2+2?"  # a plain prompt is the question
    assert question_of(LLAMA3) == "What is 2+2?"
    assert question_of([{"role": "system", "content": "s"}, {"role": "user", "content": "Q?"}]) == "Q?"
    assert question_of(None) == ""


def test_the_compare_url_is_the_run_traces_tab_in_compare_mode():
    assert (evaluation_compare_url("http://127.0.0.1:5000/", "7", "runa", "runb")
            == "http://127.0.0.1:5000/#/experiments/7/runs/runa/evaluations?compareToRunUuid=runb")


def _table(answers: list[str], truths: list[str]) -> pd.DataFrame:
    return pd.DataFrame({
        "id": [f"test/{i}" for i in range(len(answers))],
        "prompt": [CHATML.replace("Janet has 3", f"Janet has {i}") for i in range(len(answers))],
        "ground_truth": truths, "response": answers,
        "correct": [a == t for a, t in zip(answers, truths)],
        "score": [float(a == t) for a, t in zip(answers, truths)]})


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory):
    """One SQLite tracking store for the module (creating one takes seconds); each test has its own experiment."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    return uri, tracking.client_for(uri)


@pytest.fixture
def mlflow_env(mlflow_store, request):
    uri, client = mlflow_store
    name = request.node.name
    return client, tracking.experiment_id(client, name, tracking.artifact_location(uri, name))


def _traces(client, exp, run_id):
    store = TracingClient(client.tracking_uri).store
    infos, _ = store.search_traces(locations=[exp], max_results=100,
                                   filter_string=f"metadata.`{TraceMetadataKey.SOURCE_RUN}` = '{run_id}'")
    return infos


def test_each_row_is_one_trace_of_the_run_once_even_when_logged_twice(mlflow_env):
    client, exp = mlflow_env
    run = tracking.find_or_create_run(client, exp, "night-1", {})
    table = _table(["3", "5", "7"], ["3", "4", "7"])
    assert log_eval_records(client, exp, run, table, "test") == 3
    assert log_eval_records(client, exp, run, table, "test") == 0  # a retried registration adds nothing
    assert log_eval_records(client, exp, run, table.iloc[:2], "test") == 0
    infos = _traces(client, exp, run)
    assert len(infos) == 3
    assert sorted(i.trace_metadata["verl_grpo.problem_id"] for i in infos) == ["test/0", "test/1", "test/2"]


def test_a_row_shows_the_question_first_with_the_answer_and_its_verdicts(mlflow_env):
    client, exp = mlflow_env
    run = tracking.find_or_create_run(client, exp, "night-1", {})
    log_eval_records(client, exp, run, _table(["3", "5"], ["3", "4"]), "test")
    by_id = {i.trace_metadata["verl_grpo.problem_id"]: i for i in _traces(client, exp, run)}
    info = by_id["test/1"]
    assert info.request_preview.startswith('{"question": "Janet has 1 apples. How many now?')
    assert "<|im_start|>" not in info.request_preview
    assert json.loads(info.response_preview) == "5"
    trace = client.get_trace(info.trace_id)
    assert trace.data.spans[0].inputs["question"].startswith("Janet has 1 apples")
    assert trace.data.spans[0].outputs == "5"
    values = {a.name: a.value for a in trace.info.assessments}
    assert values == {EXPECTATION: "4", CORRECT: False, SCORE: 0.0}
    assert {a.name: a.value for a in client.get_trace(by_id["test/0"].trace_id).info.assessments}[CORRECT] is True


def test_two_runs_rows_of_one_problem_share_the_request_the_ui_pairs_them_on(mlflow_env):
    client, exp = mlflow_env
    run_a = tracking.find_or_create_run(client, exp, "night-1", {})
    run_b = tracking.find_or_create_run(client, exp, "night-2", {})
    log_eval_records(client, exp, run_a, _table(["3", "5", "7"], ["3", "4", "7"]), "test")
    log_eval_records(client, exp, run_b, _table(["2", "4", "7"], ["3", "4", "7"]), "test")
    a = {i.request_preview: i for i in _traces(client, exp, run_a)}
    b = {i.request_preview: i for i in _traces(client, exp, run_b)}
    assert len(a) == 3 and a.keys() == b.keys()  # MLflow's compare view matches rows on the request preview
    assert {i.trace_id for i in a.values()}.isdisjoint(i.trace_id for i in b.values())


def test_a_table_without_prompt_or_response_still_logs_its_verdicts(mlflow_env):
    client, exp = mlflow_env
    run = tracking.find_or_create_run(client, exp, "night-1", {})
    table = pd.DataFrame({"id": ["test/0"], "correct": [True], "score": [1.0]})
    assert log_eval_records(client, exp, run, table, "test") == 1
    info = _traces(client, exp, run)[0]
    assert {a.name: a.value for a in client.get_trace(info.trace_id).info.assessments}[CORRECT] is True


def test_flipped_verdicts_come_first_fixed_then_broke():
    table = pd.DataFrame({"id": ["a", "b", "c", "d", "e"], "correct": [True, False, True, False, True]})
    base = pd.DataFrame({"id": ["a", "b", "c", "d"], "correct": [True, True, False, False]})
    out = flips_first(table, base)
    assert list(out["id"]) == ["c", "b", "a", "d", "e"]
    assert list(out["flip"]) == ["fixed", "broke", "", "", ""]  # e: no base verdict, no flip
    assert list(flips_first(table, None)["id"]) == list(table["id"])


def test_the_ui_order_puts_flips_first_and_tags_them(mlflow_env):
    client, exp = mlflow_env
    run = tracking.find_or_create_run(client, exp, "night-1", {})
    base = pd.DataFrame({"id": ["test/0", "test/1", "test/2"], "correct": [True, True, False]})
    log_eval_records(client, exp, run, _table(["3", "5", "7"], ["3", "4", "7"]), "test", base=base)
    store = TracingClient(client.tracking_uri).store
    infos, _ = store.search_traces(locations=[exp], max_results=10, order_by=["timestamp_ms DESC"])
    ids = [i.trace_metadata["verl_grpo.problem_id"] for i in infos]
    assert ids == ["test/2", "test/1", "test/0"]  # newest first, as the UI lists them
    assert [i.tags.get(FLIP_TAG) for i in infos] == ["fixed", "broke", None]
