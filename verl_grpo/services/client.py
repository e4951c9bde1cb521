"""HTTP clients of the services, with timeouts and retries (sync for TRL/tools, async for verl's reward loop).

A client finds its service from the environment the job group exports: the URL in `VERL_GRPO_<TASK>_URL`
and the token in `VERL_GRPO_SERVICES_TOKEN` (or the file named by `VERL_GRPO_SERVICES_TOKEN_FILE`), or in the
variable `VERL_GRPO_SERVICES_TOKEN_ENV` names when services.token_env is another.
Connection failures, timeouts, 429 and 5xx are retried with exponential backoff and end in InfraError;
401/403 are ConfigError (wrong token); other 4xx are DataError carrying the server's message.

A service with replicas (services.retrieval.replicas) has one URL per replica in its variable, comma-separated:
SkyPilot's job-group DNS names every node (`<task>-<i>.<group>`) and has no name spread over a task's nodes, so the
client spreads: requests go to the replicas in turn from a random one, and a retry goes to the next replica.
"""

from __future__ import annotations

import itertools
import os
import random
from typing import Any, NoReturn

import httpx

from verl_grpo.errors import ConfigError, DataError, InfraError
from verl_grpo.retry import Backoff, last_error
from verl_grpo.services import SERVICES, client_token_env
from verl_grpo.services.http import load_token

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_RETRIES = 4
DEFAULT_BACKOFF_S = 0.5


def service_url(name: str, env: dict[str, str] | None = None) -> str:
    """The URL of service `name` (data, reward, retrieval, replay) from its `VERL_GRPO_<TASK>_URL` (several,
    comma-separated, for a service with replicas; the clients spread over them)."""
    spec = SERVICES.get(name)
    if spec is None:
        raise ConfigError(f"unknown service {name!r}; known: {', '.join(SERVICES)}")
    url = (env if env is not None else os.environ).get(spec.url_env)
    if not url:
        raise ConfigError(f"{spec.url_env} is not set; enable the {spec.task} (services.enabled: [{name}]) "
                          "or export its URL")
    return ",".join(replica_urls(url))


def replica_urls(url: str) -> list[str]:
    """The replicas' URLs in a service URL value: one URL, or several separated by commas."""
    urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
    if not urls:
        raise ConfigError(f"service URL {url!r} names no URL; give http://HOST:PORT (comma-separated for replicas)")
    return urls


def _worth_retrying(exc: BaseException) -> bool:
    """Connection trouble and retryable HTTP statuses (InfraError from `_raise_for`); a 4xx answer would repeat."""
    return isinstance(exc, (httpx.TransportError, InfraError))


def _raise_for(response: httpx.Response, what: str) -> None:
    if response.status_code < 400:
        return
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:300]
    if response.status_code in (401, 403):
        name = client_token_env()
        raise ConfigError(f"{what}: {message}; set {name} (or {name}_FILE) to the "
                          "services' token")
    if response.status_code in RETRY_STATUS:
        raise InfraError(f"{what}: HTTP {response.status_code}: {message}")
    raise DataError(f"{what}: HTTP {response.status_code}: {message}")


class _Base:
    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retries: int = DEFAULT_RETRIES, backoff_s: float = DEFAULT_BACKOFF_S):
        self.urls = replica_urls(base_url)
        self.base_url = ",".join(self.urls)
        self._turn = itertools.count(random.randrange(len(self.urls)))
        self.token = token if token is not None else load_token(client_token_env())
        self.timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
        self.retries = retries
        self.backoff_s = backoff_s

    def _target(self, path: str) -> str:
        """The URL of `path` on the replica whose turn it is (each attempt, retries included, takes the next)."""
        return f"{self.urls[next(self._turn) % len(self.urls)]}{path}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _policy(self, what: str) -> Backoff:
        """Both clients' retry policy: `retries` retries after the first try, the delay doubling from backoff_s.

        Declared here once so the blocking and the async client cannot drift apart.
        """
        return Backoff(attempts=self.retries + 1, backoff_s=self.backoff_s, retry_on=_worth_retrying,
                       give_up=lambda state: self._give_up(what, last_error(state)))

    def _give_up(self, what: str, error: BaseException) -> NoReturn:
        raise InfraError(f"{what} failed after {self.retries + 1} attempts: {type(error).__name__}: {error}; "
                         f"is the service at {self.base_url} up?")


class ServiceClient(_Base):
    """Blocking client of one service."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._http = httpx.Client(timeout=self.timeout, headers=self.headers)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        what = f"{method} {self.base_url}{path}"
        return self._policy(what).call(self._attempt, what, method, path, **kwargs)

    def _attempt(self, what: str, method: str, path: str, **kwargs: Any) -> Any:
        response = self._http.request(method, self._target(path), **kwargs)
        _raise_for(response, what)
        return response.json()

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, json=body)

    def health(self) -> dict[str, Any]:
        return self.get("/health")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "ServiceClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncServiceClient(_Base):
    """Non-blocking client of one service; bind one instance to one event loop."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._http = httpx.AsyncClient(timeout=self.timeout, headers=self.headers)

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        what = f"{method} {self.base_url}{path}"
        return await self._policy(what).acall(self._attempt, what, method, path, **kwargs)

    async def _attempt(self, what: str, method: str, path: str, **kwargs: Any) -> Any:
        response = await self._http.request(method, self._target(path), **kwargs)
        _raise_for(response, what)
        return response.json()

    async def post(self, path: str, body: Any) -> Any:
        return await self.request("POST", path, json=body)

    async def aclose(self) -> None:
        await self._http.aclose()
