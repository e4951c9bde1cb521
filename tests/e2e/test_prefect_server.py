"""`make serve` for real: a Prefect server on a loopback port, the deployments, a process worker; then
`verl-grpo/gsm8k` runs on the tiny model to COMPLETED with its artifacts, a second run is cancelled and
its trainer process must be gone, and `make stop` leaves no process behind."""

from __future__ import annotations

import html
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import browser
import httpx
import pytest
from eval_view import comparison_rows
from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, LogFilter, LogFilterFlowRunId
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_URL
from prefect.states import Cancelling
from prefect_serving import REPO, pid_alive, served_prefect
from samples_view import readable_responses, sample_blocks

from verl_grpo.registry import leaderboard
from verl_grpo.registry.eval_records import evaluation_compare_url
from verl_grpo.samples_markdown import full_text_line, samples_markdown
from verl_grpo_tasks.reporting import SAMPLES_KEY

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

RUN_TIMEOUT_S = 600  # a bound for a hang, with room for two other xdist workers beside


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir):
    """`make serve` in a temp state dir, schedules deployed paused (the scheduler test runs them)."""
    home = tmp_path_factory.mktemp("served")
    with served_prefect(home, tiny_model_dir.parent, first_start=True, VERL_GRPO_NIGHTLY_ACTIVE="false"):
        yield home


def _steps(overrides: list[str], total_steps: int) -> list[str]:
    return [*(o for o in overrides if not o.startswith("algorithm.total_steps=")), f"algorithm.total_steps={total_steps}"]


def test_deployments_have_nightly_schedule_and_pull_from_this_clone(served):
    with get_client(sync_client=True) as client:
        for minute, name in enumerate(("gsm8k", "math", "mbpp", "gsm8k-gpu", "math-gpu", "mbpp-gpu")):
            deployment = client.read_deployment_by_name(f"verl-grpo/{name}")
            # the nightly cron, one minute later for each deployment: no two nightly runs start together
            assert [s.schedule.cron for s in deployment.schedules] == [f"{minute} 2 * * *"]
            assert deployment.schedules[0].schedule.timezone == "UTC"
            assert not deployment.schedules[0].active  # VERL_GRPO_NIGHTLY_ACTIVE=false
            assert deployment.description.endswith("Nightly schedule paused: VERL_GRPO_NIGHTLY_ACTIVE is false.")
            assert deployment.global_concurrency_limit.limit == 1
            assert deployment.pull_steps == [
                {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}]
            dataset, _, gpu = name.partition("-")
            if gpu:  # the cluster config on SkyPilot, as `verl-grpo launch` runs it; no store: none was given
                assert deployment.parameters == {"config": [dataset], "overrides": [
                    "infra.provider=skypilot", "trainer.backend=verl", "warm_start.enabled=false"]}
            else:
                assert deployment.parameters == {"config": [name, "local"], "overrides": []}
            # the store travels with the deployment, whatever the environment of the worker that runs it
            env = deployment.job_variables["env"]
            assert env["VERL_GRPO_HOME"] == str(served.resolve())
            assert env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "30"


@dataclass
class Nights:
    first: FlowRun
    """A production night: the tiny model's directory, a base model of the production line as any model directory
    is (the stand-in for a SmolLM2 night, which CI cannot afford), 4 steps."""
    second: FlowRun
    """The next production night, 2 steps: compared with the first, the champion."""
    smoke: FlowRun
    """A smoke run (`model.name=tiny`), 2 steps: an experiment, a registered model and a leaderboard of its own."""


@pytest.fixture(scope="module")
def nights(served, tiny_run, tiny_model_dir, tmp_path_factory) -> Nights:
    """Three `verl-grpo/gsm8k` deployment runs on `make serve`, one after the other. Tracking in the state dir's
    default store, which the MLflow UI of `make serve` serves."""
    smoke = [*tiny_run, f"storage.uri=file://{tmp_path_factory.mktemp('nights') / 'store'}"]
    production = [*smoke, f"model.name={tiny_model_dir}"]
    runs = [run_deployment("verl-grpo/gsm8k", parameters={"overrides": _steps(overrides, steps)},
                           timeout=RUN_TIMEOUT_S) for overrides, steps in ((production, 4), (production, 2), (smoke, 2))]
    with get_client(sync_client=True) as client:
        return Nights(*(client.read_flow_run(run.id) for run in runs))


