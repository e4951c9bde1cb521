"""rollout-router: one /generate endpoint in front of several rollout servers.

Each request goes to the healthy worker with the fewest requests in flight (ties: the one that served
fewest so far). A worker that fails a request (connection error, timeout, 5xx) is marked unhealthy and the
request is retried once on another; a background check of every worker's /health marks them healthy again.
Weights are never pushed through the router: its /update_weights answers 409 naming GET /workers, the list
the trainer pushes to (SGLang's guidance: update every worker).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import click
import httpx
from fastapi import APIRouter, Depends

from verl_grpo.errors import ConfigError
from verl_grpo.services.http import ERROR_RESPONSES, OwnHealth, SafeJSONResponse, ServiceError, create_app
from verl_grpo.services.rollout_api import (
    GenerateRequest,
    GenerateResponse,
    RouterHealth,
    RouterStats,
    WorkerList,
    WorkerState,
)
from verl_grpo.services.serving import Serving, serve_command, service_cli

logger = logging.getLogger(__name__)
DEFAULT_PORT = 8600
HEALTH_TIMEOUT_S = 2.0


@dataclass
class Worker:
    url: str
    healthy: bool = False
    in_flight: int = 0
    requests: int = 0
    policy_version: int | None = None

    def state(self) -> WorkerState:
        return WorkerState(url=self.url, healthy=self.healthy, in_flight=self.in_flight, requests=self.requests,
                           policy_version=self.policy_version)


def choose_worker(workers: Sequence[Worker], exclude: frozenset[str] = frozenset()) -> Worker | None:
    """The healthy worker (not in `exclude`) with the fewest requests in flight, then fewest served; None if none."""
    candidates = [w for w in workers if w.healthy and w.url not in exclude]
    if not candidates:
        return None
    return min(candidates, key=lambda w: (w.in_flight, w.requests))


class _WorkerFailed(Exception):
    """The worker did not answer usefully (transport error, timeout or 5xx); another one may."""


class RolloutRouter:
    """Worker table, the forwarding of /generate with one retry elsewhere, and the health checks."""

    def __init__(self, urls: Sequence[str], token: str | None, generate_timeout_s: float = 600.0,
                 health_interval_s: float = 1.0):
        self.workers = [Worker(url.rstrip("/")) for url in urls]
        self.health_interval_s = health_interval_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self.http = httpx.AsyncClient(headers=headers, limits=limits,
                                      timeout=httpx.Timeout(generate_timeout_s, connect=5.0))
        self.requests = 0

    async def generate(self, request: GenerateRequest) -> SafeJSONResponse:
        tried: set[str] = set()
        for _ in range(2):
            worker = choose_worker(self.workers, frozenset(tried))
            if worker is None:
                break
            tried.add(worker.url)
            try:
                response = await self._forward(worker, request)
            except _WorkerFailed as e:
                worker.healthy = False
                logger.warning("worker %s failed (%s); marked unhealthy", worker.url, e)
                continue
            self.requests += 1
            return response
        raise ServiceError(503, "no_healthy_worker", f"no healthy rollout worker answered (tried: "
                                                     f"{', '.join(sorted(tried)) or 'none'}); see GET /health")

    async def _forward(self, worker: Worker, request: GenerateRequest) -> SafeJSONResponse:
        worker.in_flight += 1
        try:
            response = await self.http.post(f"{worker.url}/generate", json=request.model_dump())
        except httpx.HTTPError as e:
            raise _WorkerFailed(f"{type(e).__name__}: {e}") from None
        finally:
            worker.in_flight -= 1
        if response.status_code >= 500:
            raise _WorkerFailed(f"HTTP {response.status_code}")
        if response.status_code >= 400:
            raise ServiceError(response.status_code, "worker_rejected", f"{worker.url}: {_message(response)}")
        try:
            body = response.json()
            version = int(body["policy_version"])
        except (ValueError, KeyError, TypeError):
            raise _WorkerFailed("answer is not a /generate response") from None
        worker.requests += 1
        worker.policy_version = version
        # Passed through as the worker wrote it (the server validated it): re-validating every token list costs
        # the router CPU the servers need on a small machine.
        return SafeJSONResponse({**body, "worker": worker.url})

    async def check_health(self) -> None:
        await asyncio.gather(*(self._check(w) for w in self.workers))

    async def _check(self, worker: Worker) -> None:
        try:
            response = await self.http.get(f"{worker.url}/health", timeout=HEALTH_TIMEOUT_S)
            healthy = response.status_code == 200
            if healthy:
                worker.policy_version = response.json().get("policy_version", worker.policy_version)
        except (httpx.HTTPError, ValueError):
            healthy = False
        if healthy != worker.healthy:
            logger.info("worker %s is %s", worker.url, "healthy" if healthy else "unhealthy")
        worker.healthy = healthy

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.check_health()

    def health(self, uptime_s: float) -> RouterHealth:
        status = "ok" if all(w.healthy for w in self.workers) else "degraded"
        return RouterHealth(status=status, workers=[w.state() for w in self.workers], uptime_s=uptime_s)

    def stats(self) -> RouterStats:
        return RouterStats(requests=self.requests, per_worker={w.url: w.requests for w in self.workers})


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300]


def build_app(router_state: RolloutRouter, token: str | None, max_body_bytes: int):
    @asynccontextmanager
    async def lifespan(app):
        await router_state.check_health()
        watcher = asyncio.create_task(router_state.watch())
        try:
            yield
        finally:
            watcher.cancel()
            await router_state.http.aclose()

    app, auth = create_app("rollout-router", token, max_body_bytes, lifespan=lifespan,
                           description="Forwards /generate to the least-loaded healthy rollout server.",
                           own_health=OwnHealth(RouterHealth, router_state.health))
    api = APIRouter(dependencies=[Depends(auth)], responses=ERROR_RESPONSES)

    @api.post("/generate", response_model=GenerateResponse)
    async def generate(request: GenerateRequest) -> SafeJSONResponse:
        """A worker's answer (its URL in `worker`); retried once on another worker when the first fails."""
        return await router_state.generate(request)

    @api.get("/workers", response_model=WorkerList)
    async def workers() -> WorkerList:
        """Every rollout server behind the router: push new weights to each of them."""
        return WorkerList(workers=[w.url for w in router_state.workers])

    @api.get("/stats", response_model=RouterStats)
    async def stats() -> RouterStats:
        return router_state.stats()

    @api.post("/update_weights")
    async def update_weights() -> None:
        """Always 409: weights go to every worker, not through the router."""
        raise ServiceError(409, "push_to_workers", "the router does not take weights; push them to every worker "
                                                   "listed by GET /workers")

    app.include_router(api)
    return app


def parse_workers(value: str) -> list[str]:
    urls = [u.strip().rstrip("/") for u in value.split(",") if u.strip()]
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if not urls or bad:
        raise ConfigError(f"--workers {value!r}: give comma-separated http(s):// URLs of rollout servers"
                          + (f" ({', '.join(bad)} is not one)" if bad else ""))
    if len(set(urls)) != len(urls):
        raise ConfigError(f"--workers {value!r} names a server twice; list each rollout server once")
    return urls


cli = service_cli("rollout-router: least-in-flight routing of /generate across rollout servers.")


@serve_command(cli, DEFAULT_PORT,
               click.option("--workers", "workers_arg", required=True,
                            help="Comma-separated URLs of the rollout servers."),
               click.option("--generate-timeout-s", type=float, default=600.0, show_default=True,
                            help="How long one worker may take to answer /generate before it counts as failed."),
               click.option("--health-interval-s", type=float, default=1.0, show_default=True))
def serve(serving: Serving, workers_arg, generate_timeout_s, health_interval_s) -> None:
    state = RolloutRouter(parse_workers(workers_arg), serving.token, generate_timeout_s, health_interval_s)
    serving.run(build_app(state, serving.token, serving.max_body_bytes))


if __name__ == "__main__":
    cli()
