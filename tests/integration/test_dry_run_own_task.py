"""The GPU dry run of a task of your own and of a reasoning-gym task, offline, through verl's compose and SkyPilot's
loaders: the reward file (rows in one temp dir, reward in another, both outside the checkout) is shown shipped to the
nodes that score, imported in their package set and scoring a sample row there; a reward that imports what the nodes
lack fails it in one line; a reasoning-gym run renders with reasoning-gym installed wherever its rows are scored.

One dry run is `verl-grpo launch ... --dry-run` as a user types it; the others call `dry_run` in-process (the same
function the command calls) to keep the suite short."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from verl_grpo.config import load_config
from verl_grpo.providers.skypilot.dry_run import DryRunFailed, dry_run
from verl_grpo.providers.skypilot.templates import locked_version

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "own-task"
FAKE_KEY_ID, FAKE_SECRET = "AKIAFAKEFAKEFAKEFAKE", "fake/secret+value/for/the/dry/run/only00"
ENV = {"AWS_ACCESS_KEY_ID": FAKE_KEY_ID, "AWS_SECRET_ACCESS_KEY": FAKE_SECRET}
GPU = ["infra.accelerators=H100:1", "storage.uri=s3://bucket/prefix"]


@pytest.fixture(scope="module")
def own_task(tmp_path_factory) -> tuple[Path, Path]:
    """The example task's rows in one temp dir and its reward in another."""
    rows, reward = tmp_path_factory.mktemp("rows"), tmp_path_factory.mktemp("reward")
    for name in ("train.jsonl", "test.jsonl"):
        shutil.copy(EXAMPLE / name, rows / name)
    shutil.copy(EXAMPLE / "sums_reward.py", reward / "sums_reward.py")
    return rows, reward


def task_overrides(rows: Path, reward: Path) -> list[str]:
    return ["dataset.name=custom", "dataset.task=sums", f"dataset.train_files=[{rows / 'train.jsonl'}]",
            f"dataset.test_files=[{rows / 'test.jsonl'}]", f"reward.path={reward}"]


def test_a_task_of_your_own_dry_runs_showing_its_reward_shipped_and_scoring_a_row_on_the_nodes(own_task, tmp_path):
    rows, reward = own_task
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WANDB_"))}
    clean["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), clean.get("PYTHONPATH")) if p)
    args = [a for o in [*task_overrides(rows, reward / "sums_reward.py"), *GPU] for a in ("-o", o)]
    done = subprocess.run([sys.executable, "-m", "verl_grpo_cli", "launch", *args, "--dry-run"], cwd=tmp_path,
                          env={**clean, **ENV}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line.removeprefix("  - ") for line in done.stdout.splitlines() if line.startswith("  - reward: ")]
    shipped, imports, scored = lines
    assert f"{reward}/sums_reward.py ships through the store (s3://bucket/prefix/rewards/" in shipped
    assert "to /tmp/verl-grpo/rewards/" in shipped and "verl's reward loop" in shipped and "the vLLM eval" in shipped
    assert imports.startswith("reward: sums_reward.py imports re (stdlib)")
    assert "scored a sample row there: data_source 'sums', response '<think>" in scored
    assert "'correct': 1.0, 'answered': 1.0}" in scored and "components correct, answered" in scored
    yaml_text = done.stdout.split("Checks passed:")[0]
    assert yaml_text.count("python -m verl_grpo.trainers.verl.reward_fetch s3://bucket/prefix/rewards/") == 2
    assert "'+reward.custom_reward_function.reward_kwargs.components=[" in yaml_text
    assert str(reward) not in yaml_text and str(rows) not in yaml_text  # nothing of this machine's paths
    assert FAKE_SECRET not in done.stdout + done.stderr and FAKE_KEY_ID not in done.stdout + done.stderr


@pytest.mark.parametrize("imports, failure", [
    ("import mlflow\n", "imports mlflow, which the setup of verl-grpo-dry-run, verl-grpo-dry-run-eval does not "
                        "install; add mlflow's distribution to skypilot.node_packages"),
    ("", "imports prefect, which the nodes of verl-grpo-dry-run, verl-grpo-dry-run-eval do not install (the dry run "
         "imported it in their package set); add prefect's distribution to skypilot.node_packages"),
])
def test_a_reward_importing_what_the_nodes_lack_fails_the_dry_run_in_one_line(own_task, tmp_path, imports, failure):
    rows, _ = own_task
    reward = tmp_path / "needs_more.py"
    reward.write_text(f"{imports}\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    import prefect  # in the function: only the sample row's call shows it is missing\n"
                      "    return 1.0\n")
    with pytest.raises(DryRunFailed) as e:
        dry_run(load_config([], ["trainer.backend=verl", "infra.provider=skypilot", *task_overrides(rows, reward),
                                 *GPU]), env=ENV)
    (line,) = e.value.failures
    assert failure in line and str(reward) in line
    fixed = load_config([], ["trainer.backend=verl", "infra.provider=skypilot", *task_overrides(rows, reward), *GPU,
                             "skypilot.node_packages=[prefect==3.8.8, mlflow==3.17.2]"])
    report = dry_run(fixed, env=ENV)
    assert "uv pip install" in report.yamls["eval"] and "prefect==3.8.8" in report.yamls["eval"]


def test_reasoning_gym_renders_for_gpus_with_reasoning_gym_on_every_node_that_scores(own_task):
    report = dry_run(load_config([], ["trainer.backend=verl", "infra.provider=skypilot",
                                      "dataset.name=reasoning_gym", *GPU]), env=ENV)
    pin = f"reasoning-gym=={locked_version('reasoning-gym')}"
    (training,) = [text for name, text in report.yamls.items() if name != "eval"]
    assert pin in training and pin in report.yamls["eval"]
    assert "python -m verl_grpo.trainers.verl.preflight " in training and " reasoning_gym " in training
    assert any(c.startswith(f"reasoning_gym: every task that scores its rows installs {pin}") for c in report.checks)
    assert "reward.custom_reward_function.path=pkg://verl_grpo.rewards " in training
