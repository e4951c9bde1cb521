"""Where a run's code came from (recorded as MLflow tags)."""

from __future__ import annotations

import subprocess

from verl_grpo.local_paths import repo_root


def git_sha() -> str:
    """HEAD of the checkout this package runs from, with `-dirty` when it has uncommitted changes; '' when unknown."""
    root = repo_root()
    if root is None:
        return ""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    if sha.returncode != 0:
        return ""
    return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
