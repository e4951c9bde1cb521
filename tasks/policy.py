"""Retry policy shared by tasks: retry infrastructure and preemption errors only, never code errors."""

from __future__ import annotations

from prefect import Task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import TaskRun
from prefect.states import State

from verl_grpo.errors import is_retryable

RETRY_DELAYS_S = [10, 60, 300]


def retry_on_infra_errors(task: Task, task_run: TaskRun, state: State) -> bool:
    """Prefect retry_condition_fn: True only for InfraError/Preempted (decided by type, not by message)."""
    exc = state.result(raise_on_failure=False)
    return isinstance(exc, BaseException) and is_retryable(exc)


RETRIED_STEP = {"cache_policy": NO_CACHE, "retries": len(RETRY_DELAYS_S), "retry_delay_seconds": RETRY_DELAYS_S,
                "retry_condition_fn": retry_on_infra_errors}
"""@task options of every pipeline step: never cached (each step checks the store itself), retried on infra errors."""
