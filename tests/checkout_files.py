"""The checkout's untracked and ignored files: what a run must leave as it found them."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def checkout_status() -> list[str]:
    """Every untracked and ignored file of the checkout, one line each; aside: the venv, bytecode caches and the
    suite's own model cache (`.state/test-models`, tests/conftest.py), which tests on other workers fill meanwhile
    (a run under test has its own VERL_GRPO_HOME and model cache: tests/user_env.py drops the suite's)."""
    done = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all", "--", ".",
                           ":(exclude).venv", ":(exclude).state/test-models"], cwd=REPO, capture_output=True,
                          text=True, check=True)
    return sorted(line for line in done.stdout.splitlines()
                  if "__pycache__/" not in line and ".pytest_cache/" not in line)
