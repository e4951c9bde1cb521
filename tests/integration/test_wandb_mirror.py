"""W&B mirror: offline mode (no network) receives the same curves; the API key never reaches params or tags."""

from __future__ import annotations

import json

from verl_grpo.config import load_config
from verl_grpo.registry.secrets import assert_no_secrets
from verl_grpo.registry.wandb_mirror import mirror_to_wandb, wandb_enabled


def test_disabled_without_key(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert not wandb_enabled()
    assert mirror_to_wandb(load_config([], env={}), "r1", [], {}) is None


def test_offline_mirror_logs_curves(monkeypatch, tmp_path):
    key = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("WANDB_API_KEY", key)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = load_config(["gsm8k"], env={})
    lines = [json.dumps({"step": s, "reward": 0.1 * s, "kl": 0.0}) for s in (1, 2, 3)]
    where = mirror_to_wandb(cfg, "run-w", lines, {"eval/accuracy": 0.25})
    assert where
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files)
    for p in files:
        assert key not in p.read_bytes().decode(errors="ignore"), f"API key leaked into {p}"
    assert_no_secrets(cfg.flat(), "params")