def test_deployment_run_completes_with_artifacts(nights):
    flow_run = nights.first
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(flow_run.id)
        logs = _flow_run_logs(client, flow_run.id, until="decision: ")
        assert flow_run.state.type == StateType.COMPLETED, "\n".join(log.message for log in logs)[-5000:]
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id])))

    run_id = flow_run.parameters["run_id"]
    assert flow_run.name.startswith("gsm8k-tiny-") and run_id.startswith("gsm8k-tiny-")
    assert {"verl-grpo", "gsm8k", "tiny", "local", "trl"} <= set(flow_run.tags)
    assert "nightly" not in flow_run.tags  # started by hand, not by the schedule
    assert any("step 4/4" in log.message for log in logs)  # trainer output streamed into the Prefect log

    by_key = {}
    for artifact in artifacts:  # newest version of each key
        if artifact.key not in by_key or artifact.created > by_key[artifact.key].created:
            by_key[artifact.key] = artifact
    assert {"run-summary-gsm8k", "eval-results", "mlflow-run", "checkpoint", "model", "training-progress",
            "training-rewards", "training-samples"} <= set(by_key)
    summary = by_key["run-summary-gsm8k"].data  # one key per dataset: its history is the nightly leaderboard
    assert run_id in summary and "config_digest" in summary and "decision" in summary
    assert float(by_key["training-progress"].data) == pytest.approx(100.0)
    assert "| 4/4 |" in by_key["training-rewards"].data
    samples = by_key["training-samples"]  # the last sampled step's rollouts, a page grouped by prompt
    assert samples.type == "markdown" and samples.data.startswith("# Rollouts of training step 4\n")
    assert "## Prompt 1 of " in samples.data and "**Response 1** · reward " in samples.data
    assert "<|im_start|>" not in samples.data and "train/samples.json" in samples.data
    table = json.loads(by_key["eval-results"].data)
    assert "accuracy" in {row["metric"] for row in table}
    assert by_key["checkpoint"].type == "markdown" and "global_step_4" in by_key["checkpoint"].data
    # The outcome sits on the flow run itself, and in its log.
    assert by_key["run-summary-gsm8k"].task_run_id is None and by_key["eval-results"].task_run_id is None
    assert "**Decision:**" in summary and "| accuracy |" in summary and "McNemar p=" in summary
    decision = next(log.message for log in logs if log.message.startswith("decision: ")).removeprefix("decision: ")
    # The final state's message: the summary's warnings (the tiny model learns nothing), then the decision.
    assert summary.count("**Warning:** ") == flow_run.state.message.count("Warning: ") > 0, flow_run.state.message
    assert flow_run.state.message.startswith("Warning: ") and flow_run.state.message.endswith(f"Decision: {decision}")
    assert any(log.message.startswith("accuracy: ") and "McNemar p=" in log.message for log in logs)
    # Its MLflow link opens the run on the MLflow UI that `make serve` started over the local store.
    mlflow_url = re.search(r"\((http://[^)]+)\)", by_key["mlflow-run"].data)[1]  # a link artifact: [text](url)
    assert f"]({mlflow_url})" in summary
    ui, route = mlflow_url.split("/#/", 1)
    route, view = route.split("?", 1)
    assert view == "workflowType=machine_learning"  # MLflow 3's UI would open the GenAI view otherwise
    mlflow_run_id = route.rsplit("/", 1)[1]
    assert httpx.get(ui, timeout=30).status_code == 200
    got = httpx.get(f"{ui}/api/2.0/mlflow/runs/get", params={"run_id": mlflow_run_id}, timeout=30)
    assert got.status_code == 200 and got.json()["run"]["info"]["run_id"] == mlflow_run_id
    assert f"/experiments/{got.json()['run']['info']['experiment_id']}/runs/" in mlflow_url
    _the_browser_shows_the_night(PREFECT_API_URL.value().removesuffix("/api"), by_key, samples,
                                 f"{ui}/#/experiments/{got.json()['run']['info']['experiment_id']}/runs/{mlflow_run_id}",
                                 got.json()["run"]["data"])


