"""`python -m verl_grpo_rehearsal.main_ppo_cpu`: verl's main_ppo stood in on a CPU, with the real plan's overrides.

The overrides and env are built exactly as `VerlTrainer.plan` builds them (verl_overrides + run_paths +
checkpoint_env); the stand-in trains the tiny model for real, writes verl's checkpoint layout, commits through
our StoreCheckpointCallback to a moto S3 store, and restore → resume → finalize run around it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from run_configs import prepared_files, tiny_cpu_run

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.config import RunConfig
from verl_grpo.store import Store
from verl_grpo.trainers.signal import ALL_TIED, CLIPPED_RATIO, LOSS, MEAN_LENGTH, REWARD, TIED_GROUP_SHARE
from verl_grpo.trainers.verl.overrides import run_paths, verl_overrides
from verl_grpo.trainers.verl.progress import parse_progress
from verl_grpo.trainers.verl.samples import SamplesPlan
from verl_grpo.trainers.verl.settings import checkpoint_env

REPO = Path(__file__).resolve().parents[2]
MODULE = "verl_grpo_rehearsal.main_ppo_cpu"
MAX_PROMPT = 160
STEPS = 4
BATCH = 4
RUN = (f"algorithm.max_prompt_length={MAX_PROMPT}", "algorithm.max_response_length=16",
       f"algorithm.train_batch_size={BATCH}", f"algorithm.total_steps={STEPS}", "algorithm.save_freq=2",
       "algorithm.lr=1e-3", "infra.accelerators=H100:1")

DIGITS_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """A dense test reward (the random tiny model never earns the real one): the share of digits."""
    assert ground_truth and isinstance(extra_info, dict) and "index" in extra_info
    return {"score": sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1), "acc": 0.0}
'''


@pytest.fixture(scope="module")
def data_files(tiny_model_dir, data_mirror, tmp_path_factory) -> dict[str, str]:
    return prepared_files(tiny_model_dir, RUN, tmp_path_factory.mktemp("data-store"))


def _plan(cfg: RunConfig, files, s3_bucket, tmp_path: Path, run_id: str, env: dict | None = None):
    """The overrides and env of VerlTrainer.plan for a cluster whose workdir is tmp_path."""
    uri, endpoint = s3_bucket
    ckpt = tmp_path / "checkpoints" / run_id
    # The model is on this "cluster" already, as model_on_cluster leaves a model on the machine that trains.
    paths = replace(run_paths(cfg, str(ckpt)), model_path=cfg.model.name)
    overrides = verl_overrides(cfg, files, paths, run_id, env=env or {})
    run_env = {**os.environ, **checkpoint_env(uri, endpoint, run_id, str(ckpt), cfg.storage.keep_last),
               **SamplesPlan.of(cfg).env(),
               "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "PYTHONPATH": str(REPO),
               "PYTHONUNBUFFERED": "1"}
    (ckpt / "metrics").mkdir(parents=True, exist_ok=True)
    return overrides, run_env, ckpt


def _run(args: list[str], env: dict, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def _prompts(output: str) -> dict[int, str]:
    out = {}
    for line in output.splitlines():
        if line.startswith("rehearsal: step "):
            _, _, step, _, ids = line.split(" ", 4)
            out[int(step)] = ids
    return out


def _steps(output: str) -> list:
    return [p for p in (parse_progress(line, STEPS) for line in output.splitlines()) if p is not None]


def test_rehearsal_trains_checkpoints_commits_finalizes_and_resumes(tiny_model_dir, data_files, s3_bucket,
                                                                     tmp_path):
    reward = tmp_path / "digits_reward.py"
    reward.write_text(DIGITS_REWARD)
    cfg = tiny_cpu_run(tiny_model_dir, *RUN, verl_extra=[f"reward.custom_reward_function.path={reward}"])
    overrides, env, ckpt = _plan(cfg, data_files, s3_bucket, tmp_path / "a", "run-a")

    proc = _run(["-m", MODULE, *overrides], env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "rehearsal: verl.trainer.main_ppo stood in by verl_grpo_rehearsal.main_ppo_cpu (CPU): " in out

    # verl's console lines, read by our progress parser; a real optimisation happened
    steps = _steps(out)
    assert [p.step for p in steps] == [1, 2, 3, 4] and all(p.reward is not None for p in steps)
    assert all(p.metrics["actor/lr"] == pytest.approx(1e-3) for p in steps)
    assert any(p.metrics["actor/grad_norm"] > 0 for p in steps)
    # verl's names, in the signal vocabulary too (verl logs no tie share: all_tied is derived)
    assert all(p.metrics[CLIPPED_RATIO] == p.metrics["response_length/clip_ratio"] for p in steps)
    assert all(p.metrics[ALL_TIED] in (0.0, 1.0) and TIED_GROUP_SHARE not in p.metrics for p in steps)
    prompts = _prompts(out)
    assert sorted(prompts) == [1, 2, 3, 4]
    ids = [i for step in prompts.values() for i in step.split(",")]
    assert len(ids) == STEPS * BATCH and len(set(ids)) == len(ids)

    # verl's file logger
    records = [json.loads(x) for x in (ckpt / "metrics" / "verl.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert {"critic/score/mean", "actor/pg_loss", "actor/lr", "timing_s/step"} <= set(records[0]["data"])

    # verl's checkpoint layout
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "4"
    for step in (2, 4):
        actor = ckpt / f"global_step_{step}" / "actor"
        names = {p.name for p in actor.iterdir()}
        assert {"model_world_size_1_rank_0.pt", "optim_world_size_1_rank_0.pt", "extra_state_world_size_1_rank_0.pt",
                "fsdp_config.json", "huggingface"} <= names
        assert {"config.json", "generation_config.json", "tokenizer.json"} <= {p.name for p in (actor / "huggingface").iterdir()}
        assert json.loads((actor / "fsdp_config.json").read_text()) == {"FSDP_version": 2, "world_size": 1}
        extra = torch.load(actor / "extra_state_world_size_1_rank_0.pt", weights_only=False)
        assert set(extra) == {"lr_scheduler", "rng"} and "cpu" in extra["rng"]
        assert isinstance(torch.load(ckpt / f"global_step_{step}" / "data.pt", weights_only=False), dict)
    assert not (ckpt / "global_step_1").exists() and not (ckpt / "global_step_3").exists()

    # the callback committed steps 2 and 4 to the store
    uri, endpoint = s3_bucket
    store = Store(uri, endpoint)
    checkpoints = CheckpointStore(store)
    assert checkpoints.latest_complete("run-a").step == 4
    assert checkpoints.manifest("run-a", 2)["state"]["global_step"] == 2

    # finalize merges the final actor with verl.model_merger; the model learned
    fin = _run(["-m", "verl_grpo.trainers.verl.finalize", "--backend", "fsdp2", "--train-batch-size", str(BATCH)],
               env)
    assert fin.returncode == 0, fin.stdout[-2000:] + fin.stderr[-2000:]
    result = json.loads(store.read_text("runs/run-a/train_result.json"))
    assert result["final_step"] == 4
    published = [json.loads(x) for x in store.read_text("runs/run-a/metrics.jsonl").splitlines()]
    assert [r["step"] for r in published] == [1, 2, 3, 4]
    assert all({ALL_TIED, CLIPPED_RATIO, MEAN_LENGTH, REWARD, LOSS} <= set(r) for r in published)
    # samples: verl's own rollout dumps (trainer.rollout_data_dir), a few per step, travelling like the metrics
    samples = [json.loads(x) for x in store.read_text("runs/run-a/samples.jsonl").splitlines()]
    assert [r["step"] for r in samples] == [1, 2, 3, 4]
    for record in samples:
        rows = record["samples"]
        assert len(rows) == 4 and all(r["prompt"] and "truncated" not in r for r in rows)  # verl does not say
        assert all(r["reward"] == pytest.approx(sum(c.isdigit() for c in r["response"]) / max(len(r["response"]), 1))
                   for r in rows)  # the dumped score is the reward function's
        assert all(r["components"] == {} for r in rows)  # DIGITS_REWARD has no parts: `acc` is not one
        for group in (rows[:2], rows[2:]):  # rollout.n=2: consecutive pairs share a prompt
            assert group[0]["prompt"] == group[1]["prompt"]
            assert sum(r["advantage"] for r in group) == pytest.approx(0.0, abs=1e-6)
    in_checkpoint = [json.loads(x) for x in store.read_text("runs/run-a/checkpoints/global_step_2/samples.jsonl")
                     .splitlines()]
    assert [r["step"] for r in in_checkpoint] == [1, 2] and in_checkpoint == samples[:2]
    dumps = Path(f"{ckpt}-rollouts")
    assert sorted(p.name for p in dumps.iterdir()) == ["1.jsonl", "2.jsonl", "3.jsonl", "4.jsonl"]
    assert [len((dumps / f"{step}.jsonl").read_text().splitlines()) for step in (1, 2, 3, 4)] == [4, 4, 4, 8], \
        "a commit keeps of earlier dumps only the whole groups samples.jsonl reads"
    from transformers import AutoModelForCausalLM

    local = tmp_path / "merged"
    store.get_dir(local, "runs/run-a/model")
    merged = AutoModelForCausalLM.from_pretrained(local, dtype=torch.float32).state_dict()
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    assert set(merged) == set(initial)
    assert any(not torch.equal(merged[k], initial[k]) for k in initial)

    # a run SIGKILLed after step 2's commit, restored from the store, continues at step 3 with the same prompts
    overrides_b, env_b, _ = _plan(cfg, data_files, s3_bucket, tmp_path / "b", "run-b")
    killed = _run_until(["-m", MODULE, *overrides_b], env_b, "checkpoint step 2 committed")
    assert _prompts(killed) == {k: v for k, v in prompts.items() if k in _prompts(killed)}
    restore = _run(["-m", "verl_grpo.trainers.verl.restore"], env_b)
    assert restore.returncode == 0 and "restored checkpoint step 2" in restore.stdout, restore.stdout + restore.stderr
    resumed = _run(["-m", MODULE, *overrides_b], env_b)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "continuing at step 3" in resumed.stdout
    assert [p.step for p in _steps(resumed.stdout)] == [3, 4]
    assert {**_prompts(killed), **_prompts(resumed.stdout)} == prompts
    assert _prompts(resumed.stdout) == {3: prompts[3], 4: prompts[4]}
    # model, optimizer, LR schedule and sampling resume exactly: steps 3 and 4 match the uninterrupted run
    for before, after in zip(steps[2:], _steps(resumed.stdout), strict=True):
        assert _untimed(after.metrics) == _untimed(before.metrics)
    assert CheckpointStore(store).latest_complete("run-b").step == 4
    resumed_samples = [json.loads(x) for x in store.read_text("runs/run-b/checkpoints/global_step_4/samples.jsonl")
                       .splitlines()]
    assert [r["step"] for r in resumed_samples] == [1, 2, 3, 4], "1-2 restored as history, 3-4 from the dumps"
    assert [[r["prompt"] for r in x["samples"]] for x in resumed_samples] == \
        [[r["prompt"] for r in x["samples"]] for x in samples]


def _untimed(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith("timing_s/")}


def _run_until(args: list[str], env: dict, marker: str, timeout: float = 240) -> str:
    """Run, SIGKILL as soon as `marker` is printed; the output so far."""
    proc = subprocess.Popen([sys.executable, *args], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if marker in line:
                os.kill(proc.pid, signal.SIGKILL)
                break
    finally:
        watchdog.cancel()
        proc.wait()
        proc.stdout.close()
    out = "".join(lines)
    assert marker in out, out[-3000:]
    return out


def test_injected_failure_fails_once_then_the_restart_succeeds(tiny_model_dir, data_files, s3_bucket, tmp_path):
    cfg = tiny_cpu_run(tiny_model_dir, *RUN, "algorithm.total_steps=2", "algorithm.save_freq=1")
    overrides, env, _ = _plan(cfg, data_files, s3_bucket, tmp_path, "run-f")
    env["VERL_GRPO_REHEARSAL_FAIL_AT"] = "2"
    first = _run(["-m", MODULE, *overrides], env)
    assert first.returncode == 1
    assert "rehearsal: injected user-code failure at step 2" in first.stdout
    assert "RuntimeError" in first.stderr
    assert Store(*s3_bucket).exists("runs/run-f/rehearsal-failed-at-2")
    assert _run(["-m", "verl_grpo.trainers.verl.restore"], env).returncode == 0
    second = _run(["-m", MODULE, *overrides], env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "continuing at step 2" in second.stdout  # step 1's commit finished before the failed process exited
    assert [p.step for p in _steps(second.stdout)] == [2]


def test_wandb_rejects_a_bad_project_name_as_wandb_init_would(tiny_model_dir, data_files, s3_bucket, tmp_path,
                                                             capsys):
    """With WANDB_API_KEY the plan adds the wandb logger, and verl passes trainer.project_name to wandb.init: the
    plan's own name (`verl-grpo-gsm8k`) passes W&B's check, the experiment name `verl-grpo/gsm8k` (what the plan
    passed before) kills the run at start-up, as on a cluster."""
    from verl_grpo_rehearsal.main_ppo_cpu import load_config, wandb_project_error

    cfg = tiny_cpu_run(tiny_model_dir, *RUN)
    overrides, _, _ = _plan(cfg, data_files, s3_bucket, tmp_path, "run-w", env={"WANDB_API_KEY": "x"})
    assert any(o.startswith("trainer.logger=") and "wandb" in o for o in overrides)
    assert str(load_config(overrides).trainer.project_name) == "verl-grpo-gsm8k"
    assert wandb_project_error("verl-grpo-gsm8k") is None

    bad = tiny_cpu_run(tiny_model_dir, *RUN, verl_extra=[f"trainer.project_name={cfg.experiment_name}"])
    overrides_bad, _, _ = _plan(bad, data_files, s3_bucket, tmp_path, "run-w", env={"WANDB_API_KEY": "x"})
    from verl_grpo_rehearsal.main_ppo_cpu import main

    assert main(overrides_bad) == 1
    err = capsys.readouterr().err
    assert "Invalid project name 'verl-grpo/gsm8k'" in err and "cannot contain characters" in err
