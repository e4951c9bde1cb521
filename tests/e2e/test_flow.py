"""The whole `verl-grpo` Prefect flow on the tiny model: data, a short warm start, checkpoints, eval of base, warm
start and trained model, MLflow, registered model.

The run evaluates in two shards on the thread runner, so the same run also shows that sharding changes no eval
table or metric (`sharded_evals.py`, which tests/e2e/test_flow_ray.py checks on a local Ray too, without a warm
start)."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pandas as pd
import pytest
import torch
from mlflow import MlflowClient
from prefect_template import seeded_test_harness
from sharded_evals import check_sharded_evals
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_grpo import runs
from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.config import load_config
from verl_grpo.store import Store

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def prefect_harness():
    with seeded_test_harness():
        yield


def test_flow_end_to_end_with_its_eval_in_two_shards_on_threads(prefect_harness, tiny_overrides, tmp_path):
    from verl_grpo_flows.verl_grpo import verl_grpo

    overrides = [*tiny_overrides, "eval.shards=2", "warm_start.enabled=true", "warm_start.steps=4",
                 "warm_start.batch_size=2", "warm_start.max_response_tokens=128"]
    summary = verl_grpo(config=["gsm8k"], overrides=overrides)
    cfg = load_config(["gsm8k"], overrides)
    store = Store.from_config(cfg.storage)

    # Data: verl-format parquet in the store.
    dataset_dir = store.listdir("datasets", "gsm8k")
    assert len(dataset_dir) == 1
    train = pd.read_parquet(store.path("datasets", "gsm8k", dataset_dir[0], "train.parquet"), filesystem=store.fs)
    assert len(train) > 7000 and {"data_source", "prompt", "ability", "reward_model", "extra_info"} <= set(train.columns)

    # Checkpoints: at least two committed, the last one at the final step.
    run_id = summary["run_id"]
    ckpts = CheckpointStore(store)
    complete = [s for s in ckpts.steps(run_id) if ckpts.manifest(run_id, s)]
    assert len(complete) >= 2 and max(complete) == 4
    assert summary["steps"] == 4

    # MLflow: the run has the eval metric and per-step training metrics.
    client = MlflowClient(tracking_uri=cfg.tracking.mlflow_uri)
    mlflow_run = client.get_run(summary["mlflow_run_id"])
    assert "eval.accuracy" in mlflow_run.data.metrics
    assert mlflow_run.data.metrics["eval.accuracy"] == pytest.approx(summary["accuracy"])
    assert [m.step for m in client.get_metric_history(mlflow_run.info.run_id, "train/reward")] == [1, 2, 3, 4]
    assert mlflow_run.data.params["algorithm.rollouts"] == "2"
    # ... and spans the training: it started when the train step did, after the run was created.
    record = runs.read_run(store, run_id)
    assert mlflow_run.info.start_time == int(record["training_started_at"] * 1000)
    assert record["created_at"] < record["training_started_at"] < mlflow_run.info.end_time / 1000
    assert [m.model_id for m in mlflow_run.outputs.model_outputs] and mlflow_run.inputs.dataset_inputs

    # Attribution: the warm-start model was evaluated too, beside base and trained, each step with its paired test.
    assert summary["warm_start"].startswith("4 SFT steps on 8 rewritten solutions")
    assert summary["grpo"].startswith("GRPO added ") and " over the warm start (" in summary["grpo"]
    by_metric = {m["metric"]: m for m in summary["metrics"]}
    assert by_metric["mean_score"]["test"] == "Wilcoxon" and by_metric["accuracy"]["test"] == "McNemar"
    assert all(m["warm_start"] is not None and m["grpo_p_value"] is not None
               for m in (by_metric["mean_score"], by_metric["accuracy"]))
    for name in ("accuracy", "mean_score"):
        assert mlflow_run.data.metrics[f"warm_start.{name}"] == pytest.approx(by_metric[name]["warm_start"])
        assert mlflow_run.data.metrics[f"pvalue.trained_vs_warm_start.{name}"] == pytest.approx(
            by_metric[name]["grpo_p_value"])
    assert summary["grpo"] in summary["decision"]  # the registry's decision says it too
    # The eval side by side, as a table MLflow's UI renders: each model's real response per problem.
    side = json.loads(Path(client.download_artifacts(mlflow_run.info.run_id, "eval/test-side_by_side.json",
                                                     str(tmp_path))).read_text())
    assert {"question", "base_response", "warm_start_response", "trained_response", "flip"} <= set(side["columns"])
    assert len(side["data"]) == int(summary["eval_split"].split("n=")[1].rstrip(")"))  # one row per eval problem
    # What the model wrote while it trained: every step's first group, as a table MLflow's UI renders.
    samples = json.loads(Path(client.download_artifacts(mlflow_run.info.run_id, "train/samples.json",
                                                        str(tmp_path))).read_text())
    assert {"step", "prompt", "response", "reward", "advantage", "truncated", "reward/correctness"} <= \
        set(samples["columns"])
    rows = [dict(zip(samples["columns"], row, strict=True)) for row in samples["data"]]
    assert sorted({r["step"] for r in rows}) == [1, 2, 3, 4] and all(r["response"] for r in rows)

    # Registry: one version whose files load back with transformers and generate.
    versions = client.search_model_versions(f"name='{cfg.registered_model_name}'")
    assert len(versions) == 1
    mlflow.set_tracking_uri(cfg.tracking.mlflow_uri)
    local = mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{cfg.registered_model_name}/{versions[0].version}",
                                                dst_path=str(tmp_path / "dl"))
    model_dir = _find_hf_dir(local)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = tok("12 + 3 =", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > ids["input_ids"].shape[1]

    # The two eval shards on threads equal one unsharded eval of the same models.
    check_sharded_evals(summary, overrides)


def _find_hf_dir(root: str) -> str:
    from pathlib import Path

    for config in sorted(Path(root).rglob("config.json")):
        if (config.parent / "tokenizer_config.json").exists():
            return str(config.parent)
    raise AssertionError(f"no HF model dir under {root}")


CUSTOM_REWARD = '''
import json

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    row = json.loads((extra_info or {}).get("row") or "{}")
    if row.get("breaks_the_reward"):
        raise KeyError("units")
    said = solution_str.strip().split()
    exact = float(bool(said) and said[-1] == str(ground_truth))
    return {"score": 0.2 + 0.8 * exact, "exact": exact, "short": float(len(said) < 8)}
'''


def test_a_task_of_your_own_trains_is_scored_by_your_reward_and_registers_its_own_line(prefect_harness,
                                                                                      tiny_overrides, tmp_path):
    """dataset.name=custom: a JSONL in one directory and a reward .py in another, both outside the repo, through the
    Prefect flow on the tiny model: its reward scores training and eval (its components become metrics; the rows it
    fails on score 0 and are counted), the bad rows are quarantined with their reasons, the model gets its own
    line."""
    from verl_grpo_flows.verl_grpo import verl_grpo

    data, code = tmp_path / "data", tmp_path / "code"
    data.mkdir(), code.mkdir()
    rows = [{"prompt": f"What is {a} plus {b}?", "solution": a + b, **({"breaks_the_reward": True} if b == 3 else {})}
            for a in range(8) for b in range(4)]
    bad = ['{"prompt": "no solution"}', "not json at all", '{"prompt": "", "solution": 1}']
    (data / "train.jsonl").write_text("\n".join([*map(json.dumps, rows), *bad]) + "\n")
    (data / "test.jsonl").write_text("\n".join(json.dumps({"prompt": f"What is {a} plus 9?", "solution": a + 9,
                                                           **({"breaks_the_reward": True} if a < 2 else {})})
                                               for a in range(8)) + "\n")
    (code / "sums_reward.py").write_text(CUSTOM_REWARD)
    overrides = [*tiny_overrides, "dataset.name=custom", "dataset.task=sums", "dataset.prompt_key=prompt",
                 "dataset.answer_key=solution", f"dataset.train_files=[{data / 'train.jsonl'}]",
                 f"dataset.test_files=[{data / 'test.jsonl'}]", "dataset.val_size=4",
                 f"reward.path={code / 'sums_reward.py'}", "algorithm.total_steps=2", "algorithm.train_batch_size=4",
                 "eval.limit=null"]
    summary = verl_grpo(config=["local"], overrides=overrides)
    cfg = load_config(["local"], overrides)
    assert summary["run_id"].startswith("sums-") and summary["registered"] == "verl-grpo-sums v1"

    # Quarantined with a reason each, and listed.
    assert "3 rows (" in summary["quarantined"] and "missing_answer 1" in summary["quarantined"] \
        and "invalid_json 1" in summary["quarantined"] and "missing_question 1" in summary["quarantined"]
    client = MlflowClient(tracking_uri=cfg.tracking.mlflow_uri)
    run = client.get_run(summary["mlflow_run_id"])
    rejected = json.loads(Path(client.download_artifacts(run.info.run_id, "data/rejected.json", str(tmp_path)))
                          .read_text())
    assert sorted(r[rejected["columns"].index("reason")] for r in rejected["data"]) == [
        "invalid_json", "missing_answer", "missing_question"]

    # The reward scored the eval: its components are eval metrics, the 2 rows it failed on are counted.
    assert {"eval.reward.exact", "eval.reward.short", "base.reward.short"} <= set(run.data.metrics)
    assert run.data.metrics["eval.reward.failed"] == pytest.approx(2 / 8)
    # ... and training: each component per step, the failed rows counted per step and summed in the summary.
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/rewards/exact/mean")] == [1, 2]
    curve = summary["reward_curve"]
    assert {"exact", "short", "failed"} <= set(curve["columns"]) and "score" not in curve["columns"]
    store = Store.from_config(cfg.storage)
    train = pd.read_parquet(store.path("datasets", "sums", summary["dataset"].split("@")[1], "train.parquet"),
                            filesystem=store.fs)
    breaks = ["breaks_the_reward" in info["row"] for info in train["extra_info"]]
    steps = [json.loads(line) for line in store.read_text("runs", summary["run_id"], "metrics.jsonl").splitlines()]
    consumed = [i for step in steps for i in step["prompt_indices"]]
    failed = 2 * sum(breaks[i] for i in consumed)  # each prompt's 2 rollouts
    assert [step["reward/failed"] for step in steps] == [2 * sum(breaks[i] for i in s["prompt_indices"]) for s in steps]
    assert failed > 0 and f"failed on {failed} training rows and 25.0% of the eval rows" in " ".join(
        summary["warnings"])
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.name == "verl-grpo/sums"
