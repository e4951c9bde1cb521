"""Priority replay on verl's fully-async trainer: the replay buffer as a second source of each training batch.

What verl 0.9.1 lacks: its FullyAsyncTrainer takes every batch from one MessageQueue
(`FullyAsyncTrainer._get_samples_from_queue`: `required_samples` RolloutSamples that the rollouter cloudpickled,
assembled by `detach_utils.assemble_batch_from_rollout_samples`). The queue is a FIFO with no sampler hook, no second
source and no way to offer a consumed sample again.

The seam: the entry's trainer actor (already a subclass of verl's, for the checkpoint callback) overrides that one
method when `async_training.replay_share` > 0 (see `fully_async_entry.StoreCommittingTrainer`). Per batch it draws
round(required_samples × replay_share) groups from the replay-buffer service by priority, only among groups generated
by a policy version >= current - max_staleness, takes the rest fresh from verl's queue, adds every fresh group to the
buffer (its raw queue bytes, its mean reward as priority, the oldest version that generated it) and counts uses in the
stored item, so a group is trained at most 1 + max_replays times. A replayed RolloutSample is the very object verl put
in the queue: its `rollout_log_probs` (behaviour log-probs: verl's fully-async config sets calculate_log_probs and
use_rollout_log_probs) and `min/max_global_steps` travel unchanged, so verl's rollout correction (bypass mode:
old_log_prob = rollout_log_probs, the PPO ratio π_θ/π_behaviour, clipped) weighs it as it weighs a stale fresh sample.

Why this is the smallest seam: one method of the trainer, nothing in verl's rollouter, queue, loss or weight sync.
A MessageQueue subclass would sit between the rollouter's put and the trainer's get, but the queue's size drives the
rollouter's pause and staleness accounting (replayed groups would count as generated ones), and the queue actor knows
no parameter version (the staleness filter would unpickle every sample there). A rollouter subclass would spend verl's
prompt budget (`total_rollout_steps`) on replays. What stays verl's: the fresh samples' own staleness bound
(async_training.staleness_threshold) and the run's length: the rollouter still generates total_rollout_steps fresh
groups, so with replay the trainer takes about 1/(1 - replay_share) times as many steps to consume them.

This module holds the logic without Ray or a GPU: the split, the staleness bound, the stored item (serialization and
use count), and `ReplayMixer`, which talks to the replay buffer through an async client (`AsyncServiceClient`).
"""

from __future__ import annotations

import base64
import json
import pickle
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_grpo.errors import DataError, TrainingError
from verl_grpo.trainers.loop.batch import replay_count

SETTING_KEYS = ("replay_share", "max_replays", "max_staleness")
"""Our keys in verl's `async_training` section (added with Hydra's `+`; verl ignores them)."""
ADD_BUDGET_BYTES = 4 * 1024 * 1024
"""Largest JSON body of one POST /add (the rendered replay-buffer accepts 8 MiB); larger adds are split."""


@dataclass(frozen=True)
class ReplaySettings:
    replay_share: float = 0.0
    max_replays: int = 1
    max_staleness: int = 1

    @classmethod
    def from_async_training(cls, section: Mapping[str, Any] | Any) -> ReplaySettings:
        """The settings in verl's composed `async_training` section (absent keys: replay off)."""
        get = section.get
        return cls(float(get("replay_share", 0.0) or 0.0), int(get("max_replays", 1)), int(get("max_staleness", 1)))

    @property
    def enabled(self) -> bool:
        return self.replay_share > 0

    def split(self, required: int) -> tuple[int, int]:
        """(groups to draw from the buffer, groups to take fresh) of a batch of `required` groups; at least one stays
        fresh, so the buffer keeps receiving groups."""
        want = replay_count(required, self.replay_share)
        return want, required - want

    def min_policy_version(self, current_version: int) -> int:
        """Oldest policy version a replayed group may come from when the trainer is at `current_version`."""
        return current_version - self.max_staleness


def encode_sample(raw: bytes) -> str:
    """A queue sample's bytes (verl's cloudpickled RolloutSample) as JSON-safe text, compressed."""
    return base64.b64encode(zlib.compress(raw, 1)).decode("ascii")


def decode_sample(text: str) -> Any:
    """The RolloutSample stored by `encode_sample` (plain pickle reads cloudpickle's output of importable classes)."""
    return pickle.loads(zlib.decompress(base64.b64decode(text)))


def behaviour_version(sample: Any) -> int:
    """The oldest policy version that generated any token of the group (verl's per-response `min_global_steps`)."""
    return int(min(sample.full_batch.non_tensor_batch["min_global_steps"]))


