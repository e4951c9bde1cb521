"""A successful `verl-grpo run` is quiet: no connection leaves the machine, and no ERROR or traceback is printed.

One tiny-model run through the real CLI in a child process, in a user's environment (none of the switches the
product sets, no CI or pytest markers: MLflow and Prefect stay quiet in CI on their own, which would hide a
missing switch). `tests/egress_hook/sitecustomize.py` (tests/loopback_only.py), first on PYTHONPATH, loads in every Python process of the run
(the CLI, Prefect's ephemeral API server, the trainer worker, anything they start) and records each attempt to
reach an address outside 127.0.0.0/8 and ::1, or to look up a name that is not localhost.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import loopback_only
from verl_grpo.privacy import QUIET_ENV

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
# Variables by which MLflow or Prefect detect a CI or test run and switch their telemetry off by themselves.
CI_MARKERS = {"CI", "GITHUB_ACTIONS", "GITLAB_CI", "CIRCLECI", "JENKINS_URL", "TRAVIS", "TF_BUILD", "BUILDKITE",
              "BITBUCKET_BUILD_NUMBER", "BITBUCKET_COMMIT", "CODEBUILD_BUILD_ARN", "CODEBUILD_BUILD_ID",
              "TEAMCITY_VERSION", "CLOUD_RUN_EXECUTION", "DRONE", "SEMAPHORE", "APPVEYOR", "BUDDY", "CI_NAME",
              "RUNBOT_HOST_URL", "RUNBOT_BUILD_NAME", "RUNBOT_WORKER_ID"}
ERROR_RECORD = re.compile(r"(^|\s)(ERROR|CRITICAL)(\s|:|$)")
PROBE = """
import socket, subprocess, sys
s = socket.socket(); s.settimeout(0.2); s.connect_ex(("10.255.255.1", 9)); s.close()
try:
    socket.getaddrinfo("egress-probe.invalid", 80)
except OSError:
    pass
"""


def _user_env(tmp: Path) -> tuple[dict[str, str], Path]:
    """A user's environment with the recorder on (and the file it writes)."""
    drop = set(QUIET_ENV) | CI_MARKERS
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("PREFECT_", "PYTEST_"))}
    env.update(HOME=str(tmp / "home"), VERL_GRPO_HOME=str(tmp / "state"), PYTHONUNBUFFERED="1")
    return loopback_only.subprocess_env(tmp, env)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def quiet_run(tmp_path_factory, tiny_model_dir, tiny_run):
    tmp = tmp_path_factory.mktemp("quiet-run")
    env, log = _user_env(tmp)
    overrides = [*tiny_run, f"model.name={tiny_model_dir}"]
    args = [sys.executable, "-m", "cli", "run", "-c", "gsm8k", "-c", "local"]
    for override in overrides:
        args += ["-o", override]
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    return done, tmp, log


def test_no_connection_leaves_the_machine(quiet_run):
    done, _, log = quiet_run
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    attempts = _records(log)
    assert not attempts, "\n\n".join(f"pid {a['pid']} {a['argv'][:3]}: {a['event']} {a['target']}\n{a['stack']}"
                                     for a in attempts)
    loaded = [" ".join(r["orig_argv"]) for r in _records(Path(f"{log}.loaded"))]
    for process in (" -m cli run ", " -m uvicorn ", " -m verl_grpo.trainers.trl.worker "):
        assert any(process in f"{argv} " for argv in loaded), f"the recorder did not load in{process}: {loaded}"


def test_the_recorder_catches_a_grandchild_reaching_out(quiet_run, tmp_path):
    """The same environment, a deliberate attempt two processes down: the recorder sees it, so the test above
    can fail."""
    env, log = _user_env(tmp_path)
    child = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {PROBE!r}], check=True)"
    subprocess.run([sys.executable, "-c", child], env=env, check=True, timeout=60)
    caught = {(r["event"], json.dumps(r["target"])) for r in _records(log)}
    assert caught == {("socket.connect", '["10.255.255.1", 9]'), ("socket.getaddrinfo", '"egress-probe.invalid"')}
    assert len(_records(Path(f"{log}.loaded"))) == 2


def test_a_successful_run_prints_no_error_and_no_traceback(quiet_run):
    """Neither the run's own output nor the ephemeral Prefect API's (which goes to its log)."""
    done, tmp, _ = quiet_run
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    outputs = {"stdout+stderr": done.stdout + done.stderr,
               "ephemeral-api.log": (tmp / "state" / "prefect" / "ephemeral-api.log").read_text()}
    for name, text in outputs.items():
        bad = [line for line in text.splitlines() if ERROR_RECORD.search(line) or "Traceback" in line]
        assert not bad, f"{name}:\n" + "\n".join(bad) + "\n\n" + text[-5000:]
    # A library warning the user cannot act on, filtered where the model is logged (registry/versions.py).
    assert "Unable to find license information" not in outputs["stdout+stderr"]
