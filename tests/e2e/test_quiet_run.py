"""A successful `verl-grpo run` is quiet: no connection leaves the machine, and no ERROR or traceback is printed.

One tiny-model run through the installed CLI in a child process, in a user's environment (`first_cli_run`: none of
the switches the product sets, no CI or pytest markers: MLflow and Prefect stay quiet in CI on their own, which would
hide a missing switch). `tests/egress_hook/sitecustomize.py` (tests/loopback_only.py), first on PYTHONPATH, loads in
every Python process of the run (the CLI, Prefect's ephemeral API server, the trainer worker, anything they start) and
records each attempt to
reach an address outside 127.0.0.0/8 and ::1, or to look up a name that is not localhost.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import loopback_only
import pytest
from user_env import user_env

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "infra" / "prefect"))
from check_server import without_transient_errors  # noqa: E402

pytestmark = pytest.mark.e2e

ERROR_RECORD = re.compile(r"(^|\s)(ERROR|CRITICAL)(\s|:|$)")
PROBE = """
import socket, subprocess, sys
s = socket.socket(); s.settimeout(0.2); s.connect_ex(("10.255.255.1", 9)); s.close()
try:
    socket.getaddrinfo("egress-probe.invalid", 80)
except OSError:
    pass
"""


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_no_connection_leaves_the_machine(first_cli_run):
    done, log = first_cli_run.done, first_cli_run.egress_log
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    attempts = _records(log)
    assert not attempts, "\n\n".join(f"pid {a['pid']} {a['argv'][:3]}: {a['event']} {a['target']}\n{a['stack']}"
                                     for a in attempts)
    loaded = [" ".join(r["orig_argv"]) for r in _records(Path(f"{log}.loaded"))]
    for process in ("/verl-grpo run ", " -m uvicorn ", " -m verl_grpo.trainers.trl.worker "):
        assert any(process in f"{argv} " for argv in loaded), f"the recorder did not load in{process}: {loaded}"


def test_the_recorder_catches_a_grandchild_reaching_out(tmp_path):
    """The same environment, a deliberate attempt two processes down: the recorder sees it, so the test above
    can fail."""
    env, log = loopback_only.subprocess_env(tmp_path, user_env(HOME=str(tmp_path / "home")))
    child = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {PROBE!r}], check=True)"
    subprocess.run([sys.executable, "-c", child], env=env, check=True, timeout=60)
    caught = {(r["event"], json.dumps(r["target"])) for r in _records(log)}
    assert caught == {("socket.connect", '["10.255.255.1", 9]'), ("socket.getaddrinfo", '"egress-probe.invalid"')}
    assert len(_records(Path(f"{log}.loaded"))) == 2


def test_a_successful_run_prints_no_error_and_no_traceback(first_cli_run):
    """Neither the run's own output nor the ephemeral Prefect API's (which goes to its log)."""
    done, state = first_cli_run.done, first_cli_run.state
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    outputs = {"stdout+stderr": done.stdout + done.stderr,
               # less the ERROR records of SQLite lock contention, which Prefect's services retry by themselves
               # (as `make serve`'s check only warns of them): a service's periodic write can meet the run's own
               "ephemeral-api.log": without_transient_errors((state / "prefect" / "ephemeral-api.log").read_text())}
    for name, text in outputs.items():
        bad = [line for line in text.splitlines() if ERROR_RECORD.search(line) or "Traceback" in line]
        assert not bad, f"{name}:\n" + "\n".join(bad) + "\n\n" + text[-5000:]
    # A library warning the user cannot act on, filtered where the model is logged (registry/versions.py).
    assert "Unable to find license information" not in outputs["stdout+stderr"]

