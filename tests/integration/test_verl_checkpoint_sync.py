"""Multi-node verl checkpoints through each node's checkpoint sync (`python -m verl_grpo.trainers.verl.checkpoint_sync`,
run as the rendered task runs it, with the task's credentials): two nodes write their FSDP ranks' shards into their own
disk, the head's commit waits until the store holds them all and writes the manifest in place; a node lost before its
upload leaves a torn step that is never committed, and the restore on fresh nodes puts the last committed step on
every node's disk and removes the torn one from the store."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.errors import InfraError
from verl_grpo.store import Store
from verl_grpo.store_layout import train_result
from verl_grpo.trainers.verl import checkpoint_sync, commit
from verl_grpo.trainers.verl.finalize import finalize
from verl_grpo.trainers.verl.restore import restore_latest
from verl_grpo.trainers.verl.settings import StoreSettings, checkpoint_env, read_tracker, write_tracker

RUN = "mn-1"


def start_sync(uri: str, endpoint: str, node: Path, *args: str) -> subprocess.Popen:
    """One node's checkpoint sync, with the env the rendered task gives it (the credentials are the test's)."""
    env = {**os.environ, **checkpoint_env(uri, endpoint, RUN, str(node), 2, f"{uri}/runs/{RUN}/checkpoints")}
    proc = subprocess.Popen([sys.executable, "-m", "verl_grpo.trainers.verl.checkpoint_sync", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith(f"checkpoint sync: {node} -> "), first
    return proc


def write_rank(node: Path, step: int, rank: int, world: int = 2) -> None:
    """What verl leaves of one step on one node: each rank's shards; on the head also fsdp_config.json and data.pt."""
    actor = node / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True, exist_ok=True)
    for kind in ("model", "optim", "extra_state"):
        (actor / f"{kind}_world_size_{world}_rank_{rank}.pt").write_bytes(os.urandom(2048 + rank))
    if rank == 0:
        (actor / "fsdp_config.json").write_text(json.dumps({"world_size": world}))
        (node / f"global_step_{step}" / "data.pt").write_bytes(b"dataloader")


def settings(uri: str, endpoint: str, node: Path) -> StoreSettings:
    return StoreSettings(uri=uri, endpoint_url=endpoint, run_id=RUN, checkpoint_dir=node, keep_last=2,
                         mount=f"{uri}/runs/{RUN}/checkpoints")