def _the_browser_shows_the_night(prefect_ui: str, artifacts: dict, samples, mlflow_run: str,
                                 run_data: dict) -> None:
    """What a person opening `make serve`'s two UIs in a browser sees of the run (headless Chromium, the rendered
    DOM): the flow run's artifacts and the MLflow run's tables filled, and the training curves leading."""
    page = browser.rendered_dom(f"{prefect_ui}/artifacts/artifact/{artifacts['training-samples'].id}")
    # each group: its numbers as a table, then the question and every response as a code block, text as written
    groups = browser.tables(page)
    assert groups and all(t.headers[:3] == ["response", "reward", "advantage"] for t in groups), groups
    responses = sum(len(t.rows) for t in groups)
    assert len(sample_blocks(page)) == len(groups) + responses  # a question per group, then its responses
    assert samples.data.count("**Response ") == responses
    [drawn] = browser.tables(browser.rendered_dom(f"{prefect_ui}/artifacts/artifact/{artifacts['eval-results'].id}"))
    assert "accuracy" in drawn.column("metric")
    summary = browser.rendered_dom(f"{prefect_ui}/artifacts/artifact/{artifacts['run-summary-gsm8k'].id}")
    assert "Decision:" in summary and "McNemar p=" in summary

    [drawn] = browser.tables(browser.rendered_dom(f"{mlflow_run}/artifacts/train/samples.json"))
    assert sorted({int(s) for s in drawn.column("step")}) == [1, 2, 3, 4]  # every sampled step, not just the last
    assert all(drawn.column("prompt")) and all(drawn.column("response"))
    side_by_side = f"{mlflow_run}/artifacts/eval/test-side_by_side.json"
    [drawn] = browser.tables(browser.rendered_dom(side_by_side))
    if shots := os.environ.get(SCREENSHOTS_ENV):
        browser.screenshot(side_by_side, Path(shots) / "mlflow-eval-side-by-side.png")
    assert {"base_response", "trained_response", "base_correct", "trained_correct"} <= set(drawn.headers)
    assert drawn.headers[0] == "question" and drawn.rows and all(drawn.column("question"))
    # The Model metrics tab opens on the training curves; the single values (eval, p-values) follow as bars.
    sections = browser.chart_sections(browser.rendered_dom(f"{mlflow_run}/model-metrics"))
    assert sections[0][0] == "train" and all(name.startswith("train") for name, _ in sections[:-1]), sections
    single_values = [m["key"] for m in run_data["metrics"] if "/" not in m["key"]]
    assert sections[-1] == ("Model metrics", len(single_values)) and "eval.accuracy" in single_values, sections


SCREENSHOTS_ENV = "VERL_GRPO_SCREENSHOTS"
"""A directory to keep the pages' screenshots in (docs/screenshots is taken this way); unset: none are kept."""
WIDE = (2600, 1000)
"""MLflow's runs table draws only the columns in view: wide enough for the leaderboard's."""


