"""The `verl-grpo` console script: help, validate, prepare, score, error exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from verl_grpo_cli.main import main

COMMANDS = ["run", "prepare", "train", "evaluate", "register", "validate", "score", "launch", "models", "jobs"]


@pytest.fixture
def cli(tmp_path):
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(main, list(args), catch_exceptions=False)

    return invoke


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(cli, command):
    result = cli(command, "--help")
    assert result.exit_code == 0 and "Usage:" in result.output


def test_validate_ok_and_misspelled_key(cli, tiny_model_dir):
    ok = cli("validate", "-c", "configs/gsm8k.yaml", "-o", f"model.name={tiny_model_dir}")
    assert ok.exit_code == 0, ok.output
    assert "config OK" in ok.output and "[ok] trainer" in ok.output
    bad = cli("validate", "-c", "configs/gsm8k.yaml", "-o", "algorithm.rolouts=8")
    assert bad.exit_code == 2
    assert "rollouts" in bad.output


def test_validate_reports_missing_data(cli, tmp_path):
    result = cli("validate", "-c", "mbpp", "-o", f"dataset.mirror_dir={tmp_path}", "-o", "dataset.source=mirror",
                 "-o", "model.name=tiny")
    assert result.exit_code == 2
    assert "[FAIL] data" in result.output and "dataset.mirror_dir" in result.output


def test_prepare_prints_manifest(cli):
    result = cli("prepare", "--dataset", "mbpp", "-o", "model.name=tiny")
    assert result.exit_code == 0, result.output
    manifest = json.loads(result.output[result.output.index("{"):])
    assert manifest["name"] == "mbpp" and manifest["counts"]["test"] > 450


def test_prepare_with_a_model_whose_tokenizer_cannot_load_is_one_line(cli, tmp_path):
    """As `verl-grpo prepare --dataset gsm8k` offline (the cluster profile's HF model is not here): no traceback, one
    line naming model.name and what to use instead."""
    (tmp_path / "config.json").write_text('{"model_type": "no-such-model-type"}')  # no tokenizer transformers knows
    result = cli("prepare", "--dataset", "mbpp", "-o", f"model.name={tmp_path}")
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error ")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    assert f"model.name '{tmp_path}': its tokenizer could not be loaded" in errors[0] and "-c local" in errors[0]


def test_score_file(cli, tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps({"solution_str": "<think>6*7</think><answer>42</answer>", "ground_truth": "42"}) + "\n")
    result = cli("score", "--dataset", "gsm8k", str(f))
    assert result.exit_code == 0
    assert json.loads(result.output)["score"]["score"] == pytest.approx(1.0)


def test_launch_dry_run_prints_yaml_and_cost(cli, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake-secret")
    result = cli("launch", "-c", "gsm8k", "-o", "infra.accelerators=H100:8", "-o", "storage.uri=s3://bucket/prefix",
                 "--dry-run")
    assert result.exit_code == 0, result.output
    assert "main_ppo" in result.output and "algorithm.adv_estimator=grpo" in result.output
    assert "Cost estimate" in result.output and "gpu_8x_h100" in result.output
    assert "nothing was launched" in result.output


def test_launch_dry_run_rejects_bad_accelerator(cli):
    result = cli("launch", "-c", "gsm8k", "-o", "infra.accelerators=H10:8", "--dry-run")
    assert result.exit_code == 2
    assert "infra.accelerators" in result.output and "H100" in result.output


def test_run_with_an_unknown_run_id_fails_in_one_line_before_anything_starts(tmp_path):
    """The real console entry point: a resume of a run the store does not know never becomes a fresh run."""
    home = tmp_path / "home"
    env = {**os.environ, "VERL_GRPO_HOME": str(home)}
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run([sys.executable, "-m", "verl_grpo_cli", "run", "-c", "gsm8k", "-c", "local", "--run-id",
                           "does-not-exist"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "RunNotFound" in lines[0] and "'does-not-exist'" in lines[0]
    assert f"file://{home}/store" in lines[0] and "--fresh" in lines[0]
    assert list((home / "store").iterdir()) == []  # no run record, config or dataset: nothing was started
    assert not (home / "work" / "does-not-exist").exists()
    assert list((home / "prefect").iterdir()) == []  # Prefect never started


def test_fresh_with_a_run_id_starts_that_run_and_refuses_it_the_second_time(cli, tmp_path, monkeypatch):
    from verl_grpo import runs
    from verl_grpo.config import config_files, load_config
    from verl_grpo.store import Store

    monkeypatch.setenv("VERL_GRPO_HOME", str(tmp_path / "home"))
    overrides = ["model.name=tiny", f"storage.uri=file://{tmp_path / 'store'}"]
    cfg = load_config(config_files(["gsm8k"]), overrides)
    store = Store.from_config(cfg.storage)
    runs.begin_run(store, cfg, "mine", fresh=True)
    again = cli("run", "-c", "gsm8k", "-o", overrides[0], "-o", overrides[1], "--run-id", "mine", "--fresh")
    assert again.exit_code == 2 and "already exists" in again.output and "runs/mine/run.json" in again.output


def test_launch_rehearse_refuses_a_run_id_to_resume(cli):
    result = cli("launch", "-c", "gsm8k", "-c", "local", "--rehearse", "--run-id", "gsm8k-x-0101")
    assert result.exit_code == 2 and "empty rehearsal store" in result.output
