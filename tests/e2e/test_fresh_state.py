"""`verl-grpo run` as a new user's first command: no state dir, no ~/.prefect, no Prefect settings.

Each test runs the installed CLI in a child process with a HOME and VERL_GRPO_HOME that do not exist yet,
as `make run` does on a fresh clone; the failure cases must end in one line, the trace going to a log.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

VENV_BIN = Path(sys.executable).parent


def _fresh_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFECT_") and k not in ("VERL_GRPO_MODEL_CACHE", "VERL_GRPO_HOME")}
    env.update(HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1", **extra)
    return env


def _run(env: dict[str, str], *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess:
    args = [str(VENV_BIN / "verl-grpo"), "run", "-c", "gsm8k", "-c", "local"]
    for override in overrides:
        args += ["-o", override]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)


def test_first_run_creates_the_state_dir_and_finishes(first_cli_run):
    """Store, MLflow and model cache all at their defaults inside the new state dir; the tiny model built there
    (the run is `first_cli_run`, which the clean-checkout and quiet-run tests read too)."""
    done, home = first_cli_run.done, first_cli_run.state
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    assert "eval accuracy" in done.stdout
    assert "Traceback" not in output
    for sub in ("prefect", "store", "models", "work", "logs"):
        assert (home / sub).is_dir(), sub
    assert (home / "models" / "tiny").is_dir()
    assert (home / "prefect" / "prefect.db").is_file()  # the ephemeral API's database, in the new state dir
    assert (home / "mlflow.db").is_file()
    assert not (first_cli_run.home / ".prefect").exists()
    # No Prefect UI serves an ephemeral API's runs: the MLflow run links none (Prefect's ui_url reads "None/...")
    with sqlite3.connect(home / "mlflow.db") as db:
        tags = dict(db.execute("SELECT key, value FROM tags WHERE key LIKE 'prefect.%'").fetchall())
    assert tags.get("prefect.flow_run_id") and tags.get("prefect.flow_run_url") == "", tags


def test_state_dir_that_cannot_be_made_is_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = _run(_fresh_env(tmp_path, VERL_GRPO_HOME=str(blocker / "state")), "model.name=tiny", timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "VERL_GRPO_HOME" in done.stderr and str(blocker / "state") in done.stderr


def test_ephemeral_api_failure_is_one_line_with_the_trace_in_a_log(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    home = tmp_path / "state"
    env = _fresh_env(tmp_path, VERL_GRPO_HOME=str(home),
                     PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{blocker}/prefect.db",
                     PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="30")  # time to import and die, under load
    done = _run(env, "model.name=tiny", timeout=180)
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1, done.stderr
    log = home / "prefect" / "ephemeral-api.log"
    assert "ephemeral API did not start" in errors[0] and str(blocker) in errors[0] and str(log) in errors[0]
    assert "unable to open database file" in errors[0]
    assert "Traceback" in log.read_text()
