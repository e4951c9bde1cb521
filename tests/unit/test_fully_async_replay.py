"""Priority replay on verl's fully-async trainer (`trainers.verl.replay` and the entry's `_get_samples_from_queue`),
on CPU with synthetic RolloutSamples of verl's own classes (DataProto, RolloutSample, cloudpickled as the rollouter
does) and the replay-buffer service's real app, reached over HTTP in-process (httpx's ASGI transport)."""

from __future__ import annotations

import asyncio

import cloudpickle
import httpx
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.experimental.fully_async_policy.detach_utils import RolloutSample

from verl_grpo.errors import TrainingError
from verl_grpo.services.client import AsyncServiceClient
from verl_grpo.services.replay_buffer import PersistentReplayBuffer, build_app
from verl_grpo.services.state import service_state
from verl_grpo.trainers.verl.replay import (
    ReplayMixer,
    ReplaySettings,
    add_requests,
    after_replay,
    behaviour_version,
    decode_sample,
    group_reward,
    replayed_sample,
    stored_item,
)

N, PROMPT, RESPONSE = 2, 3, 4
"""Responses per group and token lengths of the synthetic samples."""


def rollout_sample(index: int, version: int, reward: float, max_version: int | None = None) -> RolloutSample:
    """A generated group as verl's rollouter puts it in its queue: N responses with behaviour log-probs, streamed
    rm_scores (the reward at the last response token) and the param versions that generated it."""
    g = torch.Generator().manual_seed(index)
    rm = torch.zeros(N, RESPONSE)
    rm[:, -1] = reward
    batch = DataProto.from_dict(
        tensors={"prompts": torch.randint(0, 50, (N, PROMPT), generator=g),
                 "responses": torch.randint(0, 50, (N, RESPONSE), generator=g),
                 "input_ids": torch.randint(0, 50, (N, PROMPT + RESPONSE), generator=g),
                 "attention_mask": torch.ones(N, PROMPT + RESPONSE, dtype=torch.long),
                 "response_mask": torch.ones(N, RESPONSE, dtype=torch.long),
                 "rollout_log_probs": -torch.rand(N, RESPONSE, generator=g),
                 "rm_scores": rm},
        non_tensors={"uid": np.array([f"uid_sample_0_{index}"] * N, dtype=object),
                     "min_global_steps": np.array([version] * N, dtype=object),
                     "max_global_steps": np.array([max_version if max_version is not None else version] * N,
                                                  dtype=object)},
        meta_info={"metrics": [{"generate_sequences": 0.1, "tool_calls": 0.0}] * N})
    return RolloutSample(full_batch=batch, sample_id=f"sample_0_{index}", epoch=0, rollout_status={"n": index})


def raw(sample: RolloutSample) -> bytes:
    return cloudpickle.dumps(sample)


@pytest.fixture
def buffer_client(tmp_path):
    """An AsyncServiceClient bound to the replay-buffer service's app (alpha 1: priority ∝ reward - min + eps)."""
    buffer = PersistentReplayBuffer(service_state("replay-buffer", f"file://{tmp_path}", None, "r1"), capacity=100,
                                    alpha=1.0, seed=0)
    client = AsyncServiceClient("http://replay-buffer", token="tok")
    client._http = httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(buffer, "tok", 1 << 24)),
                                     headers=client.headers)
    return client, buffer


def test_split_leaves_one_fresh_group_and_the_staleness_bound_counts_versions():
    assert ReplaySettings(0.25).split(8) == (2, 6)
    assert ReplaySettings(0.0).split(8) == (0, 8)
    assert ReplaySettings(0.9).split(2) == (1, 1)
    assert ReplaySettings(0.25, max_staleness=2).min_policy_version(5) == 3


def test_settings_come_from_verls_async_training_section_and_are_off_without_our_keys():
    assert not ReplaySettings.from_async_training(OmegaConf.create({"staleness_threshold": 0.1})).enabled
    at = OmegaConf.create({"staleness_threshold": 0.1, "replay_share": 0.5, "max_replays": 3, "max_staleness": 2})
    assert ReplaySettings.from_async_training(at) == ReplaySettings(0.5, 3, 2)


def test_a_stored_group_comes_back_with_its_behaviour_log_probs_versions_and_a_uid_of_its_own():
    sample = rollout_sample(7, version=3, reward=0.5, max_version=4)
    item = stored_item(raw(sample), sample)
    assert item["reward"] == 0.5 and item["policy_version"] == 3 == item["data"]["policy_version"]
    assert item["data"]["uses"] == 1
    assert behaviour_version(decode_sample(item["data"]["sample"])) == 3
    back = replayed_sample({**item, "id": 11})
    for key in ("rollout_log_probs", "responses", "input_ids", "rm_scores"):
        assert torch.equal(back.full_batch.batch[key], sample.full_batch.batch[key])
    assert list(back.full_batch.non_tensor_batch["max_global_steps"]) == [4, 4]
    assert list(back.full_batch.non_tensor_batch["uid"]) == ["uid_sample_0_7/replay11"] * N
    assert back.full_batch.meta_info["metrics"] == sample.full_batch.meta_info["metrics"]


