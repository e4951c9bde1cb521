"""verl checkpoints ↔ the store (moto S3): the on_save callback, restore + resume tracker, finalize with a real merge.

The checkpoint dirs are laid out as verl 0.9.1's FSDP checkpoint manager writes them (per-rank
`model/optim/extra_state_world_size_W_rank_R.pt`, `fsdp_config.json`, `huggingface/`, then `data.pt`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.contracts import TrainResult
from verl_grpo.errors import ConfigError
from verl_grpo.store import Store
from verl_grpo.trainers.exits import EXIT_USER_ERROR
from verl_grpo.trainers.verl.callback import StoreCheckpointCallback
from verl_grpo.trainers.verl.finalize import finalize
from verl_grpo.trainers.verl.metrics import read_records
from verl_grpo.trainers.verl.restore import restore_latest
from verl_grpo.trainers.verl.settings import STAGING_DIR, TRACKER_FILE, StoreSettings, checkpoint_env


def write_step(ckpt_dir: Path, step: int, world: int = 1, ranks=None, model_dir: Path | None = None) -> Path:
    """A global_step_N dir as verl writes it; with model_dir, the actor holds that HF model's real weights."""
    step_dir = ckpt_dir / f"global_step_{step}"
    actor = step_dir / "actor"
    (actor / "huggingface").mkdir(parents=True, exist_ok=True)
    if model_dir is not None:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        state = model.state_dict()
        AutoConfig.from_pretrained(model_dir).save_pretrained(actor / "huggingface")
        AutoTokenizer.from_pretrained(model_dir).save_pretrained(actor / "huggingface")
    else:
        state = {"w": torch.full((4,), float(step))}
    for rank in range(world) if ranks is None else ranks:
        torch.save(state, actor / f"model_world_size_{world}_rank_{rank}.pt")
        torch.save({"step": step}, actor / f"optim_world_size_{world}_rank_{rank}.pt")
        torch.save({"rng": rank}, actor / f"extra_state_world_size_{world}_rank_{rank}.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world}))
    torch.save({"_num_yielded": step, "_sampler_iter_yielded": step}, step_dir / "data.pt")
    (ckpt_dir / TRACKER_FILE).write_text(str(step))
    return step_dir


def log_step(settings: StoreSettings, step: int, reward: float) -> None:
    """One line of verl's `file` logger."""
    settings.verl_metrics_path.parent.mkdir(parents=True, exist_ok=True)
    with open(settings.verl_metrics_path, "a") as f:
        f.write(json.dumps({"step": step, "data": {"critic/score/mean": reward, "actor/pg_loss": -reward}}) + "\n")


@pytest.fixture
def settings(s3_bucket, tmp_path):
    uri, endpoint = s3_bucket
    return StoreSettings(uri=uri, endpoint_url=endpoint, run_id="r1", checkpoint_dir=tmp_path / "ckpt", keep_last=2)


def _callback(settings: StoreSettings, total: int = 4) -> StoreCheckpointCallback:
    env = checkpoint_env(settings.uri, settings.endpoint_url, settings.run_id, str(settings.checkpoint_dir),
                            settings.keep_last)
    config = {"trainer": {"default_local_dir": str(settings.checkpoint_dir), "total_training_steps": total},
              "data": {"train_batch_size": 8}}
    return StoreCheckpointCallback(config=config, env=env)


def _store_checkpoints(settings) -> CheckpointStore:
    return CheckpointStore(Store(settings.uri, settings.endpoint_url))


def test_on_save_uploads_and_commits_with_step_data_position_and_metrics(settings):
    callback = _callback(settings)
    trainer = SimpleNamespace(total_training_steps=4)
    for step in (1, 2):
        log_step(settings, step, reward=0.1 * step)
        callback.on_save(trainer=trainer, global_step=step,
                         checkpoint_dir=str(write_step(settings.checkpoint_dir, step)), async_save=False)
    callback.close()
    checkpoints = _store_checkpoints(settings)
    assert checkpoints.latest_complete("r1").step == 2
    manifest = checkpoints.manifest("r1", 2)
    assert manifest["state"] == {"backend": "verl", "global_step": 2, "dataloader_state_file": "data.pt",
                                 "prompts_consumed": 16, "dataloader_batches_yielded": 2}
    paths = {e["path"] for e in manifest["files"]}
    assert {"data.pt", "actor/model_world_size_1_rank_0.pt", "actor/fsdp_config.json", "metrics.jsonl"} <= paths
    store = Store(settings.uri, settings.endpoint_url)
    metrics = [json.loads(x) for x in store.read_text("runs/r1/checkpoints/global_step_2/metrics.jsonl").splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and metrics[0]["critic/score/mean"] == pytest.approx(0.1)
    assert not (settings.checkpoint_dir / STAGING_DIR / "global_step_2").exists()


def test_upload_survives_verl_deleting_the_step_dir_during_the_upload(settings):
    """verl's max_ckpt_to_keep removes old dirs at the next save; the staged hard links keep the bytes."""
    callback = _callback(settings)
    step_dir = write_step(settings.checkpoint_dir, 1)
    callback.on_save(trainer=SimpleNamespace(total_training_steps=4), global_step=1, checkpoint_dir=str(step_dir))
    shutil.rmtree(step_dir)
    callback.close()
    assert _store_checkpoints(settings).latest_complete("r1").step == 1


def test_last_step_is_committed_before_on_save_returns(settings):
    callback = _callback(settings, total=1)
    callback.on_save(trainer=None, global_step=1, checkpoint_dir=str(write_step(settings.checkpoint_dir, 1)))
    assert _store_checkpoints(settings).latest_complete("r1").step == 1  # no close(): the driver exits after fit


def test_missing_rank_shards_are_refused_not_committed(settings):
    callback = _callback(settings)
    step_dir = write_step(settings.checkpoint_dir, 1, world=2, ranks=[0])  # rank 1 wrote to another node's disk
    with pytest.raises(ConfigError, match=r"ranks \[1\].*upload every node.s checkpoint dir to the store"):
        callback.on_save(trainer=None, global_step=1, checkpoint_dir=str(step_dir))
    callback.close()
    assert _store_checkpoints(settings).latest_complete("r1") is None


def test_async_save_is_refused(settings):
    with pytest.raises(ConfigError, match="async_save"):
        _callback(settings).on_save(trainer=None, global_step=1, checkpoint_dir="x/global_step_1", async_save=True)


def test_restore_writes_the_tracker_and_never_picks_a_torn_local_dir(settings, tmp_path):
    callback = _callback(settings)
    for step in (1, 2):
        log_step(settings, step, reward=0.5)
        callback.on_save(trainer=None, global_step=step, checkpoint_dir=str(write_step(settings.checkpoint_dir, step)))
    callback.close()
    # A new node: its disk holds a torn step 3 (no data.pt, preempted mid-save) and a tracker pointing at it.
    node = StoreSettings(settings.uri, settings.endpoint_url, "r1", tmp_path / "node2" / "ckpt")
    torn = write_step(node.checkpoint_dir, 3)
    (torn / "data.pt").unlink()
    (node.checkpoint_dir / "global_step_2" / "actor").mkdir(parents=True)
    (node.checkpoint_dir / "global_step_2" / "actor" / "stale.pt").write_bytes(b"left by an interrupted save")

    assert restore_latest(node) == 2
    assert (node.checkpoint_dir / TRACKER_FILE).read_text() == "2"
    assert not torn.exists() and not (node.checkpoint_dir / "global_step_2" / "actor" / "stale.pt").exists()
    restored = torch.load(node.checkpoint_dir / "global_step_2" / "actor" / "model_world_size_1_rank_0.pt")
    assert torch.equal(restored["w"], torch.full((4,), 2.0))
    assert [r["step"] for r in read_records(node.history_path)] == [1, 2]

    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    assert find_latest_ckpt_path(str(node.checkpoint_dir)) == str(node.checkpoint_dir / "global_step_2")


def test_restore_without_a_committed_checkpoint_starts_fresh(settings):
    write_step(settings.checkpoint_dir, 5)  # local only: never committed, so never trusted
    assert restore_latest(settings) is None
    assert not (settings.checkpoint_dir / TRACKER_FILE).exists()
    assert settings.local_checkpoints.steps() == []


def test_restore_entry_fetches_the_dataset_when_not_mounted(settings, monkeypatch, tmp_path):
    from verl_grpo.trainers.verl import restore as verl_restore

    store = Store(settings.uri, settings.endpoint_url)
    store.write_text("parquet-bytes", "datasets/gsm8k/h1/train.parquet")
    for k, v in checkpoint_env(settings.uri, settings.endpoint_url, "r1", str(settings.checkpoint_dir), 2).items():
        monkeypatch.setenv(k, v)
    dest = tmp_path / "data"
    assert verl_restore.main(["--dataset-uri", store.url("datasets/gsm8k/h1"), "--dataset-dir", str(dest)]) == 0
    assert (dest / "train.parquet").read_text() == "parquet-bytes"
    assert verl_restore.main(["--dataset-uri", store.url("datasets/gsm8k/missing"),
                              "--dataset-dir", str(tmp_path / "d2")]) == EXIT_USER_ERROR


def test_finalize_merges_with_verls_model_merger_and_publishes_the_result(settings, tiny_model_dir):
    """A real `python -m verl.model_merger merge --backend fsdp` on CPU over a world-size-1 FSDP checkpoint."""
    callback = _callback(settings, total=2)
    log_step(settings, 1, reward=0.25)
    callback.on_save(trainer=None, global_step=1, checkpoint_dir=str(write_step(settings.checkpoint_dir, 1)))
    callback.close()
    write_step(settings.checkpoint_dir, 2, model_dir=tiny_model_dir)  # final save whose upload was lost
    log_step(settings, 2, reward=0.75)

    result = finalize(settings, backend="fsdp2", train_batch_size=8)

    store = Store(settings.uri, settings.endpoint_url)
    assert TrainResult.model_validate_json(store.read_text("runs/r1/train_result.json")) == result
    assert result.final_step == 2 and result.checkpoint.step == 2
    assert result.summary["final_reward"] == pytest.approx(0.75) and result.summary["mean_reward"] == pytest.approx(0.5)
    assert result.model_uri == store.url("runs/r1/model")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(store.listdir("runs/r1/model"))
    assert [json.loads(x)["step"] for x in store.read_text("runs/r1/metrics.jsonl").splitlines()] == [1, 2]

    from safetensors.torch import load_file

    local = Path(settings.checkpoint_dir.parent / "merged-check")
    store.get_dir(local, "runs/r1/model")
    merged = load_file(local / "model.safetensors")
    original = load_file(Path(tiny_model_dir) / "model.safetensors")
    assert set(merged) == set(original)
    for key in original:  # verl's merger writes bfloat16 weights
        assert merged[key].dtype == torch.bfloat16
        assert torch.equal(merged[key], original[key].to(torch.bfloat16)), key
