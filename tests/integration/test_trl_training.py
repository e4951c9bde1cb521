"""The TRL worker as a real subprocess on the tiny model: checkpoints, metrics, final model, kill + resume.

The dataset has 8 prompts and a step takes 4, so the kill/resume at step 2 lands exactly on an epoch
boundary: the resumed process must continue with epoch 1's order, not replay epoch 0's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from tiny_data import write_gsm8k_split

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.config import load_config
from verl_grpo.contracts import Cluster, TrainResult, TrainSpec
from verl_grpo.errors import ConfigError
from verl_grpo.store import Store, local_path
from verl_grpo.trainers import get_trainer
from verl_grpo.trainers.precision import precision_line

RUN_ID = "trl-it"
N_PROMPTS = 8
TRAIN_OVERRIDES = [
    "algorithm.train_batch_size=4",
    "algorithm.rollouts=4",
    "algorithm.max_response_length=32",
    "algorithm.total_steps=4",
    "algorithm.save_freq=2",
    "algorithm.lr=1e-3",
    "trainer.micro_batch_size=8",
    "trainer.threads=1",  # 2 OpenMP threads on a busy 2-core machine run ~10x slower than 1
]
WORKER_TIMEOUT_S = 600  # a bound for a hang, with room for two other xdist workers beside


def plan_run(root: Path, model_dir: Path, mirror: Path, *overrides: str) -> tuple[TrainSpec, Store]:
    store = Store(f"file://{root / 'store'}")
    cfg = load_config(overrides=[f"model.name={model_dir}", f"storage.uri={store.uri}", *TRAIN_OVERRIDES, *overrides],
                      env={})
    dataset = write_gsm8k_split(store, mirror, N_PROMPTS, "it")
    cluster = Cluster(provider="local", name="it", workdir=str(root / "work"), on_this_machine=True)
    return get_trainer("trl").plan(cfg, dataset, store, RUN_ID, cluster), store


def worker_env(spec: TrainSpec, root: Path) -> dict[str, str]:
    return {**os.environ, **spec.env, "VERL_GRPO_HOME": str(root / "home")}


def run_worker(spec: TrainSpec, root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(spec.command, env=worker_env(spec, root), capture_output=True, text=True,
                          timeout=WORKER_TIMEOUT_S, check=False)


def metrics_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def reward_component_names() -> list[str]:
    from verl_grpo.rewards.trl_adapter import trl_reward_functions

    funcs, _weights = trl_reward_functions("gsm8k")
    return [getattr(f, "__name__", type(f).__name__) for f in funcs]


def final_weights(store: Store) -> dict:
    from safetensors.torch import load_file

    return load_file(local_path(store.url("runs", RUN_ID, "model", "model.safetensors")))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model_dir, data_mirror):
    root = tmp_path_factory.mktemp("trl-uninterrupted")
    spec, store = plan_run(root, tiny_model_dir, data_mirror)
    proc = run_worker(spec, root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root, spec, store, proc


def test_run_commits_checkpoints_metrics_result_and_model(uninterrupted):
    root, _spec, store, proc = uninterrupted
    workdir = root / "work"

    checkpoints = CheckpointStore(store)
    assert checkpoints.steps(RUN_ID) == [2, 4]
    assert checkpoints.latest_complete(RUN_ID).step == 4
    assert checkpoints.manifest(RUN_ID, 2)["state"]["prompts_consumed"] == 8

    lines = metrics_lines(workdir / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    for m in lines:
        assert {"reward", "reward_std", "loss", "learning_rate", "step_time", "completions/mean_length"} <= set(m)
        assert all(f"rewards/{name}/mean" in m for name in reward_component_names())
        assert len(m["prompt_indices"]) == 4
    epoch0 = lines[0]["prompt_indices"] + lines[1]["prompt_indices"]
    epoch1 = lines[2]["prompt_indices"] + lines[3]["prompt_indices"]
    assert sorted(epoch0) == sorted(epoch1) == list(range(N_PROMPTS)), "each epoch sees every prompt once"
    assert epoch0 != epoch1, "epochs are shuffled differently"
    assert metrics_lines(local_path(store.url("runs", RUN_ID, "metrics.jsonl"))) == lines

    progress = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in progress] == ["1/4", "2/4", "3/4", "4/4"]
    assert all("reward=" in line for line in progress)
    assert precision_line("auto", use_cpu=True) in proc.stdout.splitlines()  # what this machine computes in, and why

    result = TrainResult.model_validate_json((workdir / "result.json").read_text())
    assert result.final_step == 4 and result.checkpoint.step == 4
    assert result.model_uri == store.url("runs", RUN_ID, "model")
    assert "final_reward" in result.summary
    assert TrainResult.model_validate_json(store.read_text("runs", RUN_ID, "train_result.json")) == result


def test_each_step_keeps_its_first_group_as_readable_samples(uninterrupted):
    from verl_grpo.rewards.trl_adapter import trl_reward_functions

    root, _spec, store, _proc = uninterrupted
    records = metrics_lines(root / "work" / "samples.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]  # trainer.log_samples_every=1
    names = reward_component_names()
    weights = dict(zip(names, trl_reward_functions("gsm8k")[1], strict=True))
    for record in records:
        samples = record["samples"]
        assert len(samples) == 4, "trainer.samples_per_step=4: the step's first group of 4 rollouts"
        assert len({s["prompt"] for s in samples}) == 1, "one group: one prompt, four responses"
        assert samples[0]["prompt"].strip() and not samples[0]["prompt"].startswith("[")  # the question as text
        for s in samples:
            assert set(s["components"]) == set(names)
            assert s["reward"] == pytest.approx(sum(weights[n] * v for n, v in s["components"].items()))
            assert isinstance(s["truncated"], bool) and isinstance(s["response"], str)
        assert sum(s["advantage"] for s in samples) == pytest.approx(0.0, abs=1e-4)  # group-normalised
    assert metrics_lines(local_path(store.url("runs", RUN_ID, "samples.jsonl"))) == records
    in_checkpoint = store.read_text("runs", RUN_ID, "checkpoints", "global_step_2", "samples.jsonl").splitlines()
    assert [json.loads(x)["step"] for x in in_checkpoint] == [1, 2]


def test_final_model_loads_and_generates(uninterrupted):
    import torch

    from verl_grpo.models import load_model_and_tokenizer

    _root, _spec, store, _proc = uninterrupted
    model, tok = load_model_and_tokenizer(local_path(store.url("runs", RUN_ID, "model")))
    inputs = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 4


def test_killed_run_resumes_where_it_stopped(uninterrupted, tmp_path, tiny_model_dir, data_mirror):
    _root, _spec, ref_store, _proc = uninterrupted
    spec, store = plan_run(tmp_path, tiny_model_dir, data_mirror)

    first = subprocess.Popen(spec.command, env=worker_env(spec, tmp_path), stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        for line in first.stdout:
            if line.startswith("checkpoint step 2 committed"):
                first.send_signal(signal.SIGKILL)
                break
    finally:
        first.kill()
        first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL
    assert CheckpointStore(store).latest_complete(RUN_ID).step == 2, "the kill must land before step 4's commit"

    second = run_worker(spec, tmp_path)
    assert second.returncode == 0, second.stderr[-4000:]
    assert f"resuming run {RUN_ID} from checkpoint step 2" in second.stdout
    progress = [line.split()[1] for line in second.stdout.splitlines() if line.startswith("step ")]
    assert progress == ["3/4", "4/4"], "the resumed attempt trains only the remaining steps"

    resumed = metrics_lines(tmp_path / "work" / "metrics.jsonl")
    reference = metrics_lines(_root / "work" / "metrics.jsonl")
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    assert [m["prompt_indices"] for m in resumed] == [m["prompt_indices"] for m in reference]
    assert [m["reward"] for m in resumed] == [m["reward"] for m in reference]
    resumed_samples = metrics_lines(tmp_path / "work" / "samples.jsonl")
    reference_samples = metrics_lines(_root / "work" / "samples.jsonl")
    assert [r["step"] for r in resumed_samples] == [1, 2, 3, 4], "steps 1-2 come back from the checkpoint"
    assert [[s["prompt"] for s in r["samples"]] for r in resumed_samples] == \
        [[s["prompt"] for s in r["samples"]] for r in reference_samples]

    import torch

    weights, ref_weights = final_weights(store), final_weights(ref_store)
    assert weights.keys() == ref_weights.keys()
    assert all(torch.equal(weights[k], ref_weights[k]) for k in weights), "resume is bit-identical on CPU"


def test_plan_validates_offline_before_writing_anything(tmp_path, tiny_model_dir, data_mirror):
    with pytest.raises(ConfigError, match="trainer.micro_batch_size"):
        plan_run(tmp_path, tiny_model_dir, data_mirror, "trainer.micro_batch_size=3")
    assert not (tmp_path / "work").exists()

    spec, store = plan_run(tmp_path, tiny_model_dir, data_mirror, "trainer.threads=2")
    written = json.loads(Path(spec.spec_uri).read_text())
    assert spec.command[-3:] == ["-m", "verl_grpo.trainers.trl.worker", spec.spec_uri]
    assert spec.total_steps == 4 and spec.backend == "trl" and spec.run_id == RUN_ID
    assert spec.env["TOKENIZERS_PARALLELISM"] == "false" and spec.env["OMP_NUM_THREADS"] == "2"
    assert written["config"]["algorithm"]["train_batch_size"] == 4
    assert written["store"] == {"uri": store.uri, "endpoint_url": None}
    assert written["model_path"] == str(tiny_model_dir.resolve())
    assert written["dataset"]["splits"]["train"].endswith("train.parquet")


def test_missing_train_data_fails_with_a_typed_error(tmp_path, tiny_model_dir, data_mirror):
    spec, store = plan_run(tmp_path, tiny_model_dir, data_mirror)
    store.rm("datasets/gsm8k/it/train.parquet")
    proc = run_worker(spec, tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    error = json.loads((tmp_path / "work" / "error.json").read_text())
    assert error["type"] == "DataError" and error["retryable"] is False
    assert "train.parquet" in error["message"]
    assert not (tmp_path / "work" / "result.json").exists()


def test_rerunning_a_finished_run_publishes_without_training_further(uninterrupted):
    root, spec, store, _proc = uninterrupted
    before = final_weights(store)
    proc = run_worker(spec, root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"run {RUN_ID} already reached step 4" in proc.stdout
    assert not [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert CheckpointStore(store).steps(RUN_ID) == [2, 4]
    assert TrainResult.model_validate_json((root / "work" / "result.json").read_text()).final_step == 4
    assert [m["step"] for m in metrics_lines(root / "work" / "metrics.jsonl")] == [1, 2, 3, 4]

    import torch

    after = final_weights(store)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_run_against_an_s3_store(s3_bucket, tmp_path, tiny_model_dir, data_mirror):
    uri, endpoint = s3_bucket
    store = Store(uri, endpoint)
    cfg = load_config(overrides=[f"model.name={tiny_model_dir}", f"storage.uri={uri}", f"storage.endpoint_url={endpoint}",
                                 *TRAIN_OVERRIDES, "algorithm.total_steps=2", "algorithm.save_freq=1",
                                 "storage.keep_last=1"], env={})
    dataset = write_gsm8k_split(store, data_mirror, N_PROMPTS, "it")
    cluster = Cluster(provider="local", name="it", workdir=str(tmp_path / "work"), on_this_machine=True)
    spec = get_trainer("trl").plan(cfg, dataset, store, RUN_ID, cluster)
    proc = run_worker(spec, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert CheckpointStore(store).steps(RUN_ID) == [2], "keep_last=1 prunes step 1 after step 2 commits"
    result = TrainResult.model_validate_json(store.read_text("runs", RUN_ID, "train_result.json"))
    assert result.final_step == 2 and result.model_uri == store.url("runs", RUN_ID, "model")
    assert store.exists("runs", RUN_ID, "model", "model.safetensors")
    assert [json.loads(x)["step"] for x in store.read_text("runs", RUN_ID, "metrics.jsonl").splitlines()] == [1, 2]


def test_warm_start_trains_commits_and_is_reused_by_the_next_attempt(tmp_path, tiny_model_dir, data_mirror):
    """The SFT phase runs before GRPO, commits its model, metrics and result to the store, and GRPO starts from that
    model; an attempt that finds it committed fetches it instead of training it again. Both phases run in bf16
    mixed precision (trainer.precision=bf16), which TRL and Accelerate take on a CPU too."""
    from safetensors.torch import load_file

    spec, store = plan_run(tmp_path, tiny_model_dir, data_mirror, "algorithm.total_steps=2",
                           "warm_start.enabled=true", "warm_start.steps=3", "warm_start.batch_size=2",
                           "warm_start.lr=1e-3", "warm_start.max_response_tokens=512", "trainer.precision=bf16")
    proc = run_worker(spec, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("precision bf16 (trainer.precision=bf16") for line in lines), lines[:20]
    assert [line.split()[1] for line in lines if line.startswith("warm-start ")] == ["1/3", "2/3", "3/3"]
    assert lines.index(next(line for line in lines if line.startswith("warm-start 3/3"))) < lines.index(
        next(line for line in lines if line.startswith("step 1/2"))), "SFT runs before the first GRPO step"

    committed = json.loads(store.read_text("runs", RUN_ID, "warm_start", "result.json"))
    assert committed["steps"] == 3 and committed["examples"] == 6
    sft_losses = metrics_lines(local_path(store.url("runs", RUN_ID, "warm_start", "metrics.jsonl")))
    assert [m["step"] for m in sft_losses] == [1, 2, 3] and all(m["loss"] > 0 for m in sft_losses)
    sft = load_file(local_path(store.url("runs", RUN_ID, "warm_start", "model", "model.safetensors")))
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    assert any(not (sft[k] == base[k]).all() for k in base), "the SFT phase changed the weights"
    result = TrainResult.model_validate_json(store.read_text("runs", RUN_ID, "train_result.json"))
    assert result.summary["warm_start_steps"] == 3 and result.summary["warm_start_final_loss"] > 0

    # A later attempt with no GRPO checkpoint to resume (all lost) reuses the committed SFT model.
    store.rm("runs", RUN_ID, "checkpoints")
    again = run_worker(spec, tmp_path)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "warm-start: reusing the committed warm start" in again.stdout
    assert not any(line.startswith("warm-start 1/") for line in again.stdout.splitlines())