def test_a_group_without_streamed_rewards_cannot_be_prioritised():
    sample = rollout_sample(1, version=0, reward=1.0)
    sample.full_batch.batch.pop("rm_scores")
    with pytest.raises(TrainingError, match="replay_share=0"):
        group_reward(sample)


def test_use_count_allows_one_fresh_use_plus_max_replays():
    sample = rollout_sample(1, version=0, reward=1.0)
    item = {**stored_item(raw(sample), sample), "id": 0}
    assert after_replay(item, max_replays=1) is None
    again = after_replay(item, max_replays=2)
    assert again["data"]["uses"] == 2 and again["policy_version"] == 0 and again["reward"] == 1.0
    assert after_replay({**again, "id": 1}, max_replays=2) is None


def test_adds_are_split_under_the_body_budget():
    items = [{"data": {"sample": "x" * 100}, "reward": 0.0, "policy_version": 0}] * 5
    assert [len(b) for b in add_requests(items, budget_bytes=350)] == [2, 2, 1]
    assert [len(b) for b in add_requests(items[:1], budget_bytes=10)] == [1]


def test_mixer_draws_within_the_staleness_bound_and_never_past_the_use_count(buffer_client):
    client, buffer = buffer_client
    mixer = ReplayMixer(client, ReplaySettings(replay_share=0.5, max_replays=1, max_staleness=1))

    async def run():
        assert await mixer.draw(4, current_version=0) == []  # empty buffer: the batch is all fresh
        old, new = rollout_sample(1, version=0, reward=1.0), rollout_sample(2, version=3, reward=0.0)
        await mixer.record([(raw(old), old), (raw(new), new)], [])
        drawn = await mixer.draw(4, current_version=4)  # version 0 is 4 versions old: never drawn
        assert [d["data"]["policy_version"] for d in drawn] == [3]
        await mixer.record([], drawn)  # its one replay used: retired, not stored again
        assert await mixer.draw(4, current_version=4) == []
        await client.aclose()

    asyncio.run(run())
    assert sorted(e.version for e in buffer.buffer.items.values()) == [0]
    assert buffer.buffer.retired_total == 1


def test_entry_batch_mixes_replayed_and_fresh_groups_as_verl_assembles_them(buffer_client):
    """The entry trainer's `_get_samples_from_queue` with its queue and replay buffer on CPU: verl's
    assemble_batch_from_rollout_samples builds the batch; the GPU workers are never touched by this method."""
    from verl_grpo.trainers.verl.fully_async_entry import StoreCommittingTrainer

    client, buffer = buffer_client
    queue = [raw(rollout_sample(i, version=2, reward=float(i))) for i in range(10, 20)]

    class Queue:
        async def get_sample(self):
            return queue.pop(0), len(queue)

    trainer = StoreCommittingTrainer.__new__(StoreCommittingTrainer)
    trainer.config = OmegaConf.create({"trainer": {"balance_batch": False}, "async_training": {
        "replay_share": 0.5, "max_replays": 1, "max_staleness": 1}})
    trainer.tokenizer, trainer.message_queue_client = None, Queue()
    trainer.required_samples, trainer.current_param_version, trainer.dynamic_schedule_enabled = 4, 2, False
    trainer._step_wait_times, trainer._step_wait_samples = [], []
    trainer._replay = ReplayMixer(client, ReplaySettings.from_async_training(trainer.config.async_training))

    async def run():
        _, first = await trainer._get_samples_from_queue()
        _, second = await trainer._get_samples_from_queue()
        await client.aclose()
        return first, second

    first, second = asyncio.run(run())
    assert first.meta_info["fully_async/replay/groups"] == 0 and len(first) == 4 * N  # nothing stored yet
    assert second.meta_info["fully_async/replay/groups"] == 2 and second.meta_info["fully_async/replay/share"] == 0.5
    assert len(second) == 4 * N and len(queue) == 10 - 4 - 2
    uids = list(second.non_tensor_batch["uid"])
    replayed_rows = [i for i, u in enumerate(uids) if "/replay" in u]
    assert len(replayed_rows) == 2 * N
    originals = {u: rollout_sample(int(u.split("_")[3].split("/")[0]), version=2, reward=0.0) for u in uids}
    for row in replayed_rows:  # the replayed rows keep the behaviour log-probs they were generated with
        sample = originals[uids[row]]
        assert any(torch.equal(second.batch["rollout_log_probs"][row], lp)
                   for lp in sample.full_batch.batch["rollout_log_probs"])
    assert buffer.buffer.retired_total == 2 and buffer.buffer.added_total == 4 + 2
