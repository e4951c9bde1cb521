"""The end of a loop run: the final model, metrics and TrainResult to the store, with the loop's summary facts."""

from __future__ import annotations

import json
from typing import Any

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.contracts import CheckpointRef, TrainResult
from verl_grpo.store_layout import model_dir, train_result
from verl_grpo.trainers.atomic_files import write_json_atomic
from verl_grpo.trainers.exits import RESULT_FILE
from verl_grpo.trainers.loop.batch import LoopState
from verl_grpo.trainers.run_summary import SummaryNames, summarize
from verl_grpo.trainers.signal import MEAN_LENGTH
from verl_grpo.trainers.worker.metrics import WorkerLogs
from verl_grpo.trainers.worker.spec import WorkerSpec

SUMMARY = SummaryNames(
    final={"reward": "final_reward", "reward_std": "final_reward_std", "loss": "final_loss",
           MEAN_LENGTH: "final_completions/mean_length"},
    reward="reward",
)


FINAL_MODEL_DIR = "final_model"
"""The worker directory's subdirectory the final model is saved into before its upload."""


def publish(spec: WorkerSpec, checkpoints: CheckpointStore, logs: WorkerLogs, state: LoopState,
            last_ref: CheckpointRef | None, servers: dict[str, int],
            warm_summary: dict[str, float] | None = None) -> TrainResult:
    """Upload the final model (saved in the worker directory's FINAL_MODEL_DIR), the metrics and samples, and write the
    run's TrainResult to the store and the worker directory."""
    store, final_dir = spec.store, spec.workdir / FINAL_MODEL_DIR
    retrying = checkpoints.retrying
    retrying("remove the previous model", lambda: store.rm(model_dir(spec.run_id)))
    model_uri = retrying("upload the final model", lambda: store.put_dir(final_dir, model_dir(spec.run_id)))
    metrics_uri = logs.publish(store, spec.run_id, retrying)
    records = logs.metrics.records()
    summary = summarize(records, SUMMARY)
    summary.update(loop_summary(state, records, servers))
    summary.update(warm_summary or {})
    result = TrainResult(run_id=spec.run_id, final_step=state.step,
                         checkpoint=last_ref or checkpoints.latest_complete(spec.run_id), model_uri=model_uri,
                         metrics_uri=metrics_uri, summary=summary)
    retrying("write train_result.json",
             lambda: store.write_text(result.model_dump_json(indent=1), train_result(spec.run_id)))
    write_json_atomic(spec.workdir / RESULT_FILE, json.loads(result.model_dump_json()))
    print(f"training done: step {state.step}, policy version {state.policy_version}, replay share "
          f"{state.replay_share:.3f}, largest staleness {state.max_staleness_seen}, model at {model_uri}", flush=True)
    return result


def loop_summary(state: LoopState, records: list[dict[str, Any]], servers: dict[str, int]) -> dict[str, float]:
    """The loop's run facts for TrainResult.summary: policy versions (the trainer's and each server's last answer),
    the share of trained groups that came from the replay buffer, the largest staleness trained and drops."""
    out = {"policy_version": float(state.policy_version), "replay_share": state.replay_share,
           "max_staleness": float(state.max_staleness_seen), "dropped_stale": float(state.dropped_stale_total)}
    last = records[-1] if records else {}
    for key, value in last.items():
        if key.startswith("policy_version/server_") and isinstance(value, (int, float)):
            out[key] = float(value)
    for i, version in enumerate(servers.values()):
        out[f"policy_version/server_{i}"] = float(version)
    for name in ("rollout_wait", "generate", "reward", "replay", "update", "weight_push"):
        values = [r[f"time/{name}"] for r in records if isinstance(r.get(f"time/{name}"), (int, float))]
        if values:
            out[f"mean_time/{name}"] = sum(values) / len(values)
    return out
