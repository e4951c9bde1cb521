"""The TRL worker on a hopeless setting (8-token responses: no answer fits, every reward is 0): it warns within
trainer.no_signal_steps steps, naming truncation as the cause, and with stop_on_no_signal fails as a TrainingError."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from tiny_data import write_gsm8k_split

from verl_grpo.config import load_config
from verl_grpo.contracts import Cluster
from verl_grpo.store import Store
from verl_grpo.trainers import get_trainer
from verl_grpo.trainers.exits import EXIT_FAILED
from verl_grpo.trainers.signal import ALL_TIED, CLIPPED_RATIO, TIED_GROUP_SHARE

HOPELESS = [
    "algorithm.max_response_length=8",
    "algorithm.train_batch_size=2",
    "algorithm.rollouts=2",
    "algorithm.total_steps=3",
    "algorithm.save_freq=3",
    "trainer.threads=1",
    "trainer.no_signal_steps=2",
]


def start_hopeless(root: Path, model_dir: Path, mirror: Path, *overrides: str) -> subprocess.Popen:
    store = Store(f"file://{root / 'store'}")
    cfg = load_config(overrides=[f"model.name={model_dir}", f"storage.uri={store.uri}", *HOPELESS, *overrides],
                      env={})
    dataset = write_gsm8k_split(store, mirror, 4, "hopeless")
    cluster = Cluster(provider="local", name="it", workdir=str(root / "work"), on_this_machine=True)
    spec = get_trainer("trl").plan(cfg, dataset, store, "hopeless", cluster)
    env = {**os.environ, **spec.env, "VERL_GRPO_HOME": str(root / "home")}
    return subprocess.Popen(spec.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def hopeless(tmp_path_factory, tiny_model_dir, data_mirror) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """Both runs at once (one thread each): most of a run is importing TRL, which the two share the wait for."""
    roots = {name: tmp_path_factory.mktemp(f"hopeless-{name}") for name in ("warn", "stop")}
    procs = {"warn": start_hopeless(roots["warn"], tiny_model_dir, data_mirror),
             "stop": start_hopeless(roots["stop"], tiny_model_dir, data_mirror, "trainer.stop_on_no_signal=true")}
    out = {}
    for name, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=300)
        finally:
            proc.kill()
        out[name] = roots[name], subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return out


def test_hopeless_run_warns_once_after_the_configured_steps_and_trains_on(hopeless):
    tmp_path, proc = hopeless["warn"]
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    warnings = [i for i, line in enumerate(lines) if line.startswith("warning: no learning signal")]
    steps = {line.split()[1]: i for i, line in enumerate(lines) if line.startswith("step ")}
    assert len(warnings) == 1, proc.stdout[-3000:]
    assert steps["2/3"] < warnings[0] < steps["3/3"], "the warning follows the 2nd no-signal step at once"
    assert "for 2 consecutive steps (steps 1-2)" in lines[warnings[0]]
    assert "responses truncated" in lines[warnings[0]] and "raise algorithm.max_response_length (now 8)" in lines[
        warnings[0]]
    assert "tied=1" in lines[steps["1/3"]] and "clip=" in lines[steps["1/3"]] and "r.correctness=0" in lines[
        steps["1/3"]]

    records = [json.loads(x) for x in (tmp_path / "work" / "metrics.jsonl").read_text().splitlines()]
    assert [r[TIED_GROUP_SHARE] for r in records] == [1.0, 1.0, 1.0]
    assert [r[ALL_TIED] for r in records] == [1.0, 1.0, 1.0]
    assert all(r[CLIPPED_RATIO] >= 0.5 for r in records)


def test_hopeless_run_with_stop_on_no_signal_fails_as_a_training_error(hopeless):
    tmp_path, proc = hopeless["stop"]
    assert proc.returncode == EXIT_FAILED, proc.stderr[-4000:]
    assert [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("step ")] == ["1/3", "2/3"]
    error = json.loads((tmp_path / "work" / "error.json").read_text())
    assert error["type"] == "TrainingError" and error["retryable"] is False
    assert "no learning signal for 2 consecutive steps" in error["message"]
    assert "raise algorithm.max_response_length (now 8)" in error["message"]
    assert "trainer.stop_on_no_signal" in error["message"]
    assert "Traceback" not in proc.stderr
    reported = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert reported == [f"error: TrainingError: {error['message']}"], "one line reaches the user"
    assert not (tmp_path / "work" / "result.json").exists()
