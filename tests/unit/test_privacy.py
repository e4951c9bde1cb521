"""The telemetry switches: set where unset, a user's own setting kept (in this process and in child envs)."""

from __future__ import annotations

from verl_grpo.privacy import QUIET_ENV, apply_quiet_env, export_lines, quiet_env


def test_apply_sets_what_is_unset_and_keeps_an_opt_in():
    environ = {"MLFLOW_DISABLE_TELEMETRY": "false", "PATH": "/bin"}
    apply_quiet_env(environ)
    assert environ == {**QUIET_ENV, "MLFLOW_DISABLE_TELEMETRY": "false", "PATH": "/bin"}


def test_child_env_carries_the_callers_choice_and_nothing_else():
    env = quiet_env({"HF_HUB_DISABLE_TELEMETRY": "0", "WANDB_API_KEY": "sekret"})
    assert env == {**QUIET_ENV, "HF_HUB_DISABLE_TELEMETRY": "0"}


def test_export_lines_name_only_what_the_shell_lacks():
    lines = export_lines({"DO_NOT_TRACK": "1", "RAY_USAGE_STATS_ENABLED": "1"})
    assert "export MLFLOW_DISABLE_TELEMETRY=true" in lines
    assert not [line for line in lines if "DO_NOT_TRACK" in line or "RAY_USAGE" in line]
    assert len(lines) == len(QUIET_ENV) - 2
