"""What the flow shows and records besides the pipeline: artifact contents, the crash hook."""

from __future__ import annotations

from types import SimpleNamespace
from uuid import uuid4

from verl_grpo import runs
from verl_grpo.comparison import eval_table
from verl_grpo.config import load_config
from verl_grpo.contracts import EvalReport
from verl_grpo.store import Store
from verl_grpo.trainers.protocol import TrainProgress
from verl_grpo_flows.hooks import record_crash
from verl_grpo_tasks.progress import rewards_markdown
from verl_grpo_tasks.reporting import mlflow_local_note, mlflow_run_url, summary_key


def test_rewards_markdown_keeps_the_latest_rows():
    history = [TrainProgress(s, 60, s / 100, {"loss": 0.5}) for s in range(1, 61)]
    md = rewards_markdown("run-1", history)
    assert "Last 50 of 60 steps." in md
    assert "| 60/60 | 0.6 |  |  |  | 0.5 |" in md and "| 10/60 |" not in md


def test_rewards_markdown_shows_the_signal_figures_of_either_backend():
    trl = {"signal/tied_group_share": 0.5, "rewards/correctness/mean": 0.25, "rewards/thinking/mean": 1.0,
           "completions/mean_length": 37.0, "completions/clipped_ratio": 0.125, "loss": 0.01}
    history = [TrainProgress(1, 4, 0.3, trl),
               TrainProgress(2, 4, 0.0, {"signal/all_tied": 1.0, "completions/mean_length": 8.0, "loss": 0.0}),
               TrainProgress(3, 4, 0.4, {"signal/all_tied": 0.0})]
    lines = rewards_markdown("run-1", history).splitlines()
    assert lines[2] == "| step | reward | tied | correctness | thinking | mean length | truncated | loss |"
    assert lines[3] == "|---:|---:|---:|---:|---:|---:|---:|---:|"
    assert lines[4:] == ["| 1/4 | 0.3 | 0.5 | 0.25 | 1 | 37 | 0.125 | 0.01 |",
                         "| 2/4 | 0 | all |  |  | 8 |  | 0 |",
                         "| 3/4 | 0.4 |  |  |  |  |  |  |"]


def test_eval_table_compares_base_and_trained():
    def report(metrics):
        return EvalReport(model_uri="m", split="test", n=8, metrics=metrics, table_uri="t", settings_key="k")

    rows = eval_table(report({"accuracy": 0.5, "format": 1.0}), report({"accuracy": 0.25}))
    assert rows == [{"metric": "accuracy", "base": 0.25, "trained": 0.5, "delta": 0.25},
                    {"metric": "format", "base": None, "trained": 1.0, "delta": None}]
    rows = eval_table(report({"accuracy": 0.5}), report({"accuracy": 0.25}), warm_start=report({"accuracy": 0.375}))
    assert rows == [{"metric": "accuracy", "base": 0.25, "warm_start": 0.375, "trained": 0.5, "delta": 0.25,
                     "delta_grpo": 0.125}]


def test_mlflow_link_is_a_url_only_for_a_tracking_server():
    assert mlflow_run_url("http://127.0.0.1:5000/", "3", "abc") == (
        "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning")
    assert mlflow_run_url("sqlite:////tmp/mlflow.db", "3", "abc") is None
    assert "mlflow ui --backend-store-uri sqlite:////tmp/mlflow.db" in mlflow_local_note("sqlite:////tmp/mlflow.db", "abc")


def test_crash_hook_marks_the_run_failed_and_resumable(tmp_path):
    overrides = [f"storage.uri=file://{tmp_path / 'store'}"]
    cfg = load_config(["gsm8k"], overrides)
    store = Store.from_config(cfg.storage)
    run_id, _ = runs.begin_run(store, cfg, None)
    flow_run = SimpleNamespace(id=uuid4(), name="gsm8k-x", parameters={"config": ["gsm8k"], "overrides": overrides})
    state = SimpleNamespace(message="Flow run process exited with signal 9")

    record_crash(None, flow_run, state)
    record_crash(None, flow_run, state)

    record = runs.read_run(store, run_id)
    assert record["status"] == "failed" and record["crashes"] == 2
    assert "signal 9" in record["error"] and record["crashed_flow_run_id"] == str(flow_run.id)
    assert runs.find_resumable(store, cfg) == run_id  # a re-run with the same parameters resumes it


def test_each_dataset_has_its_own_summary_key_prefect_accepts():
    from prefect.types.names import raise_on_name_alphanumeric_dashes_only

    keys = [summary_key(d) for d in ("gsm8k", "math", "nq_hotpotqa")]
    assert keys == ["run-summary-gsm8k", "run-summary-math", "run-summary-nq-hotpotqa"]
    assert [raise_on_name_alphanumeric_dashes_only(k, "key") for k in keys] == keys
