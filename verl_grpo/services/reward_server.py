"""reward-server: `POST /batch_reward` scores responses with verl_grpo.rewards (or a neural reward model).

Items are `{data_source, solution_str, ground_truth, extra_info}` — verl's scorer arguments. The answer has the
seed's shape (SkyPilot's llm/verl-jobgroup reward server): `rewards`, one `{reward, correct, extracted_answer}`
per item in request order, plus `mean_reward` and `accuracy`; each reward also carries `components`, the whole
score dict `compute_score` returns (`score` plus the GRAIL components), which verl's reward loop and TRL read.
Items are grouped by dataset so MBPP programs of one request run in parallel on the sandbox pool. With
`--reward-model PATH` the same API is answered by a sequence-classification model instead.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any, Literal

import click
from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field, JsonValue

from verl_grpo.errors import DataError
from verl_grpo.rewards import compute_scores, dataset_of
from verl_grpo.rewards.user_reward import UserReward
from verl_grpo.services import SERVICES
from verl_grpo.services.http import ERROR_RESPONSES, ServiceError, create_app
from verl_grpo.services.serving import Serving, serve_command, service_cli

logger = logging.getLogger(__name__)
SPEC = SERVICES["reward"]
MAX_SOLUTION_CHARS = 200_000


class RewardItem(BaseModel):
    data_source: str = Field(max_length=200, examples=["gsm8k"])
    solution_str: str = Field(max_length=MAX_SOLUTION_CHARS)
    ground_truth: JsonValue = None
    extra_info: dict[str, JsonValue] | None = None


class BatchRewardRequest(BaseModel):
    items: list[RewardItem] = Field(min_length=1)


class RewardResult(BaseModel):
    reward: float
    """The total reward of the item (the score dict's `score`)."""
    correct: bool | None
    """Whether the answer is right (`acc` of the rule scorers); None for a neural reward model, which judges none."""
    extracted_answer: str | None = None
    """The answer the scorer read from the response (`pred`), when the dataset's scorer extracts one."""
    components: dict[str, JsonValue]
    """The whole score dict: `score`, each weighted component, `acc` and the scorer's details."""

    @classmethod
    def of(cls, score: dict[str, Any]) -> RewardResult:
        acc = score.get("acc")
        pred = score.get("pred")
        return cls(reward=float(score["score"]), correct=None if acc is None else float(acc) >= 1.0,
                   extracted_answer=None if pred in (None, "") else str(pred), components=score)


class BatchRewardResponse(BaseModel):
    rewards: list[RewardResult]
    """One result per item, in request order."""
    mean_reward: float
    """Mean of the items' rewards."""
    accuracy: float | None
    """Share of correct items (None when the scorer judges no correctness)."""
    scorer: Literal["rule", "model"]
    """`rule` (verifiable rewards) or `model` (neural reward model)."""
    seconds: float
    """Time spent scoring."""

    @classmethod
    def of(cls, scores: list[dict[str, Any]], scorer: str, seconds: float) -> BatchRewardResponse:
        rewards = [RewardResult.of(s) for s in scores]
        judged = [r.correct for r in rewards if r.correct is not None]
        return cls(rewards=rewards, mean_reward=sum(r.reward for r in rewards) / len(rewards),
                   accuracy=sum(judged) / len(judged) if judged else None, scorer=scorer, seconds=seconds)


class RuleScorer:
    """verl_grpo.rewards behind the batch API (MBPP through the shared sandbox pool), or the run's own function
    (`--reward-path`, guarded as everywhere: a failing call scores its item 0 with `failed` 1)."""

    kind = "rule"

    def __init__(self, user: UserReward | None = None):
        self.user = user
        if user is not None:
            user.check()  # a function that cannot even be imported fails the server's start, in one line

    def score(self, items: list[RewardItem]) -> list[dict[str, Any]]:
        if self.user is not None:
            return self.user.score_many([i.data_source for i in items], [i.solution_str for i in items],
                                        [i.ground_truth for i in items], [i.extra_info for i in items])
        groups: dict[str, list[int]] = defaultdict(list)
        for i, item in enumerate(items):
            try:
                groups[dataset_of(item.data_source)].append(i)
            except ValueError as e:
                raise ServiceError(422, "unknown_data_source", f"items[{i}].data_source: {e}") from None
        out: list[dict[str, Any] | None] = [None] * len(items)
        for dataset, idx in groups.items():
            try:
                results = compute_scores(dataset, [items[i].solution_str for i in idx],
                                         [items[i].ground_truth for i in idx])
            except (DataError, ValueError, TypeError) as e:
                raise ServiceError(422, "invalid_item", f"{dataset} items: {e}") from None
            for i, result in zip(idx, results):
                out[i] = result
        return [r for r in out if r is not None]

    def info(self) -> dict[str, Any]:
        return {"scorer": self.kind, **({"reward": self.user.label} if self.user else {})}


class ModelScorer:
    """A sequence-classification reward model behind the batch API."""

    kind = "model"

    def __init__(self, path: str, batch_size: int = 16):
        from verl_grpo.services.reward_model import SequenceClassifierReward

        self.model = SequenceClassifierReward(path, batch_size=batch_size)

    def score(self, items: list[RewardItem]) -> list[dict[str, Any]]:
        prompts = [_prompt_of(item) for item in items]
        return self.model.score([item.solution_str for item in items], prompts)

    def info(self) -> dict[str, Any]:
        return {"scorer": self.kind, "model": self.model.path, "num_labels": self.model.num_labels,
                "device": self.model.device}


def _prompt_of(item: RewardItem) -> str | None:
    prompt = (item.extra_info or {}).get("prompt")
    return prompt if isinstance(prompt, str) else None


def build_app(scorer: RuleScorer | ModelScorer, token: str | None, max_body_bytes: int, max_items: int = 4096):
    app, auth = create_app(SPEC.task, token, max_body_bytes,
                           description="Scores responses with the verifiable rewards (or a neural reward model).",
                           health_info=scorer.info)
    router = APIRouter(dependencies=[Depends(auth)], responses=ERROR_RESPONSES)

    @router.post("/batch_reward", response_model=BatchRewardResponse)
    def batch_reward(request: BatchRewardRequest) -> BatchRewardResponse:
        """A reward (with its score components) for every item, in order."""
        if len(request.items) > max_items:
            raise ServiceError(422, "too_many_items", f"{len(request.items)} items exceed the limit of {max_items}; "
                                                      "split the batch")
        started = time.perf_counter()
        scores = scorer.score(request.items)
        return BatchRewardResponse.of(scores, scorer.kind, round(time.perf_counter() - started, 6))

    app.include_router(router)
    return app


cli = service_cli("reward-server: verifiable rewards (or a neural reward model) over HTTP.")


@serve_command(cli, SPEC.port,
               click.option("--reward-model", default=None, envvar="VERL_GRPO_REWARD_MODEL",
                            help="Sequence-classification model dir to score with instead of the rule-based scorers."),
               click.option("--model-batch-size", type=int, default=16, show_default=True),
               click.option("--max-items", type=int, default=4096, show_default=True),
               click.option("--reward-path", default=None,
                            help="The run's own reward function: a .py file or pkg.module (reward.path)."),
               click.option("--reward-name", default="compute_score", show_default=True),
               click.option("--reward-timeout-s", type=float, default=10.0, show_default=True))
def serve(serving: Serving, reward_model, model_batch_size, max_items, reward_path, reward_name,
          reward_timeout_s) -> None:
    user = UserReward(reward_path, reward_name, reward_timeout_s) if reward_path else None
    scorer = ModelScorer(reward_model, model_batch_size) if reward_model else RuleScorer(user)
    serving.run(build_app(scorer, serving.token, serving.max_body_bytes, max_items))


if __name__ == "__main__":
    cli()