def group_reward(sample: Any) -> float:
    """The group's mean reward (verl's streamed `rm_scores`, one score per response at its last token): its priority."""
    batch = sample.full_batch.batch
    if "rm_scores" not in batch.keys():
        raise TrainingError("replay needs each group's reward when it leaves verl's queue (rm_scores, computed by the "
                            "rollouter's reward loop); this run scores later (a colocated reward model): set "
                            "async_training.replay_share=0")
    return float(batch["rm_scores"].sum(dim=-1).mean())


def stored_item(raw: bytes, sample: Any, uses: int = 1) -> dict[str, Any]:
    """The replay buffer item (POST /add) of a group trained `uses` times so far; the data repeats the policy version
    (the /sample answer carries only the data)."""
    version = behaviour_version(sample)
    return {"data": {"sample": encode_sample(raw), "uses": uses, "policy_version": version},
            "reward": group_reward(sample), "policy_version": version}


def replayed_sample(item: Mapping[str, Any]) -> Any:
    """The RolloutSample of a drawn item, its group id (`uid`) made unique to this item: GRPO groups responses by uid
    and a resumed rollouter numbers its samples again from its resume point, so an old uid may recur among fresh
    ones."""
    sample = decode_sample(item["data"]["sample"])
    uids = sample.full_batch.non_tensor_batch["uid"]
    sample.full_batch.non_tensor_batch["uid"] = uids.astype(object) + f"/replay{item['id']}"
    return sample


def after_replay(item: Mapping[str, Any], max_replays: int) -> dict[str, Any] | None:
    """The item to store again after this replay (its use count + 1), or None once it reached 1 + max_replays uses."""
    uses = int(item["data"]["uses"]) + 1
    if uses >= 1 + max_replays:
        return None
    return {"data": {**item["data"], "uses": uses}, "reward": item["reward"],
            "policy_version": int(item["data"]["policy_version"])}


def add_requests(items: Sequence[dict[str, Any]], budget_bytes: int = ADD_BUDGET_BYTES) -> list[list[dict[str, Any]]]:
    """The items in consecutive POST /add bodies of at most `budget_bytes` each (an item over it goes alone)."""
    out: list[list[dict[str, Any]]] = []
    size = 0
    for item in items:
        n = len(json.dumps(item, separators=(",", ":")))
        if not out or size + n > budget_bytes:
            out.append([])
            size = 0
        out[-1].append(item)
        size += n
    return out


class ReplayMixer:
    """The trainer's side of the replay buffer: draws a batch's replayed groups, stores fresh ones, counts uses."""

    def __init__(self, client: Any, settings: ReplaySettings):
        self.client = client
        self.settings = settings

    async def draw(self, required: int, current_version: int) -> list[dict[str, Any]]:
        """Up to `split(required)[0]` distinct items by priority, all within the staleness bound (fewer, or none
        while the buffer is empty or holds only older groups; the batch then takes more fresh groups)."""
        want, _ = self.settings.split(required)
        if want == 0:
            return []
        try:
            answer = await self.client.post("/sample", {
                "size": want, "unique": True, "min_policy_version": self.settings.min_policy_version(current_version)})
        except DataError as e:
            if "empty" in str(e):
                return []
            raise
        return answer["items"]

    async def record(self, fresh: Sequence[tuple[bytes, Any]], drawn: Sequence[Mapping[str, Any]]) -> None:
        """After a batch is taken: retire the drawn items, then store again those with replays left and every fresh
        group. Retiring first means a crash in between loses replays, never grants extra ones."""
        if drawn:
            await self.client.post("/retire", {"ids": [int(item["id"]) for item in drawn]})
        again = [a for a in (after_replay(item, self.settings.max_replays) for item in drawn) if a is not None]
        for body in add_requests([*again, *(stored_item(raw, sample) for raw, sample in fresh)]):
            await self.client.post("/add", {"items": body})


def batch_metrics(fresh: int, replayed: Sequence[Any], current_version: int) -> dict[str, float]:
    """Replay counters of one batch, under verl's `fully_async/` prefix (which its trainer logs)."""
    lags = [current_version - behaviour_version(s) for s in replayed]
    return {"fully_async/replay/groups": float(len(replayed)), "fully_async/replay/fresh_groups": float(fresh),
            "fully_async/replay/share": len(replayed) / max(fresh + len(replayed), 1),
            "fully_async/replay/staleness_max": float(max(lags, default=0))}
