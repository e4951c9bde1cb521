"""A state dir copied elsewhere: its MLflow store reads and writes the copy's artifacts, never the original's."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from registry_runs import correct_first, make_env, make_run, register

from verl_grpo.registry import download_version, tracking
from verl_grpo.registry.relocate import relocate_artifacts


def _locations(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [row[0] for query in ("SELECT artifact_location FROM experiments WHERE experiment_id > 0",
                                     "SELECT artifact_uri FROM runs", "SELECT source FROM model_versions",
                                     "SELECT artifact_location FROM logged_models")
                for row in conn.execute(query)]


def test_a_copied_state_dir_uses_its_own_artifacts(tmp_path, tiny_model_dir):
    original = tmp_path / "original"
    cfg, store, dataset = make_env(original)
    register(cfg, store, dataset, *make_run(store, tiny_model_dir, "night-1", correct_first(10)))
    moved = tmp_path / "moved"
    shutil.copytree(original, moved)
    shutil.rmtree(original)  # nothing may still read the old place
    uri = f"sqlite:///{moved / 'mlflow.db'}"

    locations = _locations(moved / "mlflow.db")
    assert len(locations) == 4 and all(str(original) in loc for loc in locations)
    client = tracking.client_for(uri)  # what every reader of the store opens: rewrites first
    locations = _locations(moved / "mlflow.db")
    assert all(loc.startswith((moved / "mlartifacts").as_uri() + "/") for loc in locations), locations
    assert relocate_artifacts(uri) is None  # once moved, nothing left to do

    [run] = client.search_runs([client.get_experiment_by_name(cfg.experiment_name).experiment_id])
    assert "config.yaml" in {a.path for a in client.list_artifacts(run.info.run_id)}
    model = download_version(uri, cfg.registered_model_name, "champion", tmp_path / "download")
    assert (model / "config.json").is_file()
    assert not original.exists()


def test_verl_grpo_home_rewrites_a_moved_store_before_make_serve_starts_mlflow(tmp_path, tiny_model_dir):
    original = tmp_path / "state"
    cfg, store, dataset = make_env(original)
    register(cfg, store, dataset, *make_run(store, tiny_model_dir, "night-1", correct_first(10)))
    moved = tmp_path / "elsewhere" / "state"
    shutil.copytree(original, moved)

    done = subprocess.run([str(Path(sys.executable).parent / "verl-grpo"), "home"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "VERL_GRPO_HOME": str(moved)},
                          timeout=120)

    assert done.returncode == 0, done.stderr
    assert f"MLflow store moved: artifact paths rewritten from {(original / 'mlartifacts').as_uri()}" in done.stderr
    assert all(str(original) not in loc for loc in _locations(moved / "mlflow.db"))
    assert all(str(original) in loc for loc in _locations(original / "mlflow.db"))  # the original stays as it was