def test_the_nights_compare_in_both_uis(nights, tmp_path):
    """Which night was best, and what the model writes now: the leaderboard in Prefect and in MLflow's runs table
    (production runs only), MLflow's evaluation comparison of two nights on the same rows, the flow run's state
    message, and a samples page that keeps the text as written."""
    prefect_ui = PREFECT_API_URL.value().removesuffix("/api")
    shots = Path(os.environ.get(SCREENSHOTS_ENV) or tmp_path)
    with get_client(sync_client=True) as client:
        first, second, smoke = (_newest_artifacts(client, run.id) for run in (nights.first, nights.second, nights.smoke))
        for run in (nights.second, nights.smoke):
            assert client.read_flow_run(run.id).state.type == StateType.COMPLETED, run.state
    (ui, production, first_run), (_, _, second_run), (_, smoke_experiment, smoke_run) = (
        _mlflow_run(a) for a in (first, second, smoke))
    assert smoke_experiment != production  # smoke runs in an experiment of their own: verl-grpo/gsm8k-tiny
    assert _experiment_name(ui, smoke_experiment) == "verl-grpo/gsm8k-tiny"

    # Prefect: the task's leaderboard, a new version of `leaderboard-gsm8k` after each production night.
    assert "leaderboard-gsm8k" not in smoke and "leaderboard-gsm8k-tiny" in smoke and "run-summary-gsm8k-tiny" in smoke
    url = f"{prefect_ui}/artifacts/artifact/{second['leaderboard-gsm8k'].id}"
    dom = browser.rendered_dom(url)
    [board] = browser.tables(dom)
    assert board.headers == leaderboard.HEADER and len(board.rows) == 2, board  # no smoke run
    nights_linked = [(link["href"].split("/runs/")[1].split("?")[0], link.get("title")) for link in browser.links(dom)
                     if "/#/experiments/" in link.get("href", "") and "/runs/" in link["href"]]
    assert nights_linked == [(second_run, nights.second.name), (first_run, nights.first.name)], nights_linked
    row = dict(zip(board.headers, board.rows[0]))
    assert float(row["accuracy"]) >= 0 and row["Δ vs champion"][0] in "+-" and 0 <= float(row["p"]) <= 1, row
    assert row["decision"].startswith("kept-") and row["steps"] == "2" and row["cost"] == "local", row
    browser.screenshot(url, shots / "prefect-leaderboard.png")

    # MLflow: the experiment's saved view, the same columns, the production nights only.
    url = f"{ui}/#{leaderboard.leaderboard_route(production)}"
    drawn = browser.grid_rows(browser.rendered_dom(url, window=WIDE))
    assert set(drawn) == {first_run, second_run}, drawn
    columns = drawn[second_run]
    for key in (leaderboard.ACCURACY, leaderboard.DELTA, leaderboard.P_VALUE, leaderboard.STEPS):
        assert re.fullmatch(r"-?[\d.e-]+", columns[f"metrics.`{key}`"]), (key, columns)
    assert columns[f"tags.`{leaderboard.DECISION_TAG}`"] == row["decision"]
    browser.screenshot(url, shots / "mlflow-leaderboard-view.png", window=(2600, 700))

    # MLflow's own evaluation view: the second night's answers beside the first's, question by question.
    url = evaluation_compare_url(ui, production, second_run, first_run)
    rows = comparison_rows(browser.rendered_dom(url))
    assert rows and all(r.compared for r in rows), rows[:3]
    assert all(r.question and "<|im_start|>" not in r.question for r in rows), rows[:3]
    assert all(set(r.assessments["correct"]) <= {"True", "False"} and len(r.assessments["correct"]) == 2 for r in rows)
    browser.screenshot(url, shots / "mlflow-eval-compare.png")

    # The flow run's page shows its state message: the warnings, then the decision.
    page = browser.rendered_dom(f"{prefect_ui}/runs/flow-run/{nights.second.id}")
    message = nights.second.state.message
    assert message.rsplit("Decision: ", 1)[1][:60] in html.unescape(page), message

    # The samples page keeps a response as written: `<answer>` as text, its line breaks.
    page = _published_samples_page()
    url = f"{prefect_ui}/artifacts/artifact/{page}"
    dom = browser.rendered_dom(url)
    assert sample_blocks(dom)[0] == "Susan has 52 cats. Bob has 4 cats. How many more cats has Susan?"
    assert readable_responses(dom) == SAMPLE_RESPONSES
    [numbers] = browser.tables(dom)
    assert numbers.column("reward") == ["0.0", "0.4"] and numbers.column("advantage") == ["0.707", "-0.293"]
    browser.screenshot(url, shots / "prefect-training-samples.png")


SAMPLE_PROMPT = ("<|im_start|>system\nYou are a careful problem solver. Reason inside <think> </think>.<|im_end|>\n"
                 "<|im_start|>user\nSusan has 52 cats. Bob has 4 cats. How many more cats has Susan?<|im_end|>\n"
                 "<|im_start|>assistant\n")
