"""The provider's status tables cover SkyPilot's own status enums exactly (a status added upstream fails here)."""

from __future__ import annotations

from sky.jobs.state import ManagedJobStatus
from sky.skylet.job_lib import JobStatus

from verl_grpo.providers.skypilot import provider


def test_managed_job_statuses_are_all_classified():
    values = {s.value for s in ManagedJobStatus}
    assert set(provider._PHASES) | provider.FAILURES == values
    assert provider.FAILURES == {s.value for s in ManagedJobStatus.failure_statuses()}
    assert provider.LIVE == {s.value for s in ManagedJobStatus.processing_statuses()} | {"CANCELLING", "SUBMITTED"}


def test_cluster_job_statuses_are_all_classified():
    values = {s.value for s in JobStatus}
    assert set(provider._CLUSTER_PHASES) | provider.CLUSTER_FAILURES == values
    assert provider.CLUSTER_LIVE == {s.value for s in JobStatus.nonterminal_statuses()}
