"""The rollout servers' and router's HTTP API as pydantic models, shared by the servers, the router and the clients.

Kept free of torch and transformers so the router and the trainer's clients import it cheaply.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

MAX_PROMPTS = 1024
MAX_SAMPLES = 64


class GenerateRequest(BaseModel):
    prompts: list[str] = Field(min_length=1, max_length=MAX_PROMPTS)
    """Final prompt text (the caller already applied the chat template)."""
    n: int = Field(default=1, ge=1, le=MAX_SAMPLES)
    """Samples per prompt."""
    max_new_tokens: int = Field(ge=1, le=32768)
    temperature: float = Field(default=1.0, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = 0
    """Keep the k most likely tokens when sampling; 0 or below disables the cut."""
    seed: int | None = None
    """Seed of the sampler: the same request with the same seed on the same weights samples the same tokens."""


class RolloutOutput(BaseModel):
    prompt_index: int
    text: str
    """The generated text, special tokens dropped."""
    prompt_token_ids: list[int]
    token_ids: list[int]
    """Generated tokens, the end-of-sequence token included when the model emitted one."""
    logprobs: list[float]
    """log softmax(logits / temperature) of each token_ids[i] (no top-k/top-p renormalisation)."""
    finish_reason: Literal["stop", "length"]


class GenerateResponse(BaseModel):
    policy_version: int
    """The weights that generated every output."""
    worker: str
    """The rollout server that answered (its URL)."""
    outputs: list[RolloutOutput]
    """n outputs per prompt, grouped by prompt in request order."""


class UpdateWeightsRequest(BaseModel):
    path: str = Field(min_length=1)
    """A Hugging Face model directory holding the new weights as *.safetensors."""
    policy_version: int = Field(ge=0)


class UpdateWeightsResponse(BaseModel):
    policy_version: int
    seconds: float


class PolicyVersion(BaseModel):
    policy_version: int
    model_path: str


class ServerHealth(BaseModel):
    status: Literal["ok"] = "ok"
    policy_version: int
    model_path: str
    in_flight: int
    service: str = "rollout-server"
    uptime_s: float = 0.0


class WorkerState(BaseModel):
    url: str
    healthy: bool
    in_flight: int
    requests: int
    policy_version: int | None
    """Last version the worker reported on /health; None before it answered once."""


class RouterHealth(BaseModel):
    status: Literal["ok", "degraded"]
    """degraded while at least one worker is unhealthy."""
    workers: list[WorkerState]
    service: str = "rollout-router"
    uptime_s: float = 0.0


class WorkerList(BaseModel):
    workers: list[str]


class RouterStats(BaseModel):
    requests: int
    """Generate requests the router answered with a worker's output."""
    per_worker: dict[str, int]
