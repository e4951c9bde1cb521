"""The env vars that are settings but no config field (reward client, nightly schedule, zombie timeout): unset keeps
the default; empty, blank or unparseable fails in one line naming the variable."""

from __future__ import annotations

import re

import pytest

from verl_grpo.errors import ConfigError
from verl_grpo.services.reward_client import RETRIES_ENV, TIMEOUT_ENV, _client_settings
from verl_grpo_flows.deploy_steps import (
    NIGHTLY_ORDER,
    flow_run_environment,
    gpu_overrides,
    gpu_store,
    nightly_schedule,
    nightly_schedules,
)

SETTINGS = {  # variable: (what reads it, bad values, a good value and what it reads as)
    TIMEOUT_ENV: (lambda: _client_settings()["timeout_s"], ["soon", "0", "-1"], ("2.5", 2.5)),
    RETRIES_ENV: (lambda: _client_settings()["retries"], ["many", "1.5", "-1"], ("0", 0)),
    "VERL_GRPO_NIGHTLY_CRON": (lambda: nightly_schedule()["cron"], ["every night", "61 2 * * *", "*/5 * * * *",
                                                                     "0,30 2 * * *", "@daily"],
                               ("30 1 * * *", "30 1 * * *")),
    "VERL_GRPO_NIGHTLY_TZ": (lambda: nightly_schedule()["timezone"], ["Mars/Olympus", "../etc"],
                             ("Europe/Berlin", "Europe/Berlin")),
    "VERL_GRPO_NIGHTLY_ACTIVE": (lambda: nightly_schedule()["active"], ["maybe", "2"], ("false", False)),
    "VERL_GRPO_GPU_STORE": (lambda: gpu_store()["uri"], ["bucket/prefix", "file:///tmp/store", "s3://", "s3://B_ad/x"],
                            ("s3://my-bucket/verl/", "s3://my-bucket/verl")),
    "VERL_GRPO_GPU_STORE_ENDPOINT": (lambda: gpu_store()["endpoint_url"], ["minio:9000", "ftp://host"],
                                     ("https://r2.example.com", "https://r2.example.com")),
}
DEFAULTS = {TIMEOUT_ENV: 60.0, RETRIES_ENV: 4, "VERL_GRPO_NIGHTLY_CRON": "0 2 * * *", "VERL_GRPO_NIGHTLY_TZ": "UTC",
            "VERL_GRPO_NIGHTLY_ACTIVE": True, "VERL_GRPO_GPU_STORE": None, "VERL_GRPO_GPU_STORE_ENDPOINT": None}


@pytest.fixture(autouse=True)
def _unset(monkeypatch):
    for var in SETTINGS:
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("var", list(SETTINGS))
def test_unset_keeps_the_default_and_a_good_value_applies(var, monkeypatch):
    read, _, (raw, expected) = SETTINGS[var]
    assert read() == DEFAULTS[var]
    monkeypatch.setenv(var, raw)
    assert read() == expected


@pytest.mark.parametrize("value", ["", "  "])
@pytest.mark.parametrize("var", list(SETTINGS))
def test_empty_is_one_line_naming_the_variable(var, value, monkeypatch):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=rf"^{var} is set but empty; unset it to use the default") as err:
        SETTINGS[var][0]()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("var, value", [(var, bad) for var, (_, bads, _) in SETTINGS.items() for bad in bads])
def test_a_value_that_does_not_parse_is_one_line_naming_the_variable(var, value, monkeypatch):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=rf"^{var}={re.escape(repr(value))} is not ") as err:
        SETTINGS[var][0]()
    assert "\n" not in str(err.value)


def test_deploying_checks_the_schedule_first(monkeypatch):
    monkeypatch.setenv("VERL_GRPO_NIGHTLY_CRON", " ")
    with pytest.raises(ConfigError, match="^VERL_GRPO_NIGHTLY_CRON is set but empty"):
        flow_run_environment()


def test_deploying_checks_the_gpu_store_first(monkeypatch):
    monkeypatch.setenv("VERL_GRPO_GPU_STORE", "my-bucket")
    with pytest.raises(ConfigError, match="^VERL_GRPO_GPU_STORE='my-bucket' is not an s3://bucket/prefix"):
        flow_run_environment()


def test_nightly_runs_start_a_minute_apart_and_gpu_ones_are_paused_without_a_store(monkeypatch):
    monkeypatch.setenv("VERL_GRPO_NIGHTLY_CRON", "58 1 * * 1-5")
    schedules = nightly_schedules()
    assert list(schedules) == list(NIGHTLY_ORDER)
    assert [s["cron"] for s in schedules.values()] == [f"{m} 1 * * 1-5" for m in (58, 59, 0, 1, 2, 3)]
    assert {name: s["active"] for name, s in schedules.items()} == {
        "gsm8k": True, "math": True, "mbpp": True, "gsm8k-gpu": False, "math-gpu": False, "mbpp-gpu": False}
    # a paused schedule says why, at the end of its deployment's description
    assert schedules["gsm8k"]["note"] == "" and "VERL_GRPO_GPU_STORE" in schedules["gsm8k-gpu"]["note"]
    assert "storage.uri" not in " ".join(gpu_overrides()["overrides"])

    monkeypatch.setenv("VERL_GRPO_GPU_STORE", "s3://my-bucket/verl")
    assert all(s["active"] for s in nightly_schedules().values())
    assert gpu_overrides()["overrides"] == ["infra.provider=skypilot", "trainer.backend=verl",
                                            "warm_start.enabled=false", "storage.uri=s3://my-bucket/verl"]
    monkeypatch.setenv("VERL_GRPO_NIGHTLY_ACTIVE", "false")
    assert not any(s["active"] for s in nightly_schedules().values())
    notes = {s["note"] for s in nightly_schedules().values()}
    assert notes == {" Nightly schedule paused: VERL_GRPO_NIGHTLY_ACTIVE is false."}
