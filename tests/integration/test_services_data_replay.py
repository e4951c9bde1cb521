"""data-server and replay-buffer in-process against real stores (file:// and moto S3): batches, cursors and
buffers survive a restart."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from verl_grpo.config import load_config
from verl_grpo.data import load_split, prepare_dataset
from verl_grpo.errors import DataError
from verl_grpo.services.data_server import DataServer, build_app as data_app, find_dataset
from verl_grpo.services.replay_buffer import PersistentReplayBuffer, build_app as replay_app
from verl_grpo.services.state import service_state
from verl_grpo.store import Store

AUTH = {"Authorization": "Bearer tok"}


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory, data_mirror):
    store = Store(f"file://{tmp_path_factory.mktemp('store')}")
    version = prepare_dataset(load_config(overrides=["dataset.name=gsm8k", "dataset.val_size=10"]), store)
    return store, version


def _data_client(store, version, seed=0):
    state = service_state("data-server", store.uri, run_id="run-1")
    return TestClient(data_app(DataServer(version, store, state, seed=seed), "tok", 1 << 20, max_batch=64))


def test_batches_are_deterministic_and_resume_after_restart(gsm8k):
    store, version = gsm8k
    val = load_split(version, "val", store)
    with _data_client(store, version) as c:
        first = c.get("/batch", params={"size": 6, "split": "val"}, headers=AUTH).json()
        second = c.get("/batch", params={"size": 6, "split": "val"}, headers=AUTH).json()
    assert first["start"] == {"split": "val", "epoch": 0, "position": 0}
    assert second["next"] == {"split": "val", "epoch": 1, "position": 2}
    rows = first["rows"] + second["rows"]
    assert sorted(r["extra_info"]["uid"] for r in rows[:10]) == sorted(val["extra_info"].map(lambda e: e["uid"]))
    assert [r["epoch"] for r in rows] == [0] * 10 + [1] * 2
    assert rows[0]["reward_model"]["ground_truth"] and rows[0]["prompt"][-1]["role"] == "user"
    with _data_client(store, version) as restarted:  # the cursor comes back from the store
        third = restarted.get("/batch", params={"size": 2, "split": "val"}, headers=AUTH).json()
        assert third["start"] == {"split": "val", "epoch": 1, "position": 2}
        moved = restarted.put("/cursor", json={"split": "val", "epoch": 0, "position": 0}, headers=AUTH)
        assert moved.status_code == 200
        again = restarted.get("/batch", params={"size": 6, "split": "val"}, headers=AUTH).json()
        assert again["rows"] == first["rows"]
        bad = restarted.put("/cursor", json={"split": "val", "epoch": 0, "position": 10}, headers=AUTH)
        assert bad.status_code == 422 and "past the end" in bad.json()["error"]["message"]


def test_data_server_rejects_bad_requests(gsm8k):
    store, version = gsm8k
    with _data_client(store, version) as c:
        assert c.get("/batch", params={"size": 1}).status_code == 401
        r = c.get("/batch", params={"size": 1, "split": "dev"}, headers=AUTH)
        assert r.status_code == 422 and "available: train, val, test" in r.json()["error"]["message"]
        assert c.get("/batch", params={"size": 65}, headers=AUTH).status_code == 422
        assert c.get("/batch", params={"size": "many"}, headers=AUTH).json()["error"]["code"] == "invalid_request"


def test_find_dataset_by_uri_or_newest_by_name(gsm8k):
    store, version = gsm8k
    assert find_dataset(store, dataset_uri=version.uri) == version
    assert find_dataset(store, name="gsm8k") == version
    with pytest.raises(DataError, match="verl-grpo prepare --dataset math"):
        find_dataset(store, name="math")
    with pytest.raises(DataError, match="not under the store"):
        find_dataset(store, dataset_uri="file:///elsewhere/datasets/gsm8k/x")


def _replay(state, **kw):
    return PersistentReplayBuffer(state, capacity=kw.get("capacity", 5), alpha=1.0, compact_every=kw.get("every", 3),
                                  seed=0)


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_replay_buffer_restart_loses_nothing(backend, tmp_path, request):
    if backend == "s3":
        uri, endpoint = request.getfixturevalue("s3_bucket")
    else:
        uri, endpoint = f"file://{tmp_path / 'store'}", None
    state = service_state("replay-buffer", uri, endpoint, run_id="run-1")
    buf = _replay(state)
    with TestClient(replay_app(buf, "tok", 1 << 20)) as c:
        for i in range(7):  # 7 adds of 1 item: two compactions (after 3 and 6) + one pending segment
            r = c.post("/add", json={"items": [{"data": {"step": i}, "reward": i / 10}]}, headers=AUTH)
            assert r.status_code == 200 and r.json()["ids"] == [i]
        before = c.get("/stats", headers=AUTH).json()
    assert before == {"size": 5, "capacity": 5, "alpha": 1.0, "added_total": 7, "evicted_total": 2,
                      "retired_total": 0, "seq": 7}
    assert state.store.listdir(state.rel("segments")) == ["000000000007.json"]
    restored = _replay(state)
    assert restored.stats() == before
    assert [(e.id, e.data) for e in restored.buffer.items.values()] == [(i, {"step": i}) for i in range(2, 7)]
    smaller = _replay(state, capacity=3)
    assert [e.id for e in smaller.buffer.items.values()] == [4, 5, 6]


def test_replay_buffer_api(tmp_path):
    state = service_state("replay-buffer", f"file://{tmp_path / 'store'}")
    with TestClient(replay_app(_replay(state, capacity=100, every=100), "tok", 1 << 20)) as c:
        assert c.post("/sample", json={"size": 1}, headers=AUTH).json()["error"]["code"] == "empty"
        items = [{"data": {"text": "low"}, "reward": 0.0}, {"data": {"text": "high"}, "reward": 1.0}]
        assert c.post("/add", json={"items": items}, headers=AUTH).json() == {"ids": [0, 1], "size": 2}
        drawn = c.post("/sample", json={"size": 400, "alpha": 1.0}, headers=AUTH).json()["items"]
        assert sum(d["data"]["text"] == "high" for d in drawn) > 380
        assert {round(d["probability"], 3) for d in drawn} <= {0.001, 0.999}
        nan = c.post("/add", content=b'{"items": [{"data": 1, "reward": NaN}]}',
                     headers={**AUTH, "Content-Type": "application/json"})
        assert nan.status_code in (400, 422)
        assert c.post("/add", json={"items": [{"data": 1, "reward": "high"}]}, headers=AUTH).status_code == 422
        assert c.post("/sample", json={"size": 0}, headers=AUTH).status_code == 422
        assert c.post("/add", json={"items": items}).status_code == 401


def test_replay_buffer_retires_items_for_good_and_samples_distinct_ones(tmp_path):
    state = service_state("replay-buffer", f"file://{tmp_path / 'store'}", run_id="run-1")
    with TestClient(replay_app(_replay(state, capacity=10, every=3), "tok", 1 << 20)) as c:
        items = [{"data": {"group": i}, "reward": float(i)} for i in range(4)]
        assert c.post("/add", json={"items": items}, headers=AUTH).json()["ids"] == [0, 1, 2, 3]
        drawn = c.post("/sample", json={"size": 10, "unique": True}, headers=AUTH).json()["items"]
        assert sorted(d["id"] for d in drawn) == [0, 1, 2, 3]  # distinct, at most the buffer's size
        assert c.post("/retire", json={"ids": [1, 3, 99]}, headers=AUTH).json() == {"retired": 2, "size": 2}
        assert {d["id"] for d in c.post("/sample", json={"size": 50}, headers=AUTH).json()["items"]} <= {0, 2}
        assert c.post("/retire", json={"ids": []}, headers=AUTH).status_code == 422
    restored = _replay(state, capacity=10, every=3)  # the retire survives a restart (one compaction + segments)
    assert sorted(restored.buffer.items) == [0, 2] and restored.stats()["retired_total"] == 2


def test_replay_buffer_samples_by_policy_version_and_exclusion(tmp_path):
    state = service_state("replay-buffer", f"file://{tmp_path / 'store'}", run_id="run-1")
    with TestClient(replay_app(_replay(state, capacity=10, every=100), "tok", 1 << 20)) as c:
        items = [{"data": {"group": i}, "reward": 0.0, "policy_version": i} for i in range(4)]
        c.post("/add", json={"items": [*items, {"data": "unversioned", "reward": 0.0}]}, headers=AUTH)
        body = {"size": 20, "unique": True, "min_policy_version": 1, "exclude_ids": [2]}
        assert sorted(d["id"] for d in c.post("/sample", json=body, headers=AUTH).json()["items"]) == [1, 3]
        assert c.post("/sample", json={"size": 5, "min_policy_version": 9}, headers=AUTH).json()["items"] == []
    restored = _replay(state, capacity=10, every=100)  # versions survive a restart (add-log segment)
    assert [e.version for e in restored.buffer.items.values()] == [0, 1, 2, 3, None]
    restored._compact()  # and a snapshot
    assert [e.version for e in _replay(state, capacity=10, every=100).buffer.items.values()] == [0, 1, 2, 3, None]
