"""W&B mirror: offline mode (no network) receives the same curves; the API key never reaches params or tags."""

from __future__ import annotations

import json
import os

from verl_grpo.config import load_config
from verl_grpo.mirrors import RunMetrics, enabled_mirrors, send_all
from verl_grpo.mirrors.wandb_mirror import QUIET_ENV, wandb_enabled
from verl_grpo.registry.secrets import assert_no_secrets


def test_disabled_without_key(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert not wandb_enabled()
    assert enabled_mirrors() == []
    assert send_all(RunMetrics(load_config([], env={}), "r1", [], {})) == []
    assert not wandb_enabled({"WANDB_API_KEY": "0" * 40, "WANDB_MODE": "disabled"})


def test_offline_mirror_logs_curves(monkeypatch, tmp_path):
    key = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("WANDB_API_KEY", key)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.delenv("WANDB_ERROR_REPORTING", raising=False)
    cfg = load_config(["gsm8k"], env={})
    lines = [json.dumps({"step": s, "reward": 0.1 * s, "kl": 0.0}) for s in (1, 2, 3)]
    [result] = send_all(RunMetrics(cfg, "run-w", lines, {"eval.accuracy": 0.25}))
    assert result.ok and result.where, result
    assert all(os.environ.get(k) == v for k, v in QUIET_ENV.items())  # set before wandb was imported
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files)
    for p in files:
        assert key not in p.read_bytes().decode(errors="ignore"), f"API key leaked into {p}"
    assert_no_secrets(cfg.flat(), "params")
