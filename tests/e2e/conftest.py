from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import loopback_only
import pytest
from checkout_files import checkout_status
from user_env import user_env

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent

# A whole-flow run on the tiny model: small enough for CI, big enough to checkpoint twice.
TINY_RUN = [
    "model.name=tiny",
    "algorithm.total_steps=4",
    "algorithm.save_freq=2",
    "algorithm.train_batch_size=2",
    "algorithm.rollouts=2",
    "algorithm.max_response_length=16",
    "algorithm.lr=1e-4",
    "trainer.threads=1",
    "eval.limit=8",
    "eval.batch_size=8",
    "eval.max_new_tokens=16",
    "warm_start.enabled=false",  # the local profile's SFT phase; tests/integration/test_trl_training.py covers it
]


@pytest.fixture
def tiny_overrides(tmp_path, tiny_model_dir):
    return [
        *TINY_RUN,
        f"model.name={tiny_model_dir}",
        f"storage.uri=file://{tmp_path / 'store'}",
        f"tracking.mlflow_uri=sqlite:///{tmp_path / 'mlflow.db'}",
    ]


@pytest.fixture(scope="session")
def tiny_run() -> list[str]:
    """TINY_RUN for a fixture wider than one test (one run whose output several tests check)."""
    return list(TINY_RUN)


@dataclass
class FirstRun:
    """What `first_cli_run` leaves for the tests that read it."""

    done: subprocess.CompletedProcess
    cwd: Path
    """The empty directory it was started from."""
    home: Path
    state: Path
    """VERL_GRPO_HOME: a nested directory that did not exist before."""
    egress_log: Path
    checkout_before: list[str]
    """The checkout's untracked and ignored files just before the run (`checkout_status`)."""


@pytest.fixture(scope="session")
def first_cli_run(tmp_path_factory, tiny_run) -> FirstRun:
    """A new user's first `verl-grpo run`, run once and read by the fresh-state, clean-checkout and quiet-run tests.

    The README's first command, `make run`: the command line the Makefile runs for it (on the tiny model), in a child
    process started from an empty directory, in a user's environment (`user_env`). HOME and VERL_GRPO_HOME (nested)
    do not exist yet; store, MLflow and model cache at their defaults, so the tiny model is built inside the new state
    dir; the data mirror beside the checkout, as a user's shell would have it. The egress recorder
    (tests/loopback_only.py) loads in every Python process of the run. (`.ci/run` runs no `make run` of its own: this
    is it.)"""
    tmp = tmp_path_factory.mktemp("first-run")
    cwd, home, state = tmp / "cwd", tmp / "home", tmp / "a" / "new" / "nested" / "state"
    cwd.mkdir()
    env = user_env(HOME=str(home), PYTHONUNBUFFERED="1", VERL_GRPO_HOME=str(state), VERL_GRPO_DATA_MIRROR=os.environ.get(
        "VERL_GRPO_DATA_MIRROR", str(REPO.parent / "shared" / "data")))
    env, egress_log = loopback_only.subprocess_env(tmp, env)
    # model.name=tiny: built in the new state dir's model cache
    args = make_run_command([a for override in tiny_run for a in ("-o", override)])
    before = checkout_status()
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    return FirstRun(done=done, cwd=cwd, home=home, state=state, egress_log=egress_log, checkout_before=before)


def make_run_command(run_args: list[str]) -> list[str]:
    """The command `make run RUN_ARGS=...` runs, as `make -n` prints it for this venv, to run from any directory."""
    printed = subprocess.run(["make", "-s", "-n", "run", f"VENV={VENV_BIN.parent}", f"RUN_ARGS={shlex.join(run_args)}"],
                             cwd=REPO, capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    command = shlex.split(printed[-1])
    assert command[:2] == [str(VENV_BIN / "verl-grpo"), "run"], printed
    return command
