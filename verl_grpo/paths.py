"""Where things live on this machine: the state dir (embedded default) and the local data mirror."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def repo_root() -> Path | None:
    """The checkout this package runs from, when it is installed editable (the normal case)."""
    root = PACKAGE_DIR.parent
    return root if (root / "pyproject.toml").is_file() else None


def state_dir() -> Path:
    """One git-ignored directory for every embedded default: store, MLflow DB, Prefect home, model cache.

    `VERL_GRPO_HOME` moves it; otherwise `<checkout>/.state`, or `~/.verl-grpo` for a non-editable install.
    """
    if env := os.environ.get("VERL_GRPO_HOME"):
        return Path(env).expanduser().resolve()
    root = repo_root()
    return (root / ".state") if root else Path.home() / ".verl-grpo"


def data_mirror_dir() -> Path:
    """Local mirror of public datasets: `VERL_GRPO_DATA_MIRROR`, else `../shared/data` beside the checkout."""
    if env := os.environ.get("VERL_GRPO_DATA_MIRROR"):
        return Path(env).expanduser().resolve()
    root = repo_root() or Path.cwd()
    return (root.parent / "shared" / "data").resolve()


def configs_dir() -> Path:
    """The shipped configs/ directory (gsm8k.yaml, math.yaml, mbpp.yaml, local.yaml)."""
    root = repo_root()
    return (root / "configs") if root else Path.cwd() / "configs"


def model_cache_dir() -> Path:
    """Converted/built Hugging Face model directories, reused across runs."""
    return Path(os.environ.get("VERL_GRPO_MODEL_CACHE", state_dir() / "models")).expanduser().resolve()
