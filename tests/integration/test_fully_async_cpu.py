"""`python -m verl_grpo_rehearsal.fully_async_cpu`: the rollout group's verl fully-async entry stood in on a CPU, with
the overrides `VerlTrainer.plan` composes for the shape; checkpoints numbered by weight sync and committed through
our StoreCheckpointCallback to a moto S3 store."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from run_configs import prepared_files, tiny_cpu_run

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.store import Store
from verl_grpo.trainers.verl.fully_async import fully_async_overrides
from verl_grpo.trainers.verl.overrides import run_paths
from verl_grpo.trainers.verl.settings import checkpoint_env

REPO = Path(__file__).resolve().parents[2]
BATCH, SYNC, STEPS = 2, 2, 4
RUN = ("algorithm.max_prompt_length=160", "algorithm.max_response_length=8", f"algorithm.train_batch_size={BATCH}",
       f"algorithm.total_steps={STEPS}", f"algorithm.save_freq={SYNC}", "infra.provider=skypilot",
       "infra.accelerators=H100:1", "skypilot.shape=rollout_group",
       "services=[data, replay]",  # rewards by verl_grpo.rewards in-process: no reward-server here
       f"async_training.trigger_parameter_sync_step={SYNC}")


@pytest.fixture(scope="module")
def data_files(tiny_model_dir, data_mirror, tmp_path_factory) -> dict[str, str]:
    return prepared_files(tiny_model_dir, RUN, tmp_path_factory.mktemp("data-store"))


def test_stand_in_trains_one_step_per_weight_sync_and_commits_versions(tiny_model_dir, data_files, s3_bucket,
                                                                       tmp_path):
    cfg = tiny_cpu_run(tiny_model_dir, *RUN)
    uri, endpoint = s3_bucket
    ckpt = tmp_path / "checkpoints" / "run-fa"
    paths = replace(run_paths(cfg, str(ckpt)), model_path=cfg.model.name)
    overrides = fully_async_overrides(cfg, data_files, paths, "run-fa", env={})
    env = {**os.environ, **checkpoint_env(uri, endpoint, "run-fa", str(ckpt), cfg.storage.keep_last),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "PYTHONPATH": str(REPO),
           "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    (ckpt / "metrics").mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "verl_grpo_rehearsal.fully_async_cpu", *overrides], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "stood in by verl_grpo_rehearsal.fully_async_cpu" in out and "trigger_parameter_sync_step=2" in out

    prompts = {}
    for line in out.splitlines():
        if line.startswith("rehearsal: step "):
            _, _, step, _, ids = line.split(" ", 4)
            prompts[int(step)] = ids.split(",")
    assert sorted(prompts) == [1, 2]  # 4 optimizer steps = 2 parameter versions
    ids = [i for v in prompts.values() for i in v]
    assert len(ids) == STEPS * BATCH and len(set(ids)) == len(ids)

    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "2"
    for version in (1, 2):
        assert (ckpt / f"global_step_{version}" / "data.pt").is_file()
    checkpoints = CheckpointStore(Store(uri, endpoint))
    assert checkpoints.latest_complete("run-fa").step == 2
    assert checkpoints.manifest("run-fa", 2)["state"]["prompts_consumed"] == STEPS * BATCH
