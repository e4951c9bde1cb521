"""CheckpointStore commit protocol on a local dir and on a real S3 endpoint (moto server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.errors import InfraError
from verl_grpo.store import Store
from verl_grpo.store_layout import CHECKPOINT_MANIFEST as MANIFEST


def _fake_checkpoint(root: Path, step: int) -> Path:
    d = root / f"ckpt-{step}"
    (d / "sub").mkdir(parents=True)
    (d / "model.safetensors").write_bytes(bytes([step % 256]) * 4096)
    (d / "sub" / "optimizer.pt").write_bytes(b"opt" * 100 + bytes([step]))
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


@pytest.fixture(params=["file", "s3"])
def ckpt_store(request, tmp_path):
    if request.param == "file":
        return CheckpointStore(Store(f"file://{tmp_path / 'store'}"), backoff_s=0.01)
    uri, endpoint = request.getfixturevalue("s3_bucket")
    return CheckpointStore(Store(uri, endpoint), backoff_s=0.01)


def test_save_restore_roundtrip(ckpt_store, tmp_path):
    src = _fake_checkpoint(tmp_path, 3)
    ref = ckpt_store.save("r1", 3, src, {"data_position": 12})
    assert ref.step == 3 and ref.uri.endswith("runs/r1/checkpoints/global_step_3")
    assert ckpt_store.latest_complete("r1") == ref
    out = tmp_path / "restored"
    manifest = ckpt_store.restore(ref, out)
    assert manifest["state"] == {"data_position": 12}
    for f in src.rglob("*"):
        if f.is_file():
            assert (out / f.relative_to(src)).read_bytes() == f.read_bytes()


def test_torn_checkpoint_is_never_latest(ckpt_store, tmp_path):
    ckpt_store.save("r1", 2, _fake_checkpoint(tmp_path, 2))
    # A later step whose files landed but whose manifest never did (killed mid-upload).
    torn = _fake_checkpoint(tmp_path, 4)
    ckpt_store.store.put_file(torn / "model.safetensors", "runs/r1/checkpoints/global_step_4/model.safetensors")
    # And one with a garbage manifest.
    ckpt_store.store.write_text("{not json", "runs/r1/checkpoints/global_step_6", MANIFEST)
    assert ckpt_store.steps("r1") == [2, 4, 6]
    assert ckpt_store.latest_complete("r1").step == 2


def test_missing_file_after_commit_is_skipped(ckpt_store, tmp_path):
    ckpt_store.save("r1", 1, _fake_checkpoint(tmp_path, 1))
    ckpt_store.save("r1", 2, _fake_checkpoint(tmp_path, 2))
    ckpt_store.store.rm("runs/r1/checkpoints/global_step_2/sub/optimizer.pt")
    assert ckpt_store.latest_complete("r1").step == 1


def test_restore_detects_corruption(ckpt_store, tmp_path):
    ref = ckpt_store.save("r1", 5, _fake_checkpoint(tmp_path, 5))
    ckpt_store.store.write_text("x" * 4096, "runs/r1/checkpoints/global_step_5/model.safetensors")
    with pytest.raises(InfraError, match="does not match its manifest"):
        ckpt_store.restore(ref, tmp_path / "out")


def test_prune_keeps_last_k_and_best(ckpt_store, tmp_path):
    for step in (1, 2, 3, 4, 5):
        ckpt_store.save("r1", step, _fake_checkpoint(tmp_path, step))
    removed = ckpt_store.prune("r1", keep=2, best_step=2)
    assert removed == [1, 3]
    assert ckpt_store.steps("r1") == [2, 4, 5]
    assert ckpt_store.latest_complete("r1").step == 5


def test_no_checkpoint_means_none(ckpt_store):
    assert ckpt_store.latest_complete("never-ran") is None


def test_background_saver_commits_in_order_and_surfaces_errors(ckpt_store, tmp_path):
    from verl_grpo.checkpoints import BackgroundSaver

    committed = []
    saver = BackgroundSaver(ckpt_store, on_committed=lambda ref: committed.append(ref.step))
    for step in (1, 2, 3):
        saver.submit("r1", step, _fake_checkpoint(tmp_path, step), {"step": step})
    assert saver.close().step == 3
    assert committed == [1, 2, 3]
    assert ckpt_store.latest_complete("r1").step == 3

    failing = BackgroundSaver(ckpt_store)
    failing.submit("r1", 9, tmp_path / "does-not-exist")
    with pytest.raises(InfraError, match="empty"):
        failing.close()


def test_a_commit_by_another_node_is_seen_by_a_store_that_listed_before(s3_bucket, tmp_path):
    """The resume reads a fresh listing: node A lists (and would cache) a step dir that a killed attempt left torn,
    node B (another process, its own S3 client) commits the step afterwards, and A's latest_complete and restore see
    all of it (with s3fs's listing cache on, A's restore fails on a file its cached listing lacks)."""
    import subprocess
    import sys

    uri, endpoint = s3_bucket
    node_a = CheckpointStore(Store(uri, endpoint), backoff_s=0.01)
    src = _fake_checkpoint(tmp_path, 1)
    node_a.store.put_file(src / "model.safetensors", "runs/r1/checkpoints/global_step_1/model.safetensors")
    node_a.store.put_file(src / "model.safetensors", "runs/r1/checkpoints/global_step_1/sub/partial.pt")
    for step_dir in ("global_step_1", "global_step_1/sub"):  # listings s3fs would cache
        node_a.store.listdir("runs/r1/checkpoints", step_dir)
    assert node_a.latest_complete("r1") is None
    code = ("import sys; from pathlib import Path; from verl_grpo.checkpoints import CheckpointStore; "
            "from verl_grpo.store import Store; "
            "CheckpointStore(Store(sys.argv[1], sys.argv[2])).save('r1', 1, Path(sys.argv[3]), {'data_position': 2})")
    subprocess.run([sys.executable, "-c", code, uri, endpoint, str(src)], check=True, timeout=120)

    ref = node_a.latest_complete("r1")
    assert ref is not None and ref.step == 1
    assert node_a.restore(ref, tmp_path / "restored")["state"] == {"data_position": 2}
    restored = node_a.store.get_dir(tmp_path / "whole", "runs", "r1", "checkpoints", "global_step_1")
    assert (restored / "sub" / "optimizer.pt").read_bytes() == (src / "sub" / "optimizer.pt").read_bytes()
