"""A rehearsal job's controller is alive while its process runs this job, including the moment inside execve when
its command line is still empty; a job read in that moment keeps its secrets (CI once failed a job with
FAILED_CONTROLLER because a status read there deleted them before the controller started)."""

from __future__ import annotations

import json
import os
import time

import pytest

from verl_grpo_rehearsal import sky_boundary as sky


@pytest.fixture
def job(tmp_path):
    path = tmp_path / "jobs" / "1"
    path.mkdir(parents=True)
    (path / "job.json").write_text(json.dumps({"job_id": 1, "name": "j", "submitted_at": time.time() - 3600,
                                               "kind": "managed"}))
    # this process stands for the controller: alive and not a zombie
    (path / "state.json").write_text(json.dumps({"status": "PENDING", "recovery_count": 0, "failure_reason": None,
                                                 "controller_pid": os.getpid()}))
    (path / "secrets.json").write_text("{}")
    return path


@pytest.mark.parametrize("cmdline, alive", [
    ("", True),  # inside execve: the new program's arguments are not laid out yet
    ("python -m verl_grpo_rehearsal.controller {path}", True),
    ("python -m something.else", False),  # the pid now belongs to another program: the controller is gone
])
def test_a_controller_is_alive_while_its_process_runs_this_job(job, monkeypatch, cmdline, alive):
    monkeypatch.setattr(sky, "_cmdline", lambda pid: cmdline.format(path=job))
    assert sky._controller_alive(job) is alive
    record = sky._job_record(job)
    assert record.status == ("PENDING" if alive else "FAILED_CONTROLLER")
    assert (job / "secrets.json").exists() is alive


def test_a_controller_whose_pid_is_gone_is_dead(job):
    state = json.loads((job / "state.json").read_text())
    (job / "state.json").write_text(json.dumps({**state, "controller_pid": 2 ** 22 + 12345}))  # above pid_max
    assert not sky._controller_alive(job)
