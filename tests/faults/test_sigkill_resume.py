"""SIGKILL the TRL worker at ≥10 seeded random moments across a run; re-running it until done must give the
uninterrupted run's exact steps, prompt order and weights (bit-identical on CPU).

Each kill picks a kind (during start-up and restore, right after one of the next steps' progress lines, i.e.
while HF saves its checkpoint, or right after that checkpoint's commit, i.e. in the next step) and a seeded random
delay. Once the run has reached its last step, kills land in the re-publishing attempt.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time

from faultlib import (
    RUN_ID,
    Worker,
    assert_same_weights,
    final_weights,
    metrics_lines,
    plan_run,
)

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.contracts import TrainResult
from verl_grpo.store import Store

KILLS = 10
TOTAL_STEPS = 6
SEED = 20240611
KINDS = ("startup", "step", "commit")


def _kill_moment(rng: random.Random, committed: int) -> tuple[str, int, float]:
    """Where the next kill lands: `startup` (seconds after exec: imports, restore, model load), or a short
    random delay after the next step's progress line (mid-save) or after its checkpoint's commit line.
    A tiny-model step takes tens of milliseconds, so the delays after a line are that short too."""
    kind = rng.choice(KINDS) if committed < TOTAL_STEPS else "startup"  # a finished run: kill its re-publish
    if kind == "startup":
        return kind, committed + 1, rng.uniform(0.5, 5.0)
    # A kill right after step k's line lands in k's save, so aim up to two steps further to let the run move.
    target = committed + 1 if kind == "commit" else rng.randint(committed + 1, min(TOTAL_STEPS, committed + 3))
    return kind, target, rng.uniform(0.0, 0.05)


def _matcher(kind: str, step: int):
    if kind == "step":
        return lambda line: line.startswith(f"step {step}/")
    return lambda line: line.startswith(f"checkpoint step {step} committed")


def _wait_then_kill(worker: Worker, kind: str, target: int, delay: float) -> int:
    if kind != "startup" and worker.wait_for(_matcher(kind, target)) is None:
        return worker.finish()  # ended before the moment came
    remaining = delay if kind != "startup" else delay - (time.monotonic() - worker.started)
    try:
        worker.proc.wait(timeout=max(0.0, remaining))
    except subprocess.TimeoutExpired:
        pass
    return worker.kill()


def test_random_sigkills_resume_exactly(reference, tmp_path, tiny_model_dir, data_mirror):
    ref_store, ref_metrics = reference
    store = Store(f"file://{tmp_path / 'store'}")
    spec = plan_run(tmp_path / "work", tiny_model_dir, data_mirror, store)
    checkpoints = CheckpointStore(store)
    rng = random.Random(SEED)
    history = []
    committed = 0
    while sum(code == -signal.SIGKILL for _, _, code, _ in history) < KILLS:
        assert len(history) < 3 * KILLS, f"too many attempts finished before their kill: {history}"
        kind, target, delay = _kill_moment(rng, committed)
        code = _wait_then_kill(Worker(spec, tmp_path / "home"), kind, target, delay)
        latest = checkpoints.latest_complete(RUN_ID)
        step = latest.step if latest else 0
        history.append((f"{kind}@{target}" if kind != "startup" else kind, round(delay, 2), code, step))
        assert code in (0, -signal.SIGKILL), history
        assert step >= committed, f"committed progress went backwards: {history}"
        committed = step
        if latest is not None:  # what the next attempt resumes from verifies against its manifest
            checkpoints.restore(latest, tmp_path / "verify" / str(len(history)))

    print("attempts (kill kind, delay s, exit code, committed step after):", history)
    assert len({step for *_, step in history}) >= 3, f"kills spread over the run: {history}"
    final = Worker(spec, tmp_path / "home")
    assert final.finish() == 0, final.output()[-4000:]

    result = TrainResult.model_validate_json(store.read_text("runs", RUN_ID, "train_result.json"))
    assert result.final_step == TOTAL_STEPS and result.checkpoint.step == TOTAL_STEPS
    resumed = metrics_lines(store.read_text("runs", RUN_ID, "metrics.jsonl"))
    assert [m["step"] for m in resumed] == list(range(1, TOTAL_STEPS + 1))
    assert [m["prompt_indices"] for m in resumed] == [m["prompt_indices"] for m in ref_metrics], \
        "no prompt repeated or skipped across the kills"
    assert_same_weights(final_weights(store), final_weights(ref_store))
