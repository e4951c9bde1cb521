"""The cloud path end to end on the local rehearsal of SkyPilot: the real Prefect flow with infra.provider=skypilot
(a provider built fresh for every call, as `get_provider` builds them), the verl backend (main_ppo stood in on the
CPU), injected preemptions and user-code failures.

Checked: the step count, that no prompt is repeated or skipped across recoveries, that the registered model is the
finalized one, that a user-code failure is neither recovered as a preemption nor retried by the flow, and that no
process of the rehearsal is left.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from prefect_template import seed_prefect_home, seeded_test_harness

from verl_grpo.config import load_config
from verl_grpo.store import Store
from verl_grpo_rehearsal import sky_boundary
from verl_grpo_rehearsal.session import rehearsal_session

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CONFIGS = ["gsm8k", "local"]
SMALL = ["algorithm.total_steps=6", "algorithm.save_freq=2", "algorithm.max_response_length=16",
         "algorithm.train_batch_size=2", "algorithm.rollouts=2", "eval.limit=4", "eval.batch_size=4",
         "eval.max_new_tokens=16", "warm_start.enabled=false"]
PROMPTS = re.compile(r"^rehearsal: step (\d+) prompts (.*)$")
STARTS = re.compile(r"^(?:restored checkpoint step (\d+) of run|no committed checkpoint of run)")


def attempts_of(log_lines: list[str]) -> list[dict[int, str]]:
    """The trainer's log split at each (re)start: per attempt, step → the prompts it trained on."""
    attempts: list[dict[int, str]] = []
    for line in log_lines:
        if STARTS.match(line):
            attempts.append({})
        elif (m := PROMPTS.match(line)) and attempts:
            attempts[-1][int(m[1])] = m[2]
    return attempts


def no_rehearsal_process_left(root: Path) -> None:
    left = subprocess.run(["pgrep", "-af", str(root)], capture_output=True, text=True).stdout.strip()
    assert not left, f"rehearsal processes left:\n{left}"


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.suffix in (".safetensors", ".json")
            and p.name in ("model.safetensors", "config.json")}


def test_job_group_survives_two_preemptions_and_a_restarted_bug(tiny_model_dir, tmp_path):
    overrides = [f"model.name={tiny_model_dir}", *SMALL, "trainer.backend=verl", "infra.provider=skypilot",
                 "skypilot.shape=job_group", "skypilot.max_restarts_on_errors=1", "skypilot.termination_delay=2s"]
    cfg = load_config(CONFIGS, overrides)
    with seeded_test_harness(), \
            rehearsal_session(cfg, preempt_at=(2, 4), fail_at=6, root=tmp_path / "rehearsal") as session:
        from verl_grpo_flows.verl_grpo import verl_grpo

        run_overrides = [*overrides, *session.overrides]
        summary = verl_grpo(config=CONFIGS, overrides=run_overrides)
        store = Store.from_config(load_config(CONFIGS, run_overrides).storage)

        train_job = next(j for j in map(sky_boundary.summary, (r.job_id for r in sky_boundary.queue()))
                         if not j["name"].endswith("-eval"))
        events = [e["event"] for e in train_job["events"]]
        assert train_job["status"] == "SUCCEEDED" and train_job["tasks"]["reward-server"] == "CANCELLED"
        assert events.count("preempted") == 2 and events.count("restarted_after_error") == 1
        assert train_job["recovery_count"] == 3  # SkyPilot counts preemptions and restarts on errors alike
        assert summary["steps"] == 6

        # Every (re)start resumed right after the step the store had committed; the prompts of a step are the
        # same in every attempt that trained it, and the final timeline trains each prompt once.
        log = (Path(train_job["job_dir"]) / "run.log").read_text().splitlines()
        attempts = attempts_of(log)
        assert len(attempts) == 4
        restored = [int(m[1]) if m[1] else 0 for line in log if (m := STARTS.match(line))]
        assert restored[0] == 0 and all(r > 0 for r in restored[1:])
        timeline: dict[int, str] = {}
        for start, steps in zip(restored, attempts):
            assert min(steps, default=start + 1) == start + 1
            for step, prompts in steps.items():
                assert timeline.setdefault(step, prompts) == prompts
        assert sorted(timeline) == list(range(1, 7))
        trained = [p for step in sorted(timeline) for p in timeline[step].split(",")]
        assert len(trained) == len(set(trained)) == 6 * 2

        # The registered model is the one finalize merged and published.
        import mlflow

        mlflow.set_tracking_uri(load_config(CONFIGS, run_overrides).tracking.mlflow_uri)
        registered = Path(mlflow.artifacts.download_artifacts(
            artifact_uri=f"models:/{cfg.registered_model_name}/1", dst_path=str(tmp_path / "registered")))
        published = store.get_dir(tmp_path / "published", "runs", summary["run_id"], "model")
        finalized = next(line for line in log if line.startswith("training done: step 6, model at "))
        assert finalized.endswith(summary["model_uri"])
        digests = tree_digest(published)
        assert digests and any(tree_digest(p.parent) == digests for p in registered.rglob("config.json"))
    no_rehearsal_process_left(tmp_path / "rehearsal")


def test_a_user_code_failure_fails_the_launch_once_without_retries(tiny_model_dir, tmp_path):
    env = {**os.environ, "VERL_GRPO_HOME": str(tmp_path / "home"),
           "PREFECT_HOME": str(seed_prefect_home(tmp_path / "prefect"))}
    env.pop("PREFECT_API_URL", None)
    cmd = [sys.executable, "-m", "verl_grpo_cli", "launch", *(a for c in CONFIGS for a in ("-c", c)),
           *(a for o in [f"model.name={tiny_model_dir}", *SMALL, "skypilot.max_restarts_on_errors=0"]
             for a in ("-o", o)), "--rehearse", "--fail-at", "2"]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    assert "error (TrainingError)" in out and "FAILED: the job's command" in out
    report = out[out.index("Rehearsal of the SkyPilot launch"):]
    jobs = re.findall(r"^  job \d+ ", report, flags=re.MULTILINE)  # the report's job lines, not streamed logs
    assert len(jobs) == 1, report  # one launch: the flow did not retry a code failure
    assert "ended FAILED" in report and "preempted" not in report and "RECOVERING" not in report
    assert "nothing registered" in report
    no_rehearsal_process_left(tmp_path / "home")
