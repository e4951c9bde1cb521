"""The S3 endpoint goes away mid-run (the proxy in front of moto stops listening; bucket state is kept).

- Down ~30 s: background uploads retry with backoff, training carries on, nothing is lost.
- Down past the retry budget: the worker fails with a retryable InfraError naming the store and the
  budget; the uncommitted checkpoints stay on local disk and the next attempt commits them first.
"""

from __future__ import annotations

import json
import threading
import time

from faultlib import RUN_ID, Worker, plan_run

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.contracts import TrainResult
from verl_grpo.store import Store

OUTAGE_S = 30


def _logged(line: str, step: int) -> bool:
    """Step `step`'s progress line: printed before its checkpoint is saved, so that upload meets the outage."""
    return line.startswith(f"step {step}/")


def test_outage_within_the_retry_budget_loses_nothing(s3_proxy, tmp_path, tiny_model_dir, data_mirror):
    uri, endpoint, proxy = s3_proxy
    store = Store(uri, endpoint)
    # upload_retries=6, upload_backoff_s=1 (the defaults) wait 1+2+4+8+16 s between attempts: > OUTAGE_S.
    spec = plan_run(tmp_path / "work", tiny_model_dir, data_mirror, store, "algorithm.total_steps=4",
                    "storage.keep_last=10", "storage.upload_retries=6", "storage.upload_backoff_s=1")
    worker = Worker(spec, tmp_path / "home")
    assert worker.wait_for(lambda line: _logged(line, 2)), worker.output()[-3000:]
    proxy.down()
    restore = threading.Timer(OUTAGE_S, proxy.up)
    restore.start()
    try:
        code = worker.finish()
    finally:
        restore.join()
    assert code == 0, worker.output()[-4000:]
    assert "retry" in worker.output(), "uploads hit the outage and were retried"
    checkpoints = CheckpointStore(Store(uri, endpoint))
    assert checkpoints.steps(RUN_ID) == [1, 2, 3, 4]
    assert all(checkpoints.manifest(RUN_ID, s) is not None for s in (1, 2, 3, 4)), "no checkpoint lost"
    result = TrainResult.model_validate_json(store.read_text("runs", RUN_ID, "train_result.json"))
    assert result.final_step == 4 and result.checkpoint.step == 4
    print(f"training waited {result.summary['checkpoint_wait_s']:.1f}s for uploads during the {OUTAGE_S}s outage")
    assert result.summary["checkpoint_wait_s"] > 0, "saves during the outage waited for the retried upload"


def test_outage_past_the_retry_budget_fails_clearly_and_keeps_local_checkpoints(s3_proxy, tmp_path, tiny_model_dir,
                                                                                  data_mirror):
    uri, endpoint, proxy = s3_proxy
    store = Store(uri, endpoint)
    spec = plan_run(tmp_path / "work", tiny_model_dir, data_mirror, store, "algorithm.total_steps=4",
                    "storage.keep_last=10", "storage.upload_retries=2", "storage.upload_backoff_s=0.5")
    worker = Worker(spec, tmp_path / "home")
    assert worker.wait_for(lambda line: _logged(line, 2)), worker.output()[-3000:]
    proxy.down()
    started = time.monotonic()
    code = worker.finish()
    print(f"worker gave up {time.monotonic() - started:.0f}s into the outage")
    assert code == 75, worker.output()[-4000:]
    error = json.loads((tmp_path / "work" / "error.json").read_text())
    assert error["type"] == "InfraError" and error["retryable"] is True
    assert uri in error["message"] and "retry budget" in error["message"]
    assert "storage.upload_retries=2" in error["message"], "names the knob that sets the budget"
    assert "retry budget" in worker.output(), "the log says it too"

    staged = sorted(p.name for p in (tmp_path / "work" / "pending_uploads").glob("global_step_*") if p.is_dir())
    assert staged, "the checkpoints the store did not take are kept on local disk"
    assert all((tmp_path / "work" / "pending_uploads" / name / "model.safetensors").is_file() for name in staged)
    assert str(tmp_path / "work" / "pending_uploads") in error["message"], "the error says where they are"

    # The store is back: the retried attempt commits what was staged, then resumes after it.
    proxy.up()
    retry = Worker(spec, tmp_path / "home")
    assert retry.finish() == 0, retry.output()[-4000:]
    newest_staged = max(int(name.rsplit("_", 1)[1]) for name in staged)
    assert f"resuming run {RUN_ID} from checkpoint step {newest_staged}" in retry.output()
    checkpoints = CheckpointStore(store)
    assert checkpoints.steps(RUN_ID) == [1, 2, 3, 4]
    assert all(checkpoints.manifest(RUN_ID, s) is not None for s in (1, 2, 3, 4))
    assert not list((tmp_path / "work" / "pending_uploads").glob("global_step_*"))
