"""The state dir and the local paths a config names are created before any library touches them."""

from __future__ import annotations

import pytest

from verl_grpo.errors import ConfigError
from verl_grpo.paths import STATE_SUBDIRS, ensure_dir, ensure_local_dirs, ensure_state_dir


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
    ensure_local_dirs({"tracking.mlflow_uri": f"sqlite:///{db}"})
