"""SkyPilot YAML rendering: golden files for the three shapes; secrets by name only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from verl_grpo.config import load_config
from verl_grpo.contracts import TrainSpec
from verl_grpo.providers.skypilot import templates
from verl_grpo.trainers.verl.settings import checkpoint_env
from verl_grpo.trainers.verl.backend import DATASET_MOUNT_ENV, DATASET_URI_ENV
from verl_grpo.trainers.verl.overrides import VerlPaths, verl_overrides

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
MOUNT = "/tmp/verl-grpo/datasets/gsm8k/abc123"


def _render(shape: str, env: dict[str, str]) -> templates.RenderedTask:
    cfg = load_config([], ["trainer.backend=verl", "infra.provider=skypilot", "infra.accelerators=H100:8",
                           "infra.nodes=2", "infra.spot=true", f"skypilot.shape={shape}", "skypilot.cloud=aws",
                           "storage.uri=s3://bucket/store"])
    files = {"train": f"{MOUNT}/train.parquet", "val": f"{MOUNT}/val.parquet"}
    ov = verl_overrides(cfg, files, VerlPaths("/tmp/verl-grpo/checkpoints/run-1"), "run-1", env=env)
    spec = TrainSpec(backend="verl", run_id="run-1", command=["python", "-m", "verl.trainer.main_ppo", *ov],
                     overrides=ov, total_steps=20,
                     env={DATASET_URI_ENV: "s3://bucket/store/datasets/gsm8k/abc123", DATASET_MOUNT_ENV: MOUNT,
                          "MLFLOW_TRACKING_URI": "sqlite:////tmp/verl-grpo/mlflow.db",
                          **checkpoint_env("s3://bucket/store", None, "run-1", "/tmp/verl-grpo/checkpoints/run-1", 2)})
    return templates.render(cfg, spec, env, workdir="/src/verl-grpo")


@pytest.mark.parametrize("shape", ["multinode", "job_group", "rollout_group"])
def test_matches_golden(shape):
    text = _render(shape, {"WANDB_API_KEY": "sekret-123"}).yaml
    golden = GOLDEN / f"skypilot-{shape}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"rendered YAML differs from {golden}; rerun with UPDATE_GOLDEN=1 if intended"


@pytest.mark.parametrize("shape", ["multinode", "job_group", "rollout_group"])
def test_secrets_by_name_only_and_trainer_is_primary(shape):
    rendered = _render(shape, {"WANDB_API_KEY": "sekret-123", "HF_TOKEN": "hf_abc"})
    assert "sekret-123" not in rendered.yaml and "hf_abc" not in rendered.yaml
    docs = list(yaml.safe_load_all(rendered.yaml))
    tasks = docs[1:] if rendered.is_job_group else docs
    for task in tasks:
        assert task["secrets"] == {"WANDB_API_KEY": None, "HF_TOKEN": None}
        assert not set(task["envs"]) & {"WANDB_API_KEY", "HF_TOKEN"}
    trainer = tasks[-1]
    assert trainer["resources"]["job_recovery"] == {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 3}
    assert trainer["resources"]["use_spot"] is True and trainer["num_nodes"] == 2
    assert trainer["file_mounts"] == {MOUNT: "s3://bucket/store/datasets/gsm8k/abc123"}
    if rendered.is_job_group:
        assert docs[0]["execution"] == "parallel" and docs[0]["primary_tasks"] == ["verl-trainer"]


def test_job_group_services_and_discovery():
    docs = list(yaml.safe_load_all(_render("job_group", {}).yaml))
    names = [d["name"] for d in docs[1:]]
    assert names == ["data-server", "reward-server", "retrieval-server", "verl-trainer"]
    assert "python -m verl_grpo.services.reward_server serve" in docs[2]["run"]
    assert 'http://reward-server-0.${SKYPILOT_JOBGROUP_NAME}:8200' in docs[-1]["run"]
    assert "secrets" not in docs[-1]


def test_trainer_restores_before_and_finalizes_after_main_ppo():
    trainer = list(yaml.safe_load_all(_render("job_group", {}).yaml))[-1]
    run = trainer["run"]
    restore = run.index("python -m verl_grpo.trainers.verl.restore --dataset-uri s3://bucket/store/datasets/gsm8k/abc123")
    train = run.index("python -m verl.trainer.main_ppo")
    finalize = run.index("python -m verl_grpo.trainers.verl.finalize --backend fsdp2 --train-batch-size 8")
    assert restore < run.index('if [ "$SKYPILOT_NODE_RANK" = "0" ]') < train < finalize
    assert trainer["envs"]["VERL_GRPO_STORE_URI"] == "s3://bucket/store"
    assert trainer["envs"]["VERL_GRPO_CHECKPOINT_DIR"] == "/tmp/verl-grpo/checkpoints/run-1"
    assert "trainer.default_local_dir=/tmp/verl-grpo/checkpoints/run-1" in run
    assert trainer["resources"]["ports"] == [8265]


def test_job_name_is_sanitised():
    assert templates.job_name("gsm8k smollm2/2024") == "verl-grpo-gsm8k-smollm2-2024"
