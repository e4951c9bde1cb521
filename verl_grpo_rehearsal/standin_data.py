"""The data side of the CPU stand-in for `verl.trainer.main_ppo`: all of it is verl's own code.

verl's tokenizer (`HFModelConfig`), `create_rl_dataset` (RLHFDataset over data.train_files), `create_rl_sampler`
(data.shuffle / data.seed) and the `StatefulDataLoader` exactly as verl's v1 trainer builds it, so the order of
prompts and the resumable position (`data.pt`) are verl's; the reward is the function verl loads from
`reward.custom_reward_function`, called with the keyword call of verl's NaiveRewardManager.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import uuid
from typing import Any

import numpy as np


class StandinData:
    """verl's train dataset, dataloader and custom reward function for one run's config."""

    def __init__(self, config: Any):
        from torchdata.stateful_dataloader import StatefulDataLoader
        from verl.trainer.ppo.reward import get_custom_reward_fn
        from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
        from verl.utils.config import omega_conf_to_dataclass
        from verl.utils.dataset.rl_dataset import collate_fn

        self.config = config
        model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)  # as verl's trainer _init_tokenizer
        self.tokenizer = model_config.tokenizer
        self.train_dataset = create_rl_dataset(config.data.train_files, config.data, self.tokenizer, None,
                                               is_train=True, max_samples=config.data.get("train_max_samples", -1))
        gen_batch_size = config.data.get("gen_batch_size", None) or config.data.train_batch_size
        self.gen_batch_size = int(gen_batch_size)
        self.train_dataloader = StatefulDataLoader(
            dataset=self.train_dataset,
            batch_size=gen_batch_size,
            num_workers=config.data["dataloader_num_workers"],
            drop_last=True,
            collate_fn=collate_fn,
            sampler=create_rl_sampler(config.data, self.train_dataset),
        )
        self.train_dataloader_it = None
        self.steps_per_epoch = len(self.train_dataset) // config.data.train_batch_size
        if self.steps_per_epoch < 1:
            raise ValueError(f"data.train_files has {len(self.train_dataset)} usable prompts, fewer than "
                             f"data.train_batch_size={config.data.train_batch_size}")
        self.reward_fn = get_custom_reward_fn(config)
        if self.reward_fn is None:
            raise ValueError("reward.custom_reward_function.path is not set; the stand-in scores with it")

    def next_batch(self) -> dict[str, Any]:
        """One step's prompts: whole gen_batch_size fetches, restarting the iterator at an epoch's end (verl v1)."""
        chunks = []
        for _ in range(int(self.config.data.train_batch_size) // self.gen_batch_size):
            try:
                if self.train_dataloader_it is None:
                    self.train_dataloader_it = iter(self.train_dataloader)
                chunks.append(next(self.train_dataloader_it))
            except StopIteration:
                self.train_dataloader_it = iter(self.train_dataloader)
                chunks.append(next(self.train_dataloader_it))
        batch = {k: v for k, v in chunks[0].items() if isinstance(v, np.ndarray)}
        for chunk in chunks[1:]:
            batch = {k: np.concatenate([v, chunk[k]]) for k, v in batch.items()}
        batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch["raw_prompt"]))], dtype=object)
        return batch

    @staticmethod
    def prompt_ids(batch: dict[str, Any]) -> list[str]:
        """Each prompt's `extra_info.index` (verl's dataset row id), else the dataset's `index` field."""
        out = []
        for i, extra in enumerate(batch["extra_info"]):
            if isinstance(extra, dict) and extra.get("index") is not None:
                out.append(str(extra["index"]))
            else:
                out.append(str(batch["index"][i]) if "index" in batch else "?")
        return out

    @functools.cached_property
    def loop(self) -> asyncio.AbstractEventLoop:
        """One event loop for every async score of the run (clients are cached per loop, as in verl's reward loop)."""
        return asyncio.new_event_loop()

    def score(self, batch: dict[str, Any], row: int, response_str: str,
              num_turns: int | None = None) -> tuple[float, dict[str, Any]]:
        """verl NaiveRewardManager.run_single's keyword call on prompt `row` of the batch (`num_turns`: the agent
        loop's `__num_turns__`)."""
        extra_info = dict(batch["extra_info"][row] or {})
        extra_info["num_turns"] = num_turns
        extra_info["rollout_reward_scores"] = {}
        reward_fn_key = self.config.data.get("reward_fn_key", "data_source")
        result = self.reward_fn(data_source=batch[reward_fn_key][row], solution_str=response_str,
                                ground_truth=batch["reward_model"][row]["ground_truth"], extra_info=extra_info)
        if inspect.isawaitable(result):  # an async scorer (the reward-server's client): verl's reward loop awaits it
            result = self.loop.run_until_complete(result)
        if isinstance(result, dict):
            return float(result["score"]), result
        return float(result), {}
