"""The local provider runs real processes: success, failure, kill (preemption-like), cancel, reattach."""

from __future__ import annotations

import signal
import sys
import time

import pytest

from verl_grpo.config import load_config
from verl_grpo.contracts import TrainSpec
from verl_grpo.providers.local import LocalProvider


@pytest.fixture
def provider(tmp_path):
    return LocalProvider(root=tmp_path / "work", cancel_grace_s=5)


def _spec(code: str, run_id: str = "r1") -> TrainSpec:
    return TrainSpec(backend="test", run_id=run_id, command=[sys.executable, "-c", code], total_steps=1)


def _wait(provider, job, timeout=30):
    deadline = time.monotonic() + timeout
    while provider.status(job).phase == "RUNNING":
        assert time.monotonic() < deadline, "job did not finish"
        time.sleep(0.05)
    return provider.status(job)


def test_success_streams_logs(provider):
    cluster = provider.up(load_config([], env={}), "r1")
    job = provider.submit(cluster, _spec("import sys\nfor i in range(3): print('line', i, flush=True)"))
    lines = list(provider.logs(job, follow=True))
    assert lines == ["line 0", "line 1", "line 2"]
    assert provider.status(job).phase == "SUCCEEDED"


def test_failure_carries_the_log_tail(provider):
    cluster = provider.up(load_config([], env={}), "r1")
    job = provider.submit(cluster, _spec("raise SystemExit('boom: bad numerics')"))
    state = _wait(provider, job)
    assert state.phase == "FAILED" and not state.preempted
    assert "exit code 1" in state.failure_reason and "boom: bad numerics" in state.failure_reason


def test_killed_process_is_reported_as_preempted(provider):
    cluster = provider.up(load_config([], env={}), "r1")
    job = provider.submit(cluster, _spec("import time; time.sleep(60)"))
    import os

    os.kill(int(job.id), signal.SIGKILL)
    state = _wait(provider, job)
    assert state.phase == "FAILED" and state.preempted and "SIGKILL" in state.failure_reason


def test_cancel_stops_the_process_group(provider):
    cluster = provider.up(load_config([], env={}), "r1")
    job = provider.submit(cluster, _spec("import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"))
    time.sleep(0.5)
    provider.cancel(job)
    assert provider.status(job).phase != "RUNNING"
    provider.cancel(job)  # idempotent


def test_resubmit_reattaches_to_a_live_job(provider):
    cluster = provider.up(load_config([], env={}), "r1")
    spec = _spec("import time; time.sleep(60)")
    first = provider.submit(cluster, spec)
    again = LocalProvider(root=provider.root).submit(cluster, spec)
    assert again.id == first.id
    provider.down(cluster)
    assert provider.status(first).phase != "RUNNING"


def test_reported_error_type_is_carried(provider):
    cluster = provider.up(load_config([], env={}), "r1")
    code = ("import json, sys\n"
            "json.dump({'type': 'DataError', 'message': 'train split is empty', 'retryable': False}, "
            "open('error.json', 'w'))\n"
            "sys.exit(2)")
    state = _wait(provider, provider.submit(cluster, _spec(code)))
    assert state.phase == "FAILED" and state.error_type == "DataError"
    assert "train split is empty" in state.failure_reason


def test_a_resumed_job_streams_only_its_own_output(tmp_path):
    """The log file keeps every attempt; a job submitted again (a fresh provider, as after a crash) streams from
    where its own output starts, also when a later provider reattaches to it, never the killed attempt's steps."""
    cluster = LocalProvider(root=tmp_path / "work").up(load_config([], env={}), "r1")
    first = LocalProvider(root=tmp_path / "work").submit(cluster, _spec("print('step 1/4', flush=True)"))
    assert list(LocalProvider(root=tmp_path / "work").logs(first, follow=True)) == ["step 1/4"]
    code = "import time\nprint('step 2/4', flush=True)\ntime.sleep(2)\nprint('step 3/4', flush=True)"
    again = LocalProvider(root=tmp_path / "work").submit(cluster, _spec(code))
    reattached = LocalProvider(root=tmp_path / "work").submit(cluster, _spec(code))
    assert reattached.id == again.id and reattached.log_offset == again.log_offset > 0
    assert list(LocalProvider(root=tmp_path / "work").logs(reattached, follow=True)) == ["step 2/4", "step 3/4"]
    log = (tmp_path / "work" / "r1" / "train.log").read_text()
    assert log.splitlines() == ["step 1/4", "step 2/4", "step 3/4"]
