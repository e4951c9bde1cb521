"""Run identity: names, resume of unfinished runs with the same config, refusal of a mismatched run id."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from verl_grpo import runs
from verl_grpo.config import load_config
from verl_grpo.errors import ConfigError, RunNotFound
from verl_grpo.store import Store


@pytest.fixture
def store(tmp_path):
    return Store(f"file://{tmp_path / 'store'}")


def test_run_name_format():
    when = datetime(2026, 11, 22, 2, 0, tzinfo=timezone.utc)
    assert runs.run_name(load_config(["gsm8k", "local"], env={}), when) == "gsm8k-smollm2-135m-20261122-0200"
    # the cluster config's model, its HF org left out
    assert runs.run_name(load_config(["gsm8k"], env={}), when) == "gsm8k-qwen2.5-1.5b-instruct-20261122-0200"


def test_unfinished_run_with_same_config_is_resumed(store):
    cfg = load_config(["gsm8k"], env={})
    first, resumed = runs.begin_run(store, cfg, None)
    assert not resumed
    assert store.read_text("runs", first, "config.yaml") == cfg.to_yaml()
    again, resumed = runs.begin_run(store, cfg, None)
    assert (again, resumed) == (first, True)
    runs.mark_run(store, first, "completed")
    third, resumed = runs.begin_run(store, cfg, None)
    assert third != first and not resumed


def test_different_config_starts_a_new_run(store):
    first, _ = runs.begin_run(store, load_config(["gsm8k"], env={}), None)
    other, resumed = runs.begin_run(store, load_config(["gsm8k"], ["algorithm.lr=0.1"], env={}), None)
    assert other != first and not resumed


def test_fresh_never_resumes(store):
    cfg = load_config(["gsm8k"], env={})
    first, _ = runs.begin_run(store, cfg, None)
    second, resumed = runs.begin_run(store, cfg, None, fresh=True)
    assert second != first and not resumed


def test_explicit_run_id_with_other_config_is_refused(store):
    runs.begin_run(store, load_config(["gsm8k"], env={}), "nightly-1", fresh=True)
    with pytest.raises(ConfigError, match="different config"):
        runs.begin_run(store, load_config(["gsm8k"], ["algorithm.lr=0.1"], env={}), "nightly-1")
    with pytest.raises(ConfigError, match="run_id"):
        runs.begin_run(store, load_config(["gsm8k"], env={}), "bad id/../x")


def test_training_start_is_recorded_once_and_older_runs_give_their_creation(store, monkeypatch):
    cfg = load_config(["gsm8k"], env={})
    run_id, _ = runs.begin_run(store, cfg, None)
    created = runs.read_run(store, run_id)["created_at"]
    assert runs.training_started_at(store, run_id) == created  # a run recorded before training starts were kept

    monkeypatch.setattr(runs.time, "time", lambda: created + 100)
    runs.mark_training_started(store, run_id)
    monkeypatch.setattr(runs.time, "time", lambda: created + 500)
    runs.mark_training_started(store, run_id)  # a resumed training keeps the first start
    runs.mark_run(store, run_id, "completed")
    assert runs.training_started_at(store, run_id) == created + 100


def test_unknown_run_id_fails_naming_the_run_and_the_store_and_writes_nothing(store):
    cfg = load_config(["gsm8k"], env={})
    with pytest.raises(RunNotFound) as caught:
        runs.begin_run(store, cfg, "gsm8k-smollm2-135m-20261122-0200-2")
    message = str(caught.value)
    assert "'gsm8k-smollm2-135m-20261122-0200-2'" in message and store.uri in message
    assert "--fresh" in message and "\n" not in message
    assert isinstance(caught.value, ConfigError)  # the user fixes it; no retry
    assert store.listdir("runs") == []  # no record, no config: nothing of a new run was started


def test_a_given_run_id_resumes_only_that_run(store):
    cfg = load_config(["gsm8k"], env={})
    named, resumed = runs.begin_run(store, cfg, "mine", fresh=True)
    assert (named, resumed) == ("mine", False)
    assert runs.begin_run(store, cfg, "mine") == ("mine", True)
    with pytest.raises(ConfigError, match="already exists"):
        runs.begin_run(store, cfg, "mine", fresh=True)


def test_an_unreadable_run_record_is_not_taken_for_a_missing_one(store):
    cfg = load_config(["gsm8k"], env={})
    store.write_text("{not json", "runs", "broken", "run.json")
    with pytest.raises(ConfigError, match="unreadable") as caught:
        runs.begin_run(store, cfg, "broken")
    assert not isinstance(caught.value, RunNotFound)
    assert store.read_text("runs", "broken", "run.json") == "{not json"  # left for the user to repair