def test_two_nodes_commit_through_their_syncs_and_a_torn_step_is_never_used(s3_bucket, tmp_path):
    uri, endpoint = s3_bucket
    checkpoints = CheckpointStore(Store(uri, endpoint), retries=1)
    head_dir, worker_dir = tmp_path / "head", tmp_path / "worker"
    head, worker = start_sync(uri, endpoint, head_dir), start_sync(uri, endpoint, worker_dir)
    s = settings(uri, endpoint, head_dir)
    try:
        write_rank(head_dir, 2, 0)
        write_rank(worker_dir, 2, 1)
        started = time.monotonic()
        ref = commit.commit_mounted(checkpoints, s, 2, {"global_step": 2})
        assert time.monotonic() - started >= checkpoint_sync.WRITE_BACK_S  # it waited for the write-back
        manifest = checkpoints.manifest(RUN, 2)
        paths = {e["path"] for e in manifest["files"]}
        assert {f"actor/{k}_world_size_2_rank_{r}.pt" for k in ("model", "optim", "extra_state") for r in (0, 1)} \
            <= paths and "data.pt" in paths
        worker_shard = (worker_dir / "global_step_2/actor/model_world_size_2_rank_1.pt").read_bytes()
        assert next(e["sha256"] for e in manifest["files"] if e["path"].endswith("model_world_size_2_rank_1.pt")) \
            == hashlib.sha256(worker_shard).hexdigest()
        assert checkpoints.latest_complete(RUN) == ref

        # Step 4: the worker node is preempted before its sync uploaded its shards.
        worker.kill()
        write_rank(head_dir, 4, 0)
        write_rank(worker_dir, 4, 1)
        with pytest.raises(InfraError, match="uncommitted"):
            commit.await_uploaded(checkpoints, s, 4, timeout_s=3 * checkpoint_sync.WRITE_BACK_S, poll_s=0.2)
        assert 4 in checkpoints.steps(RUN) and checkpoints.manifest(RUN, 4) is None
        assert checkpoints.latest_complete(RUN).step == 2
    finally:
        for proc in (head, worker):
            proc.kill()
            proc.wait()

    # Recovery on fresh nodes: every node restores step 2 onto its own disk (its ranks read their shards there); the
    # head also removes the torn step 4 from the store. A sync started then finds the restored files in the store.
    new_head, new_worker = tmp_path / "head2", tmp_path / "worker2"
    assert restore_latest(settings(uri, endpoint, new_head), checkpoints, node_rank=0) == 2
    assert checkpoints.steps(RUN) == [2]
    assert restore_latest(settings(uri, endpoint, new_worker), checkpoints, node_rank=1) == 2
    for node in (new_head, new_worker):
        assert read_tracker(node) == 2
        assert (node / "global_step_2/actor/model_world_size_2_rank_1.pt").read_bytes() == worker_shard
        assert not (node / "global_step_4").exists()
    sync = start_sync(uri, endpoint, new_worker)
    try:
        (new_worker / "global_step_6").mkdir()
        (new_worker / "global_step_6/late.pt").write_bytes(b"written just before the node is stopped")
        sync.send_signal(signal.SIGTERM)  # what is pending is uploaded before the sync exits
        out, _ = sync.communicate(timeout=60)
    finally:
        sync.kill()
    assert sync.returncode == 0
    assert "uploaded global_step_6/late.pt" in out and "global_step_2" not in out  # restored: already stored
    assert checkpoints.listing(RUN, 6) == {"late.pt": len(b"written just before the node is stopped")}

    # The head's finalize merges the final step: verl's merger reads every rank's model shard from one dir, and the
    # head's disk holds only its own ranks; it fetches the others' model shards (not their optimizer) from the store.
    write_tracker(head_dir, 2)
    seen: list[str] = []

    def merger(cmd, **_):
        seen.extend(sorted(p.name for p in (head_dir / "global_step_2/actor").iterdir()))
        target = Path(cmd[cmd.index("--target_dir") + 1])
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    result = finalize(settings(uri, endpoint, head_dir), backend="fsdp2", run=merger)  # its own store client
    assert result.final_step == 2
    assert {"model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt", "fsdp_config.json"} <= set(seen)
    assert "optim_world_size_2_rank_1.pt" not in seen and "extra_state_world_size_2_rank_1.pt" not in seen
    assert (head_dir / "global_step_2/actor/model_world_size_2_rank_1.pt").read_bytes() == worker_shard
    checkpoints.store.rm(train_result(RUN))  # the run goes on below

    # A worker node's foreground sync ends by itself once the head's finalize has written the run's result. Once a
    # newer step is committed (6 here) it deletes the uploaded older ones from its disk: verl deletes old steps only
    # on global rank 0, so a worker node would keep every step's shards.
    checkpoints.commit_in_place(RUN, 6, {"global_step": 6})
    worker_sync = start_sync(uri, endpoint, new_worker, "--until-finished")
    try:
        time.sleep(2 * checkpoint_sync.SCAN_S)
        assert worker_sync.poll() is None
        checkpoints.store.write_text("{}", train_result(RUN))
        out, _ = worker_sync.communicate(timeout=60)
    finally:
        worker_sync.kill()
    assert worker_sync.returncode == 0 and f"run {RUN} finished" in out
    assert "step 6 is committed; removed global_step_2 from this node's disk" in out
    assert not (new_worker / "global_step_2").exists() and (new_worker / "global_step_6/late.pt").exists()
    assert checkpoints.listing(RUN, 2), "only the node's copy goes; the store keeps the step"
