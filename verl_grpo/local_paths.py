"""Where things live on this machine: the state dir (embedded default) and the local data mirror."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from collections.abc import Mapping
from pathlib import Path

from verl_grpo.errors import ConfigError

PACKAGE_DIR = Path(__file__).resolve().parent


def repo_root() -> Path | None:
    """The checkout this package runs from, when it is installed editable (the normal case)."""
    root = PACKAGE_DIR.parent
    return root if (root / "pyproject.toml").is_file() else None


PATH_VARS = ("VERL_GRPO_HOME", "VERL_GRPO_MODEL_CACHE", "VERL_GRPO_DATA_MIRROR", "PREFECT_HOME")
"""The env vars that name a directory of this machine (each has a default when unset)."""


def env_path(var: str) -> Path | None:
    """The absolute directory the env var `var` names (`~` expanded, relative to the working directory), None when
    it is unset; set to nothing or to blanks it is a ConfigError naming it (an empty path would mean the working
    directory)."""
    raw = os.environ.get(var)
    if raw is None:
        return None
    if not raw.strip():
        raise ConfigError(f"{var} is set but empty; unset it to use the default, or set it to a directory")
    return Path(raw).expanduser().resolve()


def pin_env_paths() -> None:
    """Write the path env vars that are set back as absolute paths, so that a child process started in another
    directory (a trainer, a service, Prefect's ephemeral API) resolves them to the same place."""
    for var in PATH_VARS:
        if (path := env_path(var)) is not None:
            os.environ[var] = str(path)


def state_dir() -> Path:
    """One git-ignored directory for every embedded default: store, MLflow DB, Prefect home, model cache.

    `VERL_GRPO_HOME` moves it; otherwise `<checkout>/.state`, or `~/.verl-grpo` for a non-editable install.
    """
    if env := env_path("VERL_GRPO_HOME"):
        return env
    root = repo_root()
    return (root / ".state") if root else Path.home() / ".verl-grpo"


# What libraries expect to find under the state dir before they first touch it (Prefect creates only the last
# level of its home, MLflow's SQLite driver none).
STATE_SUBDIRS = ("prefect", "store", "models", "work", "logs")


def ensure_dir(path: Path, knob: str) -> Path:
    """Create `path` with its parents and check it is writable; else one ConfigError naming `knob` and the fix."""
    try:
        if path.exists() and not path.is_dir():
            raise NotADirectoryError(20, "it is a file, not a directory")
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ConfigError(f"{knob}: cannot create or write {path} ({reason}); point {knob} at a writable "
                          "directory (it is created when missing)") from None
    return path


def ensure_state_dir() -> Path:
    """The state dir and every directory under it that a library expects, created before any library runs; the
    path env vars pinned to absolute paths (`pin_env_paths`)."""
    pin_env_paths()
    root = ensure_dir(state_dir(), "VERL_GRPO_HOME")
    for sub in STATE_SUBDIRS:
        ensure_dir(root / sub, "VERL_GRPO_HOME")
    ensure_dir(model_cache_dir(), "VERL_GRPO_MODEL_CACHE")
    return root


def prefect_home() -> Path:
    """Prefect's home: `PREFECT_HOME`, else `<state dir>/prefect`."""
    return env_path("PREFECT_HOME") or state_dir() / "prefect"


def ensure_local_dirs(uris: Mapping[str, str]) -> None:
    """Create the local directories behind `{config key: URI}` (`file://` stores, `sqlite:///` databases);
    remote URIs are left to their service."""
    for key, uri in uris.items():
        if uri.startswith("file://"):
            ensure_dir(Path(uri.removeprefix("file://")).expanduser(), key)
        elif uri.startswith("sqlite:///"):
            db = Path(uri.removeprefix("sqlite:///")).expanduser()
            ensure_dir(db.parent, key)
            _check_sqlite(db, key)


def _check_sqlite(db: Path, key: str) -> None:
    """An existing database file must open as SQLite (a library would otherwise fail deep inside a step)."""
    if not db.exists():
        return
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            conn.execute("PRAGMA schema_version").fetchone()
    except sqlite3.Error as e:
        raise ConfigError(f"{key}: {db} is not a usable SQLite database ({e}); move it aside or point {key} at "
                          "another file (it is created when missing)") from None


def data_mirror_dir() -> Path:
    """Local mirror of public datasets: `VERL_GRPO_DATA_MIRROR`, else `../shared/data` beside the checkout."""
    if env := env_path("VERL_GRPO_DATA_MIRROR"):
        return env
    root = repo_root() or Path.cwd()
    return (root.parent / "shared" / "data").resolve()


def configs_dir() -> Path:
    """The shipped configs/ directory (gsm8k.yaml, math.yaml, mbpp.yaml, local.yaml)."""
    root = repo_root()
    return (root / "configs") if root else Path.cwd() / "configs"


def model_cache_dir() -> Path:
    """Converted/built Hugging Face model directories, reused across runs."""
    return env_path("VERL_GRPO_MODEL_CACHE") or state_dir() / "models"
