"""TRL adapter: one reward function per component, so GRPOTrainer logs `rewards/<component>/mean`.

TRL calls each function as `f(prompts=..., completions=..., completion_ids=..., **columns)` where the
columns are the dataset's (`data_source`, `reward_model`, `extra_info`, ...) plus trainer extras
(`trainer_state`, `log_extra`, `log_metric`), and sums `weight * f(...)` with `args.reward_weights`.
A response is scored once per (completion, ground truth) and the other components reuse that
result, so an MBPP program runs once per completion (the whole batch in parallel on the pool).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from verl_grpo.errors import DataError
from verl_grpo.formats import THINK_CLOSE, THINK_OPEN
from verl_grpo.rewards.scoring import WEIGHTS, compute_scores, dataset_of
from verl_grpo.rewards.user_reward import FailureGuard, UserReward, step_metrics

_CACHE_SIZE = 8192


class _ScoreCache:
    """Most recent results keyed by (dataset, completion text, ground truth)."""

    def __init__(self, size: int = _CACHE_SIZE):
        self.size = size
        self._items: OrderedDict[tuple[str, str, str], dict] = OrderedDict()
        self._lock = threading.Lock()
        self.scored = 0
        """How many responses were actually scored (cache misses)."""

    def results(self, dataset: str, texts: Sequence[str], truths: Sequence[Any]) -> list[dict]:
        keys = [(dataset, t, _truth_key(g)) for t, g in zip(texts, truths, strict=True)]
        with self._lock:
            missing = {k: i for i, k in enumerate(keys) if k not in self._items}
        if missing:
            idx = list(missing.values())
            fresh = compute_scores(dataset, [texts[i] for i in idx], [truths[i] for i in idx])
            with self._lock:
                self.scored += len(idx)
                for k, result in zip(missing, fresh):
                    self._items[k] = result
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
        with self._lock:
            out = []
            for k in keys:
                if k not in self._items:  # evicted by a concurrent batch: score it again
                    self._items[k] = compute_scores(dataset, [k[1]], [json.loads(k[2])])[0]
                self._items.move_to_end(k)
                out.append(self._items[k])
            return out


def _truth_key(ground_truth: Any) -> str:
    return json.dumps(ground_truth, sort_keys=True, default=str)


_cache = _ScoreCache()


def completion_text(completion: Any) -> str:
    """A standard completion is a string; a conversational one a list of messages (assistant turns joined)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return message_text(completion)
    if isinstance(completion, (list, tuple)):
        return "".join(message_text(m) for m in completion
                       if isinstance(m, dict) and m.get("role", "assistant") == "assistant")
    raise DataError(f"completion of type {type(completion).__name__} is neither text nor a list of chat messages")


def message_text(message: Mapping[str, Any]) -> str:
    """What the model wrote in one assistant message. TRL parses a tool run's completions with the chat template's
    response schema, which moves the <think> block out of `content` into `reasoning_content`: it goes back in front,
    where the model wrote it, or the thinking and format components would never see it."""
    content = message.get("content") or ""
    text = content if isinstance(content, str) else _content_text(content)
    reasoning = message.get("reasoning_content")
    return f"{THINK_OPEN}{reasoning}{THINK_CLOSE}{text}" if reasoning else text


def _content_text(content: Any) -> str:
    """Text of multimodal-style content blocks ([{"type": "text", "text": ...}, ...])."""
    return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")