SAMPLE_RESPONSES = ["<think>\n52-4=48\n</think>\n<answer>48</answer>",
                    "<think>\n52-2=50\n</think>\n<answer>52</answer>"]


@flow
def _published_samples_page():
    """The `training-samples` page of a step whose responses kept the format (a tiny model's never do), published
    on the served Prefect as the flow publishes it."""
    samples = [{"prompt": SAMPLE_PROMPT, "response": r, "reward": 0.4000000096857548 * i, "advantage": 0.7071 - i,
                "truncated": False, "components": {"correctness": float(i == 0)}} for i, r in enumerate(SAMPLE_RESPONSES)]
    page = samples_markdown({"step": 4, "samples": samples}, "gsm8k-run",
                            full_text_line(None, "/store/runs/gsm8k-run/samples.jsonl"))
    return create_markdown_artifact(page, key=SAMPLES_KEY)


def _newest_artifacts(client, flow_run_id) -> dict:
    """The flow run's newest artifact of each key."""
    by_key = {}
    for artifact in client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))):
        if artifact.key not in by_key or artifact.created > by_key[artifact.key].created:
            by_key[artifact.key] = artifact
    return by_key


def _mlflow_run(artifacts: dict) -> tuple[str, str, str]:
    """(MLflow UI, experiment id, MLflow run id) of a flow run's `mlflow-run` link."""
    url = re.search(r"\((http://[^)]+)\)", artifacts["mlflow-run"].data)[1]
    ui, route = url.split("/#/", 1)
    _, experiment, _, run = route.split("?", 1)[0].split("/")
    return ui, experiment, run


def _experiment_name(ui: str, experiment_id: str) -> str:
    got = httpx.get(f"{ui}/api/2.0/mlflow/experiments/get", params={"experiment_id": experiment_id}, timeout=30)
    return got.json()["experiment"]["name"]


def test_cancelling_a_flow_run_stops_the_trainer(served, tiny_overrides):
    flow_run = run_deployment("verl-grpo/gsm8k", parameters={"overrides": _steps(tiny_overrides, 500)},
                              timeout=0)
    trainer_pid = _wait_for_trainer(served, flow_run.id)
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run.id, Cancelling(message="cancelled by test"))
        state = _wait_for_final_state(client, flow_run.id)
    assert state.type == StateType.CANCELLED, state
    assert not pid_alive(trainer_pid), f"trainer {trainer_pid} survived the cancellation"


def _flow_run_logs(client, flow_run_id, until: str, timeout_s: float = 30):
    """The flow run's logs once a line starting with `until` arrived: the flow process ships its last log
    lines in a batch that can reach the server just after the run turned COMPLETED."""
    deadline = time.monotonic() + timeout_s
    while True:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
        if any(log.message.startswith(until) for log in logs) or time.monotonic() > deadline:
            return logs
        time.sleep(1)


def _wait_for_trainer(home: Path, flow_run_id, timeout_s: float = RUN_TIMEOUT_S) -> int:
    """PID of the run's training process once the first progress line is out (the flow is mid-training)."""
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            run_id = client.read_flow_run(flow_run_id).parameters.get("run_id")
            workdir = home / "work" / str(run_id)
            log = workdir / "train.log"
            if run_id and log.is_file() and "step 1/500" in log.read_text(errors="replace"):
                pid = json.loads((workdir / "job.json").read_text())["pid"]
                assert pid_alive(pid)
                return pid
            state = client.read_flow_run(flow_run_id).state
            assert not state.is_final(), f"flow run ended before training started: {state}"
            time.sleep(0.5)
    raise AssertionError(f"training of flow run {flow_run_id} did not start within {timeout_s} s")


def _wait_for_final_state(client, flow_run_id, timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = client.read_flow_run(flow_run_id).state
        if state.is_final():
            return state
        time.sleep(0.5)
    raise AssertionError(f"flow run {flow_run_id} still {state.type} {timeout_s} s after cancelling")
