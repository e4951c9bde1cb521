"""A node's entry point as SkyPilot runs it, against a store it cannot reach: after its retry budget it ends with the
one exit code the task's `recover_on_exit_codes` names (a transient failure SkyPilot recovers uncounted), in one line;
a missing setting ends with the user-error code, which is not recovered."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ports import free_port

from verl_grpo.providers.skypilot.templates import RECOVER_ON_EXIT_CODES
from verl_grpo.trainers.exits import EXIT_USER_ERROR

REPO = Path(__file__).resolve().parents[2]


def _restore(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(REPO), "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "y", "AWS_MAX_ATTEMPTS": "1"}
    return subprocess.run([sys.executable, "-m", "verl_grpo.trainers.verl.restore"], env={**base, **env},
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_an_unreachable_store_ends_the_restore_with_the_recovered_exit_code(tmp_path):
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = _restore(tmp_path, VERL_GRPO_STORE_URI="s3://bucket/store", VERL_GRPO_STORE_ENDPOINT=endpoint,
                    AWS_ENDPOINT_URL=endpoint, VERL_GRPO_RUN_ID="r1", VERL_GRPO_CHECKPOINT_DIR=str(tmp_path / "ck"))
    assert done.returncode in RECOVER_ON_EXIT_CODES, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("verl_restore: InfraError: checkpoint store s3://bucket/store: list checkpoints still "
                           "failing after") and "EndpointConnectionError" in last
    assert "Traceback" not in done.stderr


def test_a_missing_setting_is_a_user_error_not_recovered(tmp_path):
    done = _restore(tmp_path)
    assert done.returncode == EXIT_USER_ERROR and done.returncode not in RECOVER_ON_EXIT_CODES
    assert done.stderr.strip().splitlines()[-1].startswith("verl_restore: ConfigError: VERL_GRPO_STORE_URI")
