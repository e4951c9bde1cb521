"""`verl-grpo run ... trainer.backend=loop`: two rollout servers, the router, data-server, reward-server and replay
buffer as separate processes; the trainer is SIGKILLed mid-run and the run resumes.

Checked on the run's committed metrics: every server's policy version rises with each push, replayed groups are
trained at the configured share, no trained sample is staler than the bound, and across the kill no prompt is lost
(the fresh prompts are the data-server's order without a gap) or trained more often than 1 + max_replays.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from prefect_template import seed_prefect_home

from verl_grpo.local_paths import state_dir
from verl_grpo.store import Store

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # ~3 min: two CLI attempts, 12 loop steps, eval
STEPS, SAVE_FREQ, MAX_STALENESS, MAX_REPLAYS = 12, 3, 3, 1
KILL_AFTER_STEP = 5  # between the checkpoints of steps 3 and 6: steps 4-5 and their in-flight prompts are redone


def _cli(overrides: list[str], env: dict, log: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "verl_grpo_cli", "run", "-c", "gsm8k", "-c", "local"]
    for o in overrides:
        args += ["-o", o]
    return subprocess.Popen(args, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for_line(path: Path, pattern: str, proc: subprocess.Popen, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if path.is_file() and re.search(pattern, path.read_text(errors="replace"), re.M):
            return
        time.sleep(0.1)
    raise AssertionError(f"{pattern!r} never appeared in {path}")


def test_loop_run_survives_a_trainer_sigkill(tiny_overrides, tmp_path):
    overrides = [o for o in tiny_overrides if not o.startswith(("algorithm.total_steps", "algorithm.save_freq"))]
    overrides += [f"algorithm.total_steps={STEPS}", f"algorithm.save_freq={SAVE_FREQ}", "trainer.backend=loop",
                  "async_training.rollout_servers=2", "async_training.replay_share=0.5",
                  f"async_training.max_staleness={MAX_STALENESS}", f"async_training.max_replays={MAX_REPLAYS}",
                  "async_training.trigger_parameter_sync_step=1", "services.termination_delay_s=0"]
    env = {**os.environ, "PREFECT_HOME": str(seed_prefect_home(tmp_path / "prefect")), "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1"}
    env.pop("PREFECT_API_URL", None)
    store = Store(next(o for o in overrides if o.startswith("storage.uri=")).split("=", 1)[1])

    first = _cli(overrides, env, tmp_path / "first.log")
    work = state_dir() / "work"
    deadline = time.monotonic() + 600  # a bound for a hang, beside other xdist workers
    while time.monotonic() < deadline and not list(work.glob("*/job.json")):
        time.sleep(0.2)
    job_file = next(iter(work.glob("*/job.json")), None)
    assert job_file is not None, (tmp_path / "first.log").read_text()[-3000:]
    train_log = job_file.parent / "train.log"
    _wait_for_line(train_log, rf"^step {KILL_AFTER_STEP}/{STEPS} ", first)
    os.kill(json.loads(job_file.read_text())["pid"], signal.SIGKILL)  # the trainer only: services stay up
    logs = [tmp_path / "first.log"]
    if first.wait(timeout=900) != 0:  # the pipeline did not retry the preempted job itself: run the CLI again
        logs.append(tmp_path / "second.log")
        assert _cli(overrides, env, logs[-1]).wait(timeout=900) == 0, logs[-1].read_text()[-5000:]
    out = logs[-1].read_text()
    run_id = job_file.parent.name
    assert re.search(rf"resuming run {run_id} from checkpoint step {SAVE_FREQ}\b", train_log.read_text())

    # The CLI prints the loop's facts.
    assert re.search(rf"policy versions\s+trainer v{STEPS}; server_0 v{STEPS}, server_1 v{STEPS}", out), out[-3000:]
    assert re.search(r"replay share\s+0\.\d+ of trained groups", out)
    assert (m := re.search(r"largest staleness (\d+) policy version", out)) and int(m[1]) <= MAX_STALENESS

    records = [json.loads(line) for line in store.read_text("runs", run_id, "metrics.jsonl").splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for server in ("policy_version/server_0", "policy_version/server_1"):  # one push per step, to every server
        assert [r[server] for r in records] == list(range(1, STEPS + 1))
    assert all(r["staleness/max"] <= MAX_STALENESS for r in records)
    # One of the two groups of every step after the first (the buffer is empty before it) is replayed.
    assert [r["replay/groups"] for r in records] == [0] + [1] * (STEPS - 1)
    assert [r["fresh/groups"] + r["replay/groups"] for r in records] == [2] * STEPS

    # Samples: every step's first rollouts (whole groups), with the policy version and source that made them; steps
    # before the kill come back from the checkpoint of step 3.
    samples = [json.loads(line) for line in store.read_text("runs", run_id, "samples.jsonl").splitlines()]
    assert [r["step"] for r in samples] == list(range(1, STEPS + 1))
    for record in samples:
        assert len(record["samples"]) == 4 and all(s["response"] and s["prompt"] for s in record["samples"])
        assert all(s["source"] in ("fresh", "replay") and s["policy_version"] <= record["step"]
                   for s in record["samples"])
        assert all(s["components"] and "correctness" in s["components"] for s in record["samples"])
    fresh = [pid for r in records for pid in r["fresh_prompt_ids"] + r["dropped_prompt_ids"]]
    assert fresh == [f"0:{i}" for i in range(len(fresh))], "fresh prompts in data-server order, none lost"
    uses = Counter(pid for r in records for pid in r["fresh_prompt_ids"] + r["replayed_prompt_ids"])
    assert max(uses.values()) <= 1 + MAX_REPLAYS
    first_fresh = {pid: i for i, r in enumerate(records) for pid in r["fresh_prompt_ids"]}
    assert all(first_fresh[pid] < i for i, r in enumerate(records) for pid in r["replayed_prompt_ids"]), \
        "only prompts already trained fresh are replayed"
    rollout_logs = list((job_file.parent / "rollout").glob("*.log"))
    assert len(rollout_logs) == 3, rollout_logs  # two servers and the router
