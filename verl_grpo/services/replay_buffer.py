"""replay-buffer: `POST /add` experiences with rewards, `POST /sample` them with priority by reward, `POST /retire`
items a trainer will never use again (stale beyond its bound, or replayed as often as it allows).

An item is sampled with probability ∝ (reward - min reward in the buffer + eps)^alpha: alpha 0 is uniform,
larger alpha favours high rewards more. The buffer keeps at most `capacity` items; adding beyond it
evicts the oldest.

Persistence (a restart loses nothing that was acknowledged): every /add first writes its items as one
add-log segment `segments/{seq}.json` to the store, then applies them. Every `compact_every` segments
the whole buffer is written as `snapshot.json` (with the last folded seq) and the folded segments are
removed. Restoring = snapshot + the segments after it, replayed in order (eviction is deterministic). A retire is a
segment too (`{"retire": [ids]}`), so a retired item stays gone after a restart.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import click
import numpy as np
from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field, JsonValue, field_validator

from verl_grpo.errors import InfraError
from verl_grpo.services import SERVICES
from verl_grpo.services.http import ERROR_RESPONSES, ServiceError, create_app
from verl_grpo.services.serving import Serving, serve_command, service_cli
from verl_grpo.services.state import ServiceState, service_state, store_options

logger = logging.getLogger(__name__)
SPEC = SERVICES["replay"]
PRIORITY_EPS = 1e-3
SNAPSHOT = "snapshot.json"
SEGMENTS = "segments"


@dataclass(frozen=True)
class Entry:
    id: int
    reward: float
    data: Any
    version: int | None = None
    """Policy version that generated the item, when the adder gave one (a sample may ask for a minimum)."""


def priorities(rewards: np.ndarray, alpha: float, eps: float = PRIORITY_EPS) -> np.ndarray:
    """Sampling probabilities from rewards: ∝ (r - min r + eps)^alpha, summing to 1."""
    if len(rewards) == 0:
        return rewards
    p = np.power(rewards - rewards.min() + eps, alpha)
    return p / p.sum()


class ReplayBuffer:
    """Bounded, ordered (oldest first) items with reward-prioritised sampling. Not thread-safe by itself."""

    def __init__(self, capacity: int, alpha: float, seed: int | None = None):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.alpha = alpha
        self.items: OrderedDict[int, Entry] = OrderedDict()
        self.next_id = 0
        self.added_total = 0
        self.evicted_total = 0
        self.retired_total = 0
        self.rng = np.random.default_rng(seed)

    def add(self, rewards: list[float], data: list[Any], versions: list[int | None] | None = None) -> list[int]:
        ids = []
        for reward, payload, version in zip(rewards, data, versions or [None] * len(rewards), strict=True):
            entry = Entry(self.next_id, float(reward), payload, version)
            self.items[entry.id] = entry
            ids.append(entry.id)
            self.next_id += 1
            self.added_total += 1
            while len(self.items) > self.capacity:
                self.items.popitem(last=False)
                self.evicted_total += 1
        return ids

    def sample(self, size: int, alpha: float | None = None, unique: bool = False, min_version: int | None = None,
               exclude: frozenset[int] = frozenset()) -> tuple[list[Entry], np.ndarray]:
        """`size` entries drawn by priority (with replacement, or distinct ones with `unique`: then at most all
        items), and each one's probability in the draw. Only items of policy version >= min_version (when given)
        and not in `exclude` take part."""
        entries = [e for e in self.items.values() if e.id not in exclude
                   and (min_version is None or (e.version is not None and e.version >= min_version))]
        if not entries:
            return [], np.zeros(0)
        probs = priorities(np.array([e.reward for e in entries]), self.alpha if alpha is None else alpha)
        if unique:
            size = min(size, int(np.count_nonzero(probs)) or len(entries))
        picks = self.rng.choice(len(entries), size=size, replace=not unique, p=probs)
        return [entries[i] for i in picks], probs[picks]

    def retire(self, ids: list[int]) -> int:
        """Remove the items with these ids (unknown ids are ignored); how many were removed."""
        removed = 0
        for item_id in ids:
            if self.items.pop(item_id, None) is not None:
                removed += 1
        self.retired_total += removed
        return removed

    def state(self) -> dict[str, Any]:
        return {"next_id": self.next_id, "added_total": self.added_total, "evicted_total": self.evicted_total,
                "retired_total": self.retired_total,
                "items": [[e.id, e.reward, e.data, e.version] for e in self.items.values()]}

    def load_state(self, state: dict[str, Any]) -> None:
        self.items = OrderedDict((item[0], Entry(*item)) for item in state["items"])  # [id, reward, data, version?]
        self.next_id, self.added_total = state["next_id"], state["added_total"]
        self.evicted_total = state["evicted_total"]
        self.retired_total = state.get("retired_total", 0)
        while len(self.items) > self.capacity:  # restarted with a smaller capacity
            self.items.popitem(last=False)
            self.evicted_total += 1


class PersistentReplayBuffer:
    """A ReplayBuffer whose acknowledged adds survive restarts (add-log segments + periodic snapshot)."""

    def __init__(self, state: ServiceState, capacity: int, alpha: float, compact_every: int = 64,
                 seed: int | None = None):
        self.state = state
        self.buffer = ReplayBuffer(capacity, alpha, seed)
        self.compact_every = compact_every
        self.seq = 0
        """Last add-log segment written."""
        self.snapshot_seq = 0
        self._lock = threading.Lock()
        self._restore()

    def _restore(self) -> None:
        store = self.state.store
        if store.exists(self.state.rel(SNAPSHOT)):
            snap = json.loads(store.read_text(self.state.rel(SNAPSHOT)))
            self.buffer.load_state(snap["buffer"])
            self.seq = self.snapshot_seq = snap["seq"]
        pending = sorted(int(n.split(".")[0]) for n in store.listdir(self.state.rel(SEGMENTS)) if n.endswith(".json"))
        for seq in (s for s in pending if s > self.snapshot_seq):
            segment = json.loads(store.read_text(self.state.rel(SEGMENTS, _segment_name(seq))))
            if "retire" in segment:
                self.buffer.retire(segment["retire"])
            else:
                self.buffer.add(segment["rewards"], segment["data"], segment.get("versions"))
            self.seq = seq
        if self.buffer.added_total:
            logger.info("replay buffer restored from %s: %d items (seq %d)", store.url(self.state.prefix),
                        len(self.buffer.items), self.seq)

    def add(self, rewards: list[float], data: list[Any], versions: list[int | None] | None = None) -> list[int]:
        with self._lock:
            seq = self.seq + 1
            record: dict[str, Any] = {"rewards": rewards, "data": data}
            if versions is not None and any(v is not None for v in versions):
                record["versions"] = versions
            blob = json.dumps(record, separators=(",", ":"))
            self.state.store.write_text(blob, self.state.rel(SEGMENTS, _segment_name(seq)))  # durable first
            self.seq = seq
            ids = self.buffer.add(rewards, data, versions)
            self._maybe_compact()
            return ids

    def retire(self, ids: list[int]) -> int:
        with self._lock:
            seq = self.seq + 1
            self.state.store.write_text(json.dumps({"retire": ids}), self.state.rel(SEGMENTS, _segment_name(seq)))
            self.seq = seq
            removed = self.buffer.retire(ids)
            self._maybe_compact()
            return removed

    def _maybe_compact(self) -> None:
        if self.seq - self.snapshot_seq >= self.compact_every:
            self._compact()

    def _compact(self) -> None:
        try:
            snap = json.dumps({"seq": self.seq, "buffer": self.buffer.state()}, separators=(",", ":"))
            self.state.store.write_text(snap, self.state.rel(SNAPSHOT))
            for seq in range(self.snapshot_seq + 1, self.seq + 1):
                self.state.store.rm(self.state.rel(SEGMENTS, _segment_name(seq)))
            self.snapshot_seq = self.seq
        except InfraError as e:  # the segments are still there: nothing is lost, compaction retries next time
            logger.warning("replay buffer compaction failed: %s", e)

    def sample(self, size: int, alpha: float | None, unique: bool = False, min_version: int | None = None,
               exclude: frozenset[int] = frozenset()) -> tuple[list[Entry], np.ndarray]:
        with self._lock:
            return self.buffer.sample(size, alpha, unique, min_version, exclude)

    def stats(self) -> dict[str, Any]:
        b = self.buffer
        return {"size": len(b.items), "capacity": b.capacity, "alpha": b.alpha, "added_total": b.added_total,
                "evicted_total": b.evicted_total, "retired_total": b.retired_total, "seq": self.seq}


def _segment_name(seq: int) -> str:
    return f"{seq:012d}.json"


class AddItem(BaseModel):
    data: JsonValue
    """The experience (prompt, response, token ids, ...): any JSON."""
    reward: float
    policy_version: int | None = Field(None, ge=0, description="Policy version that generated the experience.")

    @field_validator("reward")
    @classmethod
    def _finite(cls, reward: float) -> float:
        if not math.isfinite(reward):
            raise ValueError("reward must be a finite number")
        return reward


class AddRequest(BaseModel):
    items: list[AddItem] = Field(min_length=1)


class AddResponse(BaseModel):
    ids: list[int]
    size: int


class SampleRequest(BaseModel):
    size: int = Field(ge=1)
    alpha: float | None = Field(None, ge=0, description="Priority exponent for this draw; the server's when omitted.")
    unique: bool = Field(False, description="Distinct items only (at most the buffer's size), still by priority.")
    min_policy_version: int | None = Field(None, description="Only items added with a policy_version >= this.")
    exclude_ids: list[int] = Field(default_factory=list, max_length=65536, description="Items not to draw.")


class SampledItem(BaseModel):
    id: int
    reward: float
    data: JsonValue
    probability: float


class SampleResponse(BaseModel):
    items: list[SampledItem]
    size: int


class Stats(BaseModel):
    size: int
    capacity: int
    alpha: float
    added_total: int
    evicted_total: int
    retired_total: int = 0
    seq: int


class RetireRequest(BaseModel):
    ids: list[int] = Field(min_length=1)


class RetireResponse(BaseModel):
    retired: int
    size: int


def build_app(buffer: PersistentReplayBuffer, token: str | None, max_body_bytes: int, max_sample: int = 65536):
    app, auth = create_app(SPEC.task, token, max_body_bytes,
                           description="Bounded replay buffer with reward-prioritised sampling, persisted to the "
                                       "store.",
                           health_info=buffer.stats)
    router = APIRouter(dependencies=[Depends(auth)], responses=ERROR_RESPONSES)

    @router.post("/add", response_model=AddResponse)
    def add(request: AddRequest) -> AddResponse:
        """Append items (durably: acknowledged adds survive a restart); the oldest are evicted beyond capacity."""
        ids = buffer.add([i.reward for i in request.items], [i.data for i in request.items],
                         [i.policy_version for i in request.items])
        return AddResponse(ids=ids, size=len(buffer.buffer.items))

    @router.post("/sample", response_model=SampleResponse)
    def sample(request: SampleRequest) -> SampleResponse:
        """`size` items drawn with replacement (distinct with `unique`), with probability ∝ (reward - min + eps)^alpha
        among the items that pass the filters (min_policy_version, exclude_ids); none may pass."""
        if request.size > max_sample:
            raise ServiceError(422, "sample_too_large", f"size {request.size} exceeds the limit of {max_sample}")
        if not buffer.buffer.items:
            raise ServiceError(409, "empty", "the replay buffer is empty; POST /add items first")
        entries, probs = buffer.sample(request.size, request.alpha, request.unique, request.min_policy_version,
                                       frozenset(request.exclude_ids))
        items = [SampledItem(id=e.id, reward=e.reward, data=e.data, probability=float(p))
                 for e, p in zip(entries, probs)]
        return SampleResponse(items=items, size=len(buffer.buffer.items))

    @router.post("/retire", response_model=RetireResponse)
    def retire(request: RetireRequest) -> RetireResponse:
        """Remove items for good (durably, like /add): a trainer retires what it will never train again."""
        removed = buffer.retire(request.ids)
        return RetireResponse(retired=removed, size=len(buffer.buffer.items))

    @router.get("/stats", response_model=Stats)
    def stats() -> Stats:
        return Stats(**buffer.stats())

    app.include_router(router)
    return app


cli = service_cli("replay-buffer: prioritised experience replay over HTTP.")


@serve_command(cli, SPEC.port, store_options,
               click.option("--capacity", type=int, default=10000, show_default=True),
               click.option("--alpha", type=float, default=0.6, show_default=True),
               click.option("--compact-every", type=int, default=64, show_default=True),
               click.option("--seed", type=int, default=None,
                            help="Seed of the sampling RNG (default: fresh entropy)."))
def serve(serving: Serving, store_uri, store_endpoint, run_id, capacity, alpha, compact_every, seed) -> None:
    state = service_state(SPEC.task, store_uri, store_endpoint, run_id)
    buffer = PersistentReplayBuffer(state, capacity, alpha, compact_every, seed)
    serving.run(build_app(buffer, serving.token, serving.max_body_bytes))


if __name__ == "__main__":
    cli()
