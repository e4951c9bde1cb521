"""The `verl-grpo` console script: help, validate, prepare, score, error exit codes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli.main import main

COMMANDS = ["run", "prepare", "train", "evaluate", "register", "validate", "score", "launch", "models"]


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


def test_score_file(cli, tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps({"solution_str": "<think>6*7</think><answer>42</answer>", "ground_truth": "42"}) + "\n")
    result = cli("score", "--dataset", "gsm8k", str(f))
    assert result.exit_code == 0
    assert json.loads(result.output)["score"]["score"] == pytest.approx(1.0)


def test_launch_dry_run_prints_yaml_and_cost(cli):
    result = cli("launch", "-c", "gsm8k", "-o", "infra.accelerators=H100:8", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "main_ppo" in result.output and "algorithm.adv_estimator=grpo" in result.output
    assert "Cost estimate" in result.output and "gpu_8x_h100" in result.output
    assert "nothing was launched" in result.output


def test_launch_dry_run_rejects_bad_accelerator(cli):
    result = cli("launch", "-c", "gsm8k", "-o", "infra.accelerators=H10:8", "--dry-run")
    assert result.exit_code == 2
    assert "infra.accelerators" in result.output and "H100" in result.output
