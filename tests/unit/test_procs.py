"""stop_process_group(s) against real child process groups: SIGTERM first, SIGKILL only after the grace period."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from verl_grpo.procs import pid_alive, signal_group, stop_process_group, stop_process_groups

IGNORES_SIGTERM = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""
"""A group leader and a child of it that both ignore SIGTERM (the child inherits SIG_IGN); prints the child's pid."""

EXITS_ON_SIGTERM = """
import time
print(0, flush=True)
time.sleep(600)
"""
"""A process with the default SIGTERM action (it dies of the signal)."""


@pytest.fixture
def spawn():
    """Start a script as a process-group leader; returns (its Popen, the pid it printed). Kills leftover groups."""
    started: list[subprocess.Popen] = []

    def start(script: str) -> tuple[subprocess.Popen, int]:
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True)
        started.append(proc)
        return proc, int(proc.stdout.readline())

    yield start
    for proc in started:
        signal_group(proc.pid, signal.SIGKILL)  # a failed test may leave the group (or part of it) running
        proc.wait(timeout=30)
        proc.stdout.close()


def _gone(pid: int, within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_group_ignoring_sigterm_is_sigkilled_after_the_grace_period(spawn):
    proc, grandchild = spawn(IGNORES_SIGTERM)
    started = time.monotonic()
    killed = stop_process_group(proc.pid, grace_s=1.0, is_running=lambda _: proc.poll() is None)
    assert killed, "SIGTERM was ignored, so the group needed a SIGKILL"
    assert time.monotonic() - started >= 1.0, "it waited the grace period first"
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert _gone(grandchild), "the SIGKILL reached the whole group, not only its leader"


def test_a_group_that_exits_on_sigterm_needs_no_sigkill(spawn):
    proc, _ = spawn(EXITS_ON_SIGTERM)
    started = time.monotonic()
    killed = stop_process_group(proc.pid, grace_s=120.0, is_running=lambda _: proc.poll() is None)
    assert not killed
    assert time.monotonic() - started < 60, "it returned once the group ended, not at the end of the grace period"
    assert proc.wait(timeout=30) == -signal.SIGTERM


def test_groups_share_one_grace_period_and_only_the_stubborn_one_is_killed(spawn):
    """The default liveness check (pid_alive) treats an exited, unreaped child as ended."""
    polite, _ = spawn(EXITS_ON_SIGTERM)
    stubborn, _ = spawn(IGNORES_SIGTERM)
    assert stop_process_groups([polite.pid, stubborn.pid], grace_s=1.0) == [stubborn.pid]
    assert polite.wait(timeout=30) == -signal.SIGTERM
    assert stubborn.wait(timeout=30) == -signal.SIGKILL


def test_a_group_already_gone_is_fine(spawn):
    proc, _ = spawn(EXITS_ON_SIGTERM)
    proc.kill()
    assert _gone(proc.pid), "a zombie now: its pid cannot be reused by another process while the test runs"
    assert stop_process_group(proc.pid, grace_s=5.0) is False
