"""Killing `verl-grpo run` during training and running it again resumes from the last checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prefect_template import seed_prefect_home

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.config import load_config
from verl_grpo.store import Store

pytestmark = pytest.mark.e2e
STEPS = 30


def _cli(overrides: list[str], env: dict, log: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "verl_grpo_cli", "run", "-c", "gsm8k"]
    for o in overrides:
        args += ["-o", o]
    return subprocess.Popen(args, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)


def test_kill_and_rerun_resumes(tiny_overrides, tmp_path):
    overrides = [o for o in tiny_overrides if not o.startswith(("algorithm.total_steps", "algorithm.save_freq"))]
    # A tiny step takes a fraction of a second: enough steps that the kill lands mid-training.
    overrides += [f"algorithm.total_steps={STEPS}", "algorithm.save_freq=2"]
    cfg = load_config(["gsm8k"], overrides)
    store = Store.from_config(cfg.storage)
    ckpts = CheckpointStore(store)
    env = {**os.environ, "PREFECT_HOME": str(seed_prefect_home(tmp_path / "prefect")), "PYTHONUNBUFFERED": "1"}
    env.pop("PREFECT_API_URL", None)

    first = _cli(overrides, env, tmp_path / "first.log")
    run_id = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and first.poll() is None:
        run_ids = store.listdir("runs")
        if run_ids and ckpts.latest_complete(run_ids[0]) is not None:
            run_id = run_ids[0]
            break
        time.sleep(0.1)
    assert run_id, f"no checkpoint appeared; log:\n{(tmp_path / 'first.log').read_text()[-3000:]}"
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    killed_at = ckpts.latest_complete(run_id).step
    assert killed_at < STEPS

    second = _cli(overrides, env, tmp_path / "second.log")
    assert second.wait(timeout=900) == 0, (tmp_path / "second.log").read_text()[-5000:]
    log = (tmp_path / "second.log").read_text()
    assert f"resuming run {run_id} from checkpoint step {killed_at}" in log
    assert store.listdir("runs") == [run_id]  # the same run, not a new one
    assert ckpts.latest_complete(run_id).step == STEPS
    steps = [json.loads(line)["step"] for line in store.read_text("runs", run_id, "metrics.jsonl").splitlines()]
    assert steps == list(range(1, STEPS + 1))  # every step exactly once across both attempts
