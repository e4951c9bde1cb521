"""The loop's rollout producer: a thread that takes prompts from the data-server, generates through the router,
scores through the reward-server and queues prompt groups for the trainer, staying at most a bounded number of
groups ahead (async_training.staleness_threshold, as verl bounds its sample queue)."""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verl_grpo.config import RunConfig
from verl_grpo.services.reward_client import reward_item, score_batch
from verl_grpo.trainers.loop.batch import Group, Rollout, prompt_ids, replay_count
from verl_grpo.trainers.worker.samples import score_components


def groups_ahead(cfg: RunConfig) -> int:
    """Most fresh groups generated but not yet trained: one sync period's fresh groups × (1 + staleness_threshold),
    verl's bound on its sample queue (`max_required_samples`)."""
    alg, at = cfg.algorithm, cfg.async_training
    fresh_per_step = alg.train_batch_size - replay_count(alg.train_batch_size, at.replay_share)
    return max(1, math.ceil(fresh_per_step * at.trigger_parameter_sync_step * (1 + at.staleness_threshold)))


@dataclass(frozen=True)
class Produced:
    """A group and the seconds its batch spent generating and being scored."""

    group: Group
    generate_s: float
    reward_s: float


class RolloutProducer:
    """Generates fresh groups in a background thread; `take()` hands them over in data-server order."""

    def __init__(self, cfg: RunConfig, data, router, reward_client, render: Callable[[list[dict]], str],
                 batch_size: int):
        self.cfg, self.data, self.router, self.reward_client = cfg, data, router, reward_client
        self.render, self.batch_size = render, batch_size
        self.slots = threading.Semaphore(groups_ahead(cfg))
        self.out: queue.Queue[Produced | BaseException] = queue.Queue()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)

    def start(self) -> RolloutProducer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=60)

    def take(self) -> Produced:
        """The next fresh group (blocking); re-raises the producer's error."""
        while True:
            try:
                item = self.out.get(timeout=1.0)
            except queue.Empty:
                if not self.thread.is_alive():
                    raise RuntimeError("the rollout producer thread ended without an error") from None
                continue
            if isinstance(item, BaseException):
                raise item
            self.slots.release()
            return item

    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                got = 0
                while got < self.batch_size and not self.stopping.is_set():
                    if self.slots.acquire(timeout=0.5):
                        got += 1
                if self.stopping.is_set():
                    return
                for produced in self._produce(got):
                    self.out.put(produced)
        except BaseException as e:  # noqa: BLE001 - handed to the trainer thread, which raises it
            self.out.put(e)

    def _produce(self, size: int) -> list[Produced]:
        alg = self.cfg.algorithm
        batch = self.data.get("/batch", size=size, split="train")
        rows = batch["rows"]
        ids = prompt_ids((batch["start"]["epoch"], batch["start"]["position"]),
                         (batch["next"]["epoch"], batch["next"]["position"]), [r["epoch"] for r in rows])
        t0 = time.perf_counter()
        response = self.router.generate([self.render(r["prompt"]) for r in rows], n=alg.rollouts,
                                        max_new_tokens=alg.max_response_length, temperature=alg.temperature,
                                        top_p=alg.top_p, top_k=alg.top_k)
        t1 = time.perf_counter()
        outputs = response.outputs
        items = [reward_item(rows[o.prompt_index]["data_source"], o.text,
                             rows[o.prompt_index]["reward_model"]["ground_truth"],
                             rows[o.prompt_index].get("extra_info")) for o in outputs]
        scores = score_batch(items, self.reward_client)
        t2 = time.perf_counter()
        by_prompt: dict[int, list[tuple[Any, dict]]] = {}
        for output, score in zip(outputs, scores, strict=True):
            by_prompt.setdefault(output.prompt_index, []).append((output, score))
        produced = []
        for index, (prompt_id, cursor_after) in enumerate(ids):
            pairs = by_prompt[index]
            rollouts = [Rollout(list(o.token_ids), list(o.logprobs), float(s["score"]), o.finish_reason,
                                components=score_components(s)) for o, s in pairs]
            group = Group(prompt_id, list(pairs[0][0].prompt_token_ids), rollouts, response.policy_version,
                          cursor_after=cursor_after)
            produced.append(Produced(group, t1 - t0, t2 - t1))
        return produced
