"""Blocking clients of a rollout server and of the rollout router (thread-safe: one httpx.Client each).

The trainer samples through `RouterClient.generate` and pushes weights with `RolloutClient.update_weights`
to every URL `RouterClient.workers()` lists, never through the router. Errors follow client.py: transport
trouble and 5xx are retried and end in InfraError, 409 (an older policy version) and other 4xx are DataError.
"""

from __future__ import annotations

from typing import Any

from verl_grpo.services.client import ServiceClient
from verl_grpo.services.rollout_api import (
    GenerateRequest,
    GenerateResponse,
    PolicyVersion,
    RouterStats,
    UpdateWeightsRequest,
    UpdateWeightsResponse,
    WorkerList,
)

GENERATE_TIMEOUT_S = 600.0


class RolloutClient(ServiceClient):
    """Client of one rollout server (or, for /generate, of the router: the API is the same)."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = GENERATE_TIMEOUT_S, **kwargs: Any):
        super().__init__(url, token=token, timeout_s=timeout_s, **kwargs)

    def generate(self, prompts: list[str], *, n: int = 1, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int | None = None) -> GenerateResponse:
        """n samples per prompt (grouped by prompt, in order) with token ids, behaviour log-probs and the version."""
        request = GenerateRequest(prompts=prompts, n=n, max_new_tokens=max_new_tokens, temperature=temperature,
                                  top_p=top_p, top_k=top_k, seed=seed)
        return GenerateResponse.model_validate(self.post("/generate", request.model_dump()))

    def update_weights(self, path: str, policy_version: int) -> dict[str, Any]:
        """Load the HF dir `path` as `policy_version` on this server; DataError (HTTP 409) for an older version."""
        body = UpdateWeightsRequest(path=str(path), policy_version=policy_version).model_dump()
        return UpdateWeightsResponse.model_validate(self.post("/update_weights", body)).model_dump()

    def policy_version(self) -> int:
        return PolicyVersion.model_validate(self.get("/policy_version")).policy_version


class RouterClient(RolloutClient):
    """Client of the rollout router: generate through it, ask it which workers to push weights to."""

    def workers(self) -> list[str]:
        return WorkerList.model_validate(self.get("/workers")).workers

    def stats(self) -> dict[str, Any]:
        return RouterStats.model_validate(self.get("/stats")).model_dump()
