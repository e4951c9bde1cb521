"""A neural reward model: a Hugging Face sequence-classification model scoring (prompt, response) pairs.

One output label: the score is its logit. Several labels: the score is the probability of the last
label (the usual "good"/"chosen" class). The prompt is `extra_info["prompt"]` (a string) when given.
It runs on the node's GPU when there is one (the job group gives the reward-server services.reward.accelerators
when a reward model is set), else on the CPU.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verl_grpo.errors import ConfigError


class SequenceClassifierReward:
    def __init__(self, path: str | Path, batch_size: int = 16, max_length: int = 1024):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = Path(path).expanduser()
        if not (path / "config.json").is_file():
            raise ConfigError(f"services.reward.reward_model {path} is not a Hugging Face model directory "
                              "(no config.json); point it at a saved sequence-classification model")
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = AutoModelForSequenceClassification.from_pretrained(path).eval().to(self.device)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.unk_token
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.path = str(path)
        self.batch_size = batch_size
        self.max_length = min(max_length, getattr(self.tokenizer, "model_max_length", max_length) or max_length)
        self.num_labels = int(self.model.config.num_labels)
        self._torch = torch
        self._lock = threading.Lock()

    def score(self, responses: Sequence[str], prompts: Sequence[str | None]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for start in range(0, len(responses), self.batch_size):
            end = start + self.batch_size
            out += self._score_batch(responses[start:end], prompts[start:end])
        return out

    def _score_batch(self, responses: Sequence[str], prompts: Sequence[str | None]) -> list[dict[str, Any]]:
        torch = self._torch
        pairs = any(p is not None for p in prompts)
        kwargs = dict(padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        if pairs:
            enc = self.tokenizer([p or "" for p in prompts], list(responses), **kwargs)
        else:
            enc = self.tokenizer(list(responses), **kwargs)
        with self._lock, torch.inference_mode():
            logits = self.model(**enc.to(self.device)).logits.float().cpu()
        if self.num_labels == 1:
            scores = logits[:, 0]
        else:
            scores = torch.softmax(logits, dim=-1)[:, -1]
        return [{"score": float(s), "rm_logit": float(row[-1])} for s, row in zip(scores, logits)]
