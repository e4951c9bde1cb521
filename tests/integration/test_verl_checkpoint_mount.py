"""Multi-node verl checkpoints on the store mount (SkyPilot MOUNT_CACHED, as the rehearsal stands it in): two nodes
write their FSDP ranks' shards into their own mounted dir, the head's commit waits until the bucket holds them all
and writes the manifest in place; a node lost before its upload leaves a torn step that is never committed, and the
head's restore on a fresh node points verl at the last committed step and removes the torn one from the store."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.errors import InfraError
from verl_grpo.rehearsal import cached_mount
from verl_grpo.rehearsal.cached_mount import CachedMount, bucket_fs
from verl_grpo.store import Store
from verl_grpo.trainers.verl import commit
from verl_grpo.trainers.verl.restore import restore_latest
from verl_grpo.trainers.verl.settings import StoreSettings, read_tracker

RUN = "mn-1"


@pytest.fixture
def bucket(s3_bucket, monkeypatch):
    uri, endpoint = s3_bucket
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    return uri, endpoint


def mount(uri: str, local: Path) -> CachedMount:
    m = CachedMount(f"{uri}/runs/{RUN}/checkpoints", local, bucket_fs(os.environ.get))
    m.start()
    return m


def write_rank(node: Path, step: int, rank: int, world: int = 2) -> None:
    """What verl leaves of one step on one node: each rank's shards; on the head also fsdp_config.json and data.pt."""
    actor = node / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True, exist_ok=True)
    for kind in ("model", "optim", "extra_state"):
        (actor / f"{kind}_world_size_{world}_rank_{rank}.pt").write_bytes(os.urandom(2048 + rank))
    if rank == 0:
        (actor / "fsdp_config.json").write_text(json.dumps({"world_size": world}))
        (node / f"global_step_{step}" / "data.pt").write_bytes(b"dataloader")


def settings(uri: str, endpoint: str, head: Path) -> StoreSettings:
    return StoreSettings(uri=uri, endpoint_url=endpoint, run_id=RUN, checkpoint_dir=head, keep_last=2,
                         mount=f"{uri}/runs/{RUN}/checkpoints")


def test_two_nodes_commit_through_the_mount_and_a_torn_step_is_never_used(bucket, tmp_path, monkeypatch):
    uri, endpoint = bucket
    checkpoints = CheckpointStore(Store(uri, endpoint), retries=1)
    head, worker = mount(uri, tmp_path / "head"), mount(uri, tmp_path / "worker")
    s = settings(uri, endpoint, head.local)
    try:
        write_rank(head.local, 2, 0)
        write_rank(worker.local, 2, 1)
        started = time.monotonic()
        ref = commit.commit_mounted(checkpoints, s, 2, {"global_step": 2})
        assert time.monotonic() - started >= cached_mount.WRITE_BACK_S  # it waited for the write-back
        manifest = checkpoints.manifest(RUN, 2)
        paths = {e["path"] for e in manifest["files"]}
        assert {f"actor/{k}_world_size_2_rank_{r}.pt" for k in ("model", "optim", "extra_state") for r in (0, 1)} \
            <= paths and "data.pt" in paths
        worker_shard = (worker.local / "global_step_2/actor/model_world_size_2_rank_1.pt").read_bytes()
        import hashlib
        assert next(e["sha256"] for e in manifest["files"] if e["path"].endswith("model_world_size_2_rank_1.pt")) \
            == hashlib.sha256(worker_shard).hexdigest()
        assert checkpoints.latest_complete(RUN) == ref

        # Step 4: the worker is preempted before its mount uploaded its shards.
        write_rank(head.local, 4, 0)
        write_rank(worker.local, 4, 1)
        worker.drop()
        with pytest.raises(InfraError, match=r"rank.*\[1\].*uncommitted|uncommitted"):
            commit.await_uploaded(checkpoints, s, 4, timeout_s=3 * cached_mount.WRITE_BACK_S, poll_s=0.2)
        assert 4 in checkpoints.steps(RUN) and checkpoints.manifest(RUN, 4) is None
        assert checkpoints.latest_complete(RUN).step == 2
    finally:
        head.drop()
        worker.drop()

    # Recovery on fresh nodes: the head's restore points verl at step 2 and removes the torn step 4 from the store.
    new_head, new_worker = mount(uri, tmp_path / "head2"), mount(uri, tmp_path / "worker2")
    try:
        assert restore_latest(settings(uri, endpoint, new_worker.local), checkpoints, node_rank=1) is None
        assert read_tracker(new_worker.local) is None  # only the head touches the tracker
        assert restore_latest(settings(uri, endpoint, new_head.local), checkpoints, node_rank=0) == 2
        assert checkpoints.steps(RUN) == [2]
        assert read_tracker(new_head.local) == 2
        # verl's ranks read step 2 through their own node's mount, every rank's shard there; the torn step 4 leaves
        # the mounts at their next listing refresh.
        for node in (new_head.local, new_worker.local):
            deadline = time.monotonic() + 10
            while not (node / "global_step_2/actor/model_world_size_2_rank_1.pt").is_file() \
                    or any((node / "global_step_4").rglob("*.pt")):
                assert time.monotonic() < deadline, f"{node} never showed the store's step 2 without step 4"
                time.sleep(0.1)
    finally:
        new_head.drop()
        new_worker.drop()
