"""`verl_grpo_tasks.policy.retry_on_infra_errors` in real Prefect runs (a temporary Prefect server via prefect_test_harness):
Preempted/InfraError are retried, code errors fail at once. Retry delays are overridden to 0 s."""

from __future__ import annotations

import pytest
from prefect import flow, task
from prefect_template import seeded_test_harness

from verl_grpo.contracts import TrainResult
from verl_grpo.errors import ConfigError, InfraError, Preempted, TrainingError
from verl_grpo_tasks.policy import RETRY_DELAYS_S, retry_on_infra_errors

RETRIES = 3


@pytest.fixture(scope="module", autouse=True)
def prefect_server():
    with seeded_test_harness():
        yield


def _failing_task(errors: list[BaseException], calls: list[int]):
    """A task that raises errors[i] on its i-th call and returns "done" once they run out."""

    @task(retries=RETRIES, retry_delay_seconds=RETRY_DELAYS_S[:RETRIES], retry_condition_fn=retry_on_infra_errors,
          persist_result=False)
    def step() -> str:
        calls.append(len(calls) + 1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "done"

    return step.with_options(retry_delay_seconds=0)


def _run(step):
    @flow(persist_result=False)
    def pipeline_flow() -> str:
        return step()

    return pipeline_flow(return_state=True)


def test_preemption_is_retried_until_it_succeeds():
    calls: list[int] = []
    state = _run(_failing_task([Preempted("spot node reclaimed"), InfraError("store unreachable")], calls))
    assert state.is_completed(), state
    assert state.result() == "done"
    assert calls == [1, 2, 3]


@pytest.mark.parametrize("error", [TrainingError("loss is nan"), ConfigError("bad key"), ValueError("a bug")])
def test_code_and_user_errors_fail_at_once(error):
    calls: list[int] = []
    state = _run(_failing_task([error], calls))
    assert state.is_failed(), state
    assert calls == [1], "not retried"
    with pytest.raises(type(error)):
        state.result()


def test_retries_stop_after_the_budget():
    calls: list[int] = []
    state = _run(_failing_task([Preempted(f"preempted #{i}") for i in range(RETRIES + 5)], calls))
    assert state.is_failed(), state
    assert calls == list(range(1, RETRIES + 2)), "one run plus RETRIES retries"
    with pytest.raises(Preempted):
        state.result()


def test_the_train_task_retries_a_preempted_training_and_not_a_failed_one(monkeypatch):
    """The real `train` task (its retry settings, delays set to 0) around a stand-in for plain_steps.train."""
    from verl_grpo import plain_steps
    from verl_grpo.chain import ResolvedRun
    from verl_grpo.config import load_config
    from verl_grpo.contracts import Cluster, DatasetVersion
    from verl_grpo_tasks import train as train_module

    cfg = load_config(overrides=["algorithm.total_steps=2"], env={})
    dataset = DatasetVersion(name="gsm8k", hash="h", uri="file:///d", splits={"train": "file:///d/train.parquet"},
                             counts={"train": 8})
    cluster = Cluster(provider="local", name="c", workdir="/tmp/unused", on_this_machine=True)
    result = TrainResult(run_id="r", final_step=2, checkpoint=None, model_uri="file:///m", metrics_uri="file:///m.jsonl",
                         summary={})
    outcomes: list[BaseException | None] = []

    def fake_train(*args, **kwargs):
        error = outcomes.pop(0)
        if error is not None:
            raise error
        return result

    monkeypatch.setattr(plain_steps, "train", fake_train)
    train_task = train_module.train.with_options(retry_delay_seconds=0)

    @flow(persist_result=False)
    def train_flow() -> TrainResult:
        return train_task(ResolvedRun(cfg, "r", resumed=False), dataset, cluster)

    outcomes[:] = [Preempted("killed by SIGKILL"), None]
    state = train_flow(return_state=True)
    assert state.is_completed(), state
    assert state.result() == result and outcomes == []

    outcomes[:] = [TrainingError("loss is nan"), None]
    state = train_flow(return_state=True)
    assert state.is_failed() and outcomes == [None], "a training error is not retried"