class ComponentReward:
    """A TRL reward function returning one component; picklable, named after the component."""

    def __init__(self, dataset: str, component: str):
        self.dataset = dataset
        self.component = component
        self.__name__ = component

    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
                 **kwargs: Any) -> list[float]:
        texts, truths = texts_and_truths(completions, kwargs)
        sources = kwargs.get("data_source") or [self.dataset] * len(texts)
        datasets = [dataset_of(s) for s in sources]
        scores: list[float] = [0.0] * len(texts)
        for dataset in sorted(set(datasets)):
            idx = [i for i, d in enumerate(datasets) if d == dataset]
            if self.component not in WEIGHTS[dataset]:
                raise DataError(
                    f"row data_source {sources[idx[0]]!r} is {dataset}, which has no {self.component!r} component; "
                    f"build the reward functions with trl_reward_functions({dataset!r})"
                )
            for i, result in zip(idx, _cache.results(dataset, [texts[i] for i in idx], [truths[i] for i in idx])):
                scores[i] = float(result[self.component])
        return scores

    def __repr__(self) -> str:
        return f"ComponentReward({self.dataset!r}, {self.component!r})"


def texts_and_truths(completions: Sequence[Any] | None, kwargs: Mapping[str, Any]) -> tuple[list[str], list[Any]]:
    """What a TRL reward call scores: each completion's text and its row's ground truth (the `reward_model` column
    TRL passes as a keyword); a missing piece is one DataError naming it."""
    if completions is None:
        raise DataError("TRL passed no completions to the reward function")
    reward_model = kwargs.get("reward_model")
    if reward_model is None:
        raise DataError("dataset column 'reward_model' (a dict with ground_truth) is missing; run `prepare` again")
    return [completion_text(c) for c in completions], [_ground_truth(rm, i) for i, rm in enumerate(reward_model)]


def _ground_truth(reward_model: Any, row: int) -> Any:
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise DataError(f"row {row}: reward_model must be a dict with a 'ground_truth' key, got {reward_model!r:.80}")
    return reward_model["ground_truth"]


def trl_reward_functions(data_source: str) -> tuple[list[Callable[..., list[float]]], list[float]]:
    """(reward_funcs, reward_weights) for GRPOTrainer: one function per component with its weight."""
    dataset = dataset_of(data_source)
    weights = WEIGHTS[dataset]
    return [ComponentReward(dataset, name) for name in weights], list(weights.values())


Results = Callable[[Sequence[Any], Sequence[str], Sequence[Any], Sequence[Any] | None], list[dict]]
"""(data sources, texts, ground truths, extra infos) → one normalised score dict each (rewards.user_reward)."""


class UserScoreReward:
    """The one TRL reward function of a run scored by the user's own function (reward.path): returns each
    completion's `score`; logs each numeric component as `rewards/<key>/mean` and the step's failed calls as
    `reward/failed` (TRL's `log_metric`), and stops the run when every row of its first step failed."""

    __name__ = "score"

    def __init__(self, reward: UserReward, first_step_rows: int, results: Results | None = None):
        """`results`: how rows are scored (default: the function in this process's workers; the reward-server's
        client with `services: [reward]`)."""
        self.reward = reward
        self.results = results or reward.score_many
        self.guard = FailureGuard(reward, first_step_rows)

    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
                 **kwargs: Any) -> list[float]:
        texts, truths = texts_and_truths(completions, kwargs)
        sources = kwargs.get("data_source") or [""] * len(texts)
        results = self.results(sources, texts, truths, kwargs.get("extra_info"))
        self.guard.check(results)
        log_metric = kwargs.get("log_metric")
        if log_metric is not None:
            for name, value in step_metrics(results).items():
                log_metric(name, value)
        return [float(r["score"]) for r in results]

    def __repr__(self) -> str:
        return f"UserScoreReward({self.reward.label})"


def user_reward_functions(cfg: Any, results: Results | None = None) -> tuple[list[UserScoreReward], list[float]]:
    """(reward_funcs, reward_weights) for GRPOTrainer when the run has its own function (reward.path)."""
    reward = UserReward.of(cfg)
    if reward is None:
        raise DataError("user_reward_functions needs reward.path; the task's own scorer is trl_reward_functions")
    rows = cfg.algorithm.train_batch_size * cfg.algorithm.rollouts
    return [UserScoreReward(reward, rows, results)], [1.0]
