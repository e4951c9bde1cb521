"""Optional mirrors are optional: a bad WANDB_API_KEY fails before anything is spent (one line, exit 2); a W&B
server that is down after training never fails the registration (one warning, in the summary) and
`verl-grpo mirror` sends the run again. W&B is always a closed port on 127.0.0.1 or offline: nothing leaves the host."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys

import loopback_only
import pytest
from mlflow.tracking import MlflowClient
from registry_runs import correct_first, make_env, make_run, outcome, register

from verl_grpo import plain_steps
from verl_grpo.errors import ConfigError
from verl_grpo.summary import summary_dict, summary_markdown

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHORT_KEY = "sh0rtk3y"
GOOD_KEY = "0123456789abcdef0123456789abcdef0badc0de"  # 40 characters: wandb's shape, no account behind it


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def wandb_down(monkeypatch, tmp_path):
    """A well-shaped key and a W&B server URL on which nothing listens; WANDB_* from the shell removed."""
    for var in [v for v in os.environ if v.startswith("WANDB_")]:
        monkeypatch.delenv(var)
    url = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # as every entry point sets it (verl_grpo/privacy.py)
    monkeypatch.setenv("WANDB_API_KEY", GOOD_KEY)
    monkeypatch.setenv("WANDB_BASE_URL", url)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    (tmp_path / "wandb").mkdir()
    outside = loopback_only.watch()
    yield url
    loopback_only.stop()
    assert outside == [], f"tried non-loopback addresses: {outside}"


def _cli(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    full, outside_log = loopback_only.subprocess_env(
        tmp_path, {**base, "PYTHONPATH": REPO, **env})
    done = subprocess.run([sys.executable, "-m", "verl_grpo_cli", *args], cwd=REPO, env=full, capture_output=True, text=True,
                          timeout=300)
    assert not outside_log.exists(), f"tried non-loopback addresses: {outside_log.read_text()}"
    return done


def _lines(done: subprocess.CompletedProcess) -> list[str]:
    return (done.stdout + done.stderr).splitlines()


def test_the_subprocess_guard_sees_a_non_loopback_attempt(tmp_path):
    env, log = loopback_only.subprocess_env(tmp_path, dict(os.environ))
    code = "import sys; sys.audit('socket.getaddrinfo', 'api.wandb.ai', 443, 0, 0, 0)"  # the event only, no lookup
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert "api.wandb.ai" in log.read_text()


def test_validate_fails_in_one_line_on_a_short_key(tmp_path):
    done = _cli(tmp_path, "validate", "-c", "gsm8k", "-c", "local", WANDB_API_KEY=SHORT_KEY,
                WANDB_BASE_URL=f"http://127.0.0.1:{_closed_port()}")

    assert done.returncode == 2, done.stdout + done.stderr
    naming = [line for line in _lines(done) if "WANDB_API_KEY" in line]
    assert len(naming) == 1, _lines(done)
    assert "40+ characters" in naming[0] and "https://wandb.ai/authorize" in naming[0]
    assert SHORT_KEY not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def test_validate_warns_once_when_the_login_cannot_be_checked(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}"
    done = _cli(tmp_path, "validate", "-c", "gsm8k", "-c", "local", WANDB_API_KEY=GOOD_KEY, WANDB_BASE_URL=url)

    assert done.returncode == 0, done.stdout + done.stderr
    unchecked = [line for line in _lines(done) if "could not be checked" in line]
    assert len(unchecked) == 1 and url in unchecked[0] and "Connection refused" in unchecked[0], _lines(done)
    assert GOOD_KEY not in done.stdout + done.stderr


def test_resolve_fails_on_a_short_key_before_the_run_begins(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_API_KEY", SHORT_KEY)
    store = tmp_path / "store"
    with pytest.raises(ConfigError, match="WANDB_API_KEY") as caught:
        plain_steps.resolve(["gsm8k", "local"], [f"storage.uri=file://{store}"])
    assert SHORT_KEY not in str(caught.value) and "\n" not in str(caught.value)
    assert not (store / "runs").exists()


def test_a_mirror_down_after_training_never_fails_the_registration(wandb_down, tmp_path, tiny_model_dir, caplog,
                                                                   capsys):
    cfg, store, dataset = make_env(tmp_path)
    train, report, base = make_run(store, tiny_model_dir, "run-a", correct_first(10))

    with caplog.at_level(logging.INFO):
        version = register(cfg, store, dataset, train, report, base)

    assert (version.version, version.aliases) == ("1", ["champion"])
    [mirrored] = version.mirrors
    assert (mirrored.name, mirrored.ok) == ("wandb", False)
    assert wandb_down in mirrored.reason and "Connection refused" in mirrored.reason
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("verl_grpo")]
    assert len(warnings) == 1 and "wandb mirror failed" in warnings[0]
    assert "verl-grpo mirror --run-id run-a" in warnings[0]
    output = capsys.readouterr()
    assert "Traceback" not in caplog.text + output.out + output.err
    assert GOOD_KEY not in caplog.text + output.out + output.err

    run = MlflowClient(cfg.tracking.mlflow_uri).get_run(version.mlflow_run_id)
    assert run.data.tags["mirror.wandb"].startswith("failed: W&B login failed")
    assert "wandb_url" not in run.data.tags
    assert all(GOOD_KEY not in str(v) for v in [*run.data.tags.values(), *run.data.params.values()])

    summary = summary_dict(outcome(cfg, dataset, train, report, base, version=version))
    assert summary["warnings"] == [warnings[0]] and summary["mirrors"] == "wandb FAILED"
    assert f"**Warning:** {warnings[0]}" in summary_markdown(summary, "link")


def test_mirror_command_fails_in_one_line_then_sends_offline(wandb_down, tmp_path, tiny_model_dir):
    cfg, store, dataset = make_env(tmp_path)
    train, report, base = make_run(store, tiny_model_dir, "run-a", correct_first(10))
    first = register(cfg, store, dataset, train, report, base)
    assert not first.mirrors[0].ok
    where = ["--run-id", "run-a", "-o", f"storage.uri={store.uri}", "-o", f"tracking.mlflow_uri={cfg.tracking.mlflow_uri}"]
    wandb_env = {"WANDB_API_KEY": GOOD_KEY, "WANDB_BASE_URL": wandb_down, "WANDB_DIR": str(tmp_path / "wandb")}

    down = _cli(tmp_path, "mirror", *where, **wandb_env)
    assert down.returncode == 1, down.stdout + down.stderr
    assert len(_lines(down)) == 1 and "wandb mirror failed" in down.stderr and "Connection refused" in down.stderr

    offline = _cli(tmp_path, "mirror", *where, **wandb_env, WANDB_MODE="offline")
    assert offline.returncode == 0, offline.stdout + offline.stderr
    assert offline.stdout.startswith("wandb: ") and "Traceback" not in offline.stderr
    tags = MlflowClient(cfg.tracking.mlflow_uri).get_run(first.mlflow_run_id).data.tags
    assert tags["mirror.wandb"] == "ok" and tags["wandb_url"] == offline.stdout.split(": ", 1)[1].strip()
    files = [p for p in (tmp_path / "wandb").rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files)
    assert all(GOOD_KEY not in p.read_bytes().decode(errors="ignore") for p in files)
    assert GOOD_KEY not in offline.stdout + offline.stderr + down.stdout + down.stderr


def test_unknown_run_is_one_line(wandb_down, tmp_path):
    cfg, store, _ = make_env(tmp_path)
    done = _cli(tmp_path, "mirror", "--run-id", "nope", "-o", f"storage.uri={store.uri}", "-o",
                f"tracking.mlflow_uri={cfg.tracking.mlflow_uri}", WANDB_MODE="offline")
    assert done.returncode == 2, done.stdout + done.stderr
    ours = [line for line in _lines(done) if "mlflow.store.db" not in line]  # MLflow's note that it made the DB
    assert len(ours) == 1 and "run nope is not registered" in ours[0] and "Traceback" not in done.stderr
