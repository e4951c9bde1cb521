"""Kills and failures in the middle of checkpoint uploads never leave a checkpoint that resume would read torn.

- A process running `CheckpointStore.save` against S3 (moto behind a proxy) is SIGKILLed when a seeded
  random number of upload bytes has passed: inside a multipart part, between files, around the manifest.
- A store whose uploads fail at a random file raises, and nothing of that step counts as committed.
- The TRL worker on S3 is SIGKILLed inside its background uploads; re-running it ends with the
  uninterrupted run's weights.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from faultlib import (
    RUN_ID,
    Worker,
    assert_same_weights,
    final_weights,
    metrics_lines,
    plan_run,
)

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.errors import InfraError
from verl_grpo.store import Store
from verl_grpo.store_layout import CHECKPOINT_MANIFEST as MANIFEST

SAVE_SCRIPT = """
import sys
from pathlib import Path
from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.store import Store
uri, endpoint, step, src = sys.argv[1:]
store = CheckpointStore(Store(uri, endpoint), part_size=5 << 20, part_concurrency=2, backoff_s=0.1)
print("saving", flush=True)
store.save("killed", int(step), Path(src), {"step": int(step)})
print("committed", flush=True)
"""


def _checkpoint_dir(root: Path, step: int) -> Path:
    """12 MiB of weights (a 3-part multipart upload), 3 MiB of optimizer state, small JSON files."""
    rng = random.Random(step)
    d = root / f"step-{step}"
    (d / "extra").mkdir(parents=True)
    (d / "model.safetensors").write_bytes(rng.randbytes(12 << 20))
    (d / "optimizer.pt").write_bytes(rng.randbytes(3 << 20))
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (d / "extra" / "rng_state.pth").write_bytes(rng.randbytes(2048))
    return d


def _save_in_process_killed_at(uri: str, endpoint: str, proxy, step: int, src: Path, kill_after: int) -> int:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SAVE_SCRIPT, uri, endpoint, str(step), str(src)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    start = proxy.upstream_bytes
    fired = threading.Event()

    def maybe_kill(total: int) -> None:
        if total - start >= kill_after and not fired.is_set():
            fired.set()
            proc.send_signal(signal.SIGKILL)

    proxy.on_upstream = maybe_kill
    try:
        proc.wait(timeout=120)
    finally:
        proxy.on_upstream = None
    return proc.returncode


def test_sigkill_at_random_upload_bytes_never_commits_a_torn_checkpoint(s3_proxy, tmp_path):
    uri, endpoint, proxy = s3_proxy
    checkpoints = CheckpointStore(Store(uri, endpoint), backoff_s=0.1)
    total = sum(f.stat().st_size for f in _checkpoint_dir(tmp_path / "size", 0).rglob("*") if f.is_file())
    rng = random.Random(7)
    outcomes = []
    committed_steps = []
    for step in range(1, 11):
        src = _checkpoint_dir(tmp_path, step)
        # Mostly inside the data; a few thresholds past it land on the manifest or after the commit.
        kill_after = rng.randint(1, int(total * 1.02))
        code = _save_in_process_killed_at(uri, endpoint, proxy, step, src, kill_after)
        outcomes.append((step, kill_after, code))
        if code == 0:
            committed_steps.append(step)
        latest = checkpoints.latest_complete("killed")
        assert (latest.step if latest else None) == (committed_steps[-1] if committed_steps else None), outcomes
        for s in checkpoints.steps("killed"):
            manifest = checkpoints.manifest("killed", s)
            assert (manifest is not None) == (s in committed_steps), f"step {s} manifest vs commit: {outcomes}"
    print("upload kills (step, kill after bytes, exit code):", outcomes, "of", total, "bytes")
    assert sum(code == -signal.SIGKILL for _, _, code in outcomes) >= 8, outcomes

    # Resume: the newest complete checkpoint restores with every hash verified; a new save commits.
    if committed_steps:
        restored = tmp_path / "restored"
        checkpoints.restore(checkpoints.latest_complete("killed"), restored)
        src = tmp_path / f"step-{committed_steps[-1]}"
        assert (restored / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert checkpoints.save("killed", 11, _checkpoint_dir(tmp_path, 11)).step == 11
    assert checkpoints.latest_complete("killed").step == 11


class FailingStore(CheckpointStore):
    """A store whose upload of one chosen file fails every time (a disk or network fault mid-checkpoint)."""

    def __init__(self, *args, fail_on: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_on = fail_on

    def _put(self, local: Path, *parts: str) -> None:
        if local.name == self.fail_on:
            raise OSError(f"injected I/O error writing {local.name}")
        super()._put(local, *parts)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_failure_at_a_random_file_commits_nothing(tmp_path, seed):
    store = Store(f"file://{tmp_path / 'store'}")
    CheckpointStore(store).save("r", 1, _checkpoint_dir(tmp_path / "a", 1))
    src = _checkpoint_dir(tmp_path / "b", 2)
    victim = random.Random(seed).choice(sorted(p.name for p in src.rglob("*") if p.is_file()))
    failing = FailingStore(store, retries=2, backoff_s=0.01, fail_on=victim)
    with pytest.raises(InfraError, match="retry budget") as err:
        failing.save("r", 2, src)
    assert victim in str(err.value) and str(src) in str(err.value), "names the file and where it is kept"
    assert not store.exists("runs/r/checkpoints/global_step_2", MANIFEST)
    assert CheckpointStore(store).latest_complete("r").step == 1
    assert src.is_dir(), "the local copy is kept"


def test_worker_killed_inside_background_uploads_resumes_exactly(reference, s3_proxy, tmp_path, tiny_model_dir,
                                                                  data_mirror):
    ref_store, ref_metrics = reference
    uri, endpoint, proxy = s3_proxy
    store = Store(uri, endpoint)
    spec = plan_run(tmp_path / "work", tiny_model_dir, data_mirror, store)
    proxy.rate_bytes_per_s = 4 << 20  # ~1 s per tiny-model checkpoint: uploads overlap the next steps
    rng = random.Random(11)
    kills = []
    for _ in range(2):
        worker = Worker(spec, tmp_path / "home")
        worker.wait_for(lambda line: line.startswith("step "))  # training runs; its uploads start now
        start = proxy.upstream_bytes
        kill_after = rng.randint(1, 3 << 20)
        fired = threading.Event()

        def maybe_kill(total: int, worker=worker, start=start, kill_after=kill_after, fired=fired) -> None:
            if total - start >= kill_after and not fired.is_set():
                fired.set()
                worker.proc.send_signal(signal.SIGKILL)

        proxy.on_upstream = maybe_kill
        code = worker.finish()
        proxy.on_upstream = None
        latest = CheckpointStore(store).latest_complete(RUN_ID)
        kills.append((kill_after, code, latest.step if latest else None))
    print("worker kills inside uploads (after bytes, exit code, committed step):", kills)
    assert any(code == -signal.SIGKILL for _, code, _ in kills)

    proxy.rate_bytes_per_s = None
    final = Worker(spec, tmp_path / "home")
    assert final.finish() == 0, final.output()[-4000:]
    resumed = metrics_lines(store.read_text("runs", RUN_ID, "metrics.jsonl"))
    assert [m["prompt_indices"] for m in resumed] == [m["prompt_indices"] for m in ref_metrics]
    assert_same_weights(final_weights(store), final_weights(ref_store))
