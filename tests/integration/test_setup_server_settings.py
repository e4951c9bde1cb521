"""`make serve`'s setup script names a bad VERL_GRPO_ZOMBIE_AFTER_S in one line before it talks to Prefect."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_setup_server_names_a_bad_zombie_timeout_in_one_line(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}, "HOME": str(tmp_path),
           "VERL_GRPO_ZOMBIE_AFTER_S": "soon", "PREFECT_API_URL": "http://127.0.0.1:9/api"}  # the setting fails first
    done = subprocess.run([sys.executable, str(REPO / "infra" / "prefect" / "setup_server.py")], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith("error (ConfigError): VERL_GRPO_ZOMBIE_AFTER_S='soon' is not a whole number")
    assert done.stderr.count("\n") == 1, done.stderr
