"""The state dir and the local paths a config names are created before any library touches them."""

from __future__ import annotations

import os

import pytest

from verl_grpo.errors import ConfigError
from verl_grpo.local_paths import (
    PATH_VARS,
    STATE_SUBDIRS,
    data_mirror_dir,
    ensure_dir,
    ensure_local_dirs,
    ensure_state_dir,
    model_cache_dir,
    prefect_home,
    state_dir,
)


def test_state_dir_and_its_subdirs_are_created(tmp_path, monkeypatch):
    home = tmp_path / "not" / "there" / "yet"
    monkeypatch.setenv("VERL_GRPO_HOME", str(home))
    monkeypatch.delenv("VERL_GRPO_MODEL_CACHE")
    assert ensure_state_dir() == home
    assert sorted(p.name for p in home.iterdir()) == sorted(STATE_SUBDIRS)
    assert ensure_state_dir() == home  # idempotent


def test_a_path_that_cannot_be_made_names_the_knob(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError) as err:
        ensure_dir(blocker / "sub", "VERL_GRPO_HOME")
    message = str(err.value)
    assert message.startswith("VERL_GRPO_HOME: cannot create or write") and str(blocker / "sub") in message
    assert "\n" not in message


def test_local_uris_get_their_directories_remote_ones_are_left_alone(tmp_path):
    ensure_local_dirs({"storage.uri": f"file://{tmp_path}/store/deep",
                       "tracking.mlflow_uri": f"sqlite:///{tmp_path}/db/dir/mlflow.db",
                       "other": "s3://bucket/prefix"})
    assert (tmp_path / "store" / "deep").is_dir()
    assert (tmp_path / "db" / "dir").is_dir() and not (tmp_path / "db" / "dir" / "mlflow.db").exists()


def test_a_local_uri_that_cannot_be_made_names_its_key(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"^tracking\.mlflow_uri: "):
        ensure_local_dirs({"tracking.mlflow_uri": f"sqlite:///{tmp_path}/file/x/mlflow.db"})


def test_an_mlflow_db_that_is_not_sqlite_names_its_key(tmp_path):
    db = tmp_path / "mlflow.db"
    db.write_text("not a database, e.g. a half-copied file")
    with pytest.raises(ConfigError, match=r"^tracking\.mlflow_uri: .* is not a usable SQLite database"):
        ensure_local_dirs({"tracking.mlflow_uri": f"sqlite:///{db}"})
    assert db.read_text().startswith("not a database")  # nothing is lost


def test_an_existing_sqlite_db_passes(tmp_path):
    import sqlite3

    db = tmp_path / "mlflow.db"
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.commit()
    assert ensure_local_dirs({"tracking.mlflow_uri": f"sqlite:///{db}"}) is None
    with sqlite3.connect(db) as conn:  # opened read-only: the database is left as it was
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("t",)]


# --- the path env vars: set to nothing, relative, `~`, a file, under a file ------------------------------------------

PATH_FUNCTIONS = {"VERL_GRPO_HOME": state_dir, "VERL_GRPO_MODEL_CACHE": model_cache_dir,
                  "VERL_GRPO_DATA_MIRROR": data_mirror_dir, "PREFECT_HOME": prefect_home}


@pytest.mark.parametrize("value", ["", "  "])
@pytest.mark.parametrize("var", PATH_VARS)
def test_a_path_var_set_to_nothing_names_it(var, value, monkeypatch):
    """An empty path would mean the working directory: refused, not silently the default either."""
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=rf"^{var} is set but empty; unset it") as err:
        PATH_FUNCTIONS[var]()
    assert "\n" not in str(err.value)
    if var in ("VERL_GRPO_HOME", "VERL_GRPO_MODEL_CACHE"):
        with pytest.raises(ConfigError, match=rf"^{var} is set but empty"):
            ensure_state_dir()


@pytest.mark.parametrize("var", PATH_VARS)
def test_relative_and_home_paths_become_absolute_and_are_pinned_for_child_processes(var, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for other in PATH_VARS:
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv("VERL_GRPO_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(var, "rel/dir")
    assert PATH_FUNCTIONS[var]() == tmp_path / "rel" / "dir"
    ensure_state_dir()
    assert os.environ[var] == str(tmp_path / "rel" / "dir")
    monkeypatch.setenv(var, "~/dir")
    assert PATH_FUNCTIONS[var]() == tmp_path / "home" / "dir"
    ensure_state_dir()
    assert os.environ[var] == str(tmp_path / "home" / "dir")
    assert not (tmp_path / "~").exists()


@pytest.mark.parametrize("var", ["VERL_GRPO_HOME", "VERL_GRPO_MODEL_CACHE"])
def test_a_state_path_that_is_a_file_or_under_one_names_its_var(var, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("VERL_GRPO_HOME", str(tmp_path / "state"))
    for value, reason in ((blocker, "it is a file, not a directory"), (blocker / "sub", "Not a directory")):
        monkeypatch.setenv(var, str(value))
        with pytest.raises(ConfigError) as err:
            ensure_state_dir()
        assert str(err.value) == (f"{var}: cannot create or write {value} ({reason}); point {var} at a writable "
                                  "directory (it is created when missing)")


def test_a_subdir_of_the_state_dir_that_is_a_file_names_the_state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_GRPO_HOME", str(tmp_path))
    (tmp_path / "prefect").write_text("")
    with pytest.raises(ConfigError, match=r"^VERL_GRPO_HOME: cannot create or write .*/prefect \(it is a file"):
        ensure_state_dir()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits; the under-a-file cases cover it")
def test_an_unwritable_parent_names_the_knob(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(ConfigError, match=r"^PREFECT_HOME: cannot create or write .*Permission denied"):
            ensure_dir(locked / "new" / "home", "PREFECT_HOME")
    finally:
        locked.chmod(0o700)


def test_a_store_under_a_file_names_storage_uri(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"^storage\.uri: cannot create or write .*/file/store"):
        ensure_local_dirs({"storage.uri": f"file://{tmp_path}/file/store"})
