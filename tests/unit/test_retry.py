"""The declared retry policies: attempts counted, backoff doubling, what is never retried, the error at the end."""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable

import httpx
import pytest

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.errors import ConfigError, DataError, InfraError
from verl_grpo.retry import Backoff, last_error
from verl_grpo.services.client import AsyncServiceClient, ServiceClient, replica_urls, service_url
from verl_grpo.store import Store

BASE = "http://service.test"


class Flaky:
    """A callable that raises `errors[i]` on its i-th call and returns "ok" once they run out."""

    def __init__(self, *errors: BaseException):
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= len(self.errors):
            raise self.errors[self.calls - 1]
        return "ok"


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """The delays the policy asked for; nothing really sleeps."""
    asked: list[float] = []
    monkeypatch.setattr(time, "sleep", asked.append)
    return asked


def _store(tmp_path, retries: int = 3, backoff_s: float = 0.5) -> CheckpointStore:
    return CheckpointStore(Store(f"file://{tmp_path / 'store'}"), retries=retries, backoff_s=backoff_s)


def test_backoff_retries_until_success_with_doubling_delays(sleeps):
    fn = Flaky(ValueError("1"), ValueError("2"), ValueError("3"))
    policy = Backoff(attempts=4, backoff_s=0.25, retry_on=lambda e: isinstance(e, ValueError),
                     give_up=lambda state: pytest.fail(f"gave up after {state.attempt_number}"))
    assert policy.call(fn) == "ok"
    assert fn.calls == 4
    assert sleeps == [0.25, 0.5, 1.0]


def test_backoff_gives_up_with_the_callers_error_after_the_budget(sleeps):
    fn = Flaky(*[ValueError(f"#{i}") for i in range(10)])

    def give_up(state):
        raise InfraError(f"{state.attempt_number} attempts, last {last_error(state)}")

    with pytest.raises(InfraError, match=r"^3 attempts, last #2$"):
        Backoff(attempts=3, backoff_s=0, retry_on=lambda e: isinstance(e, ValueError), give_up=give_up).call(fn)
    assert fn.calls == 3
    assert sleeps == [0, 0], "no sleep after the last attempt"


def test_backoff_passes_other_errors_through_at_once(sleeps):
    fn = Flaky(KeyError("not retried"))
    with pytest.raises(KeyError, match="not retried"):
        Backoff(attempts=5, backoff_s=1, retry_on=lambda e: isinstance(e, ValueError),
                give_up=lambda state: pytest.fail("gave up")).call(fn)
    assert fn.calls == 1 and sleeps == []


def test_checkpoint_retrying_counts_attempts_and_names_the_budget(tmp_path, sleeps, caplog):
    fn = Flaky(*[OSError(errno.EIO, f"I/O error #{i}") for i in range(10)])
    with caplog.at_level(logging.WARNING, logger="verl_grpo.checkpoints"):
        with pytest.raises(InfraError) as err:
            _store(tmp_path).retrying("upload model.bin", fn)
    assert fn.calls == 3
    assert sleeps == [0.5, 1.0]
    message = str(err.value)
    assert message.startswith(f"checkpoint store file://{tmp_path / 'store'}: upload model.bin still failing after "
                              "3 attempts in ")
    assert ("s, the retry budget (storage.upload_retries=3, storage.upload_backoff_s=0.5); "
            "last error: OSError: [Errno 5] I/O error #2") in message
    assert isinstance(err.value.__cause__, OSError)
    retries = [r.getMessage() for r in caplog.records]
    assert retries == ["checkpoint store: upload model.bin failed ([Errno 5] I/O error #0); retry 1 in 0.5s",
                       "checkpoint store: upload model.bin failed ([Errno 5] I/O error #1); retry 2 in 1.0s"]


def test_checkpoint_retrying_returns_once_the_store_recovers(tmp_path, sleeps):
    fn = Flaky(InfraError("store down"), OSError(errno.ECONNRESET, "reset"))
    assert _store(tmp_path).retrying("list checkpoints", fn) == "ok"
    assert fn.calls == 3


@pytest.mark.parametrize("error", [FileNotFoundError(errno.ENOENT, "gone"), IsADirectoryError(errno.EISDIR, "dir"),
                                   NotADirectoryError(errno.ENOTDIR, "file")])
def test_checkpoint_retrying_reraises_a_missing_path_as_is(tmp_path, sleeps, error):
    fn = Flaky(error)
    with pytest.raises(type(error)) as raised:
        _store(tmp_path).retrying("read manifest", fn)
    assert raised.value is error and fn.calls == 1 and sleeps == []


@pytest.mark.parametrize("error, says", [(OSError(errno.ENOSPC, "No space left on device", "/x/f"), "no space left"),
                                         (PermissionError(errno.EACCES, "Permission denied", "/x/f"),
                                          "permission denied")])
def test_checkpoint_retrying_fails_permanent_errors_at_once(tmp_path, sleeps, error, says):
    fn = Flaky(error)
    with pytest.raises(ConfigError, match=says) as raised:
        _store(tmp_path).retrying("upload model.bin", fn)
    assert raised.value.__cause__ is error and fn.calls == 1 and sleeps == []


def _answers(*statuses: int) -> tuple[list[httpx.Request], Callable[[httpx.Request], httpx.Response]]:
    """A transport handler answering `statuses` in order (a status of 0 is a refused connection), then 200."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status = statuses[len(seen) - 1] if len(seen) <= len(statuses) else 200
        if status == 0:
            raise httpx.ConnectError("connection refused", request=request)
        body = {"ok": True} if status == 200 else {"error": {"message": f"status {status}"}}
        return httpx.Response(status, json=body)

    return seen, handle


def _client(handle, retries: int) -> ServiceClient:
    client = ServiceClient(BASE, token="t", retries=retries, backoff_s=0.5)
    client._http = httpx.Client(base_url=BASE, transport=httpx.MockTransport(handle))
    return client


def test_service_client_retries_and_gives_up_after_retries_plus_one(sleeps):
    seen, handle = _answers(*[503] * 10)
    with _client(handle, retries=2) as client, pytest.raises(InfraError) as err:
        client.get("/health")
    assert len(seen) == 3
    assert sleeps == [0.5, 1.0]
    assert str(err.value) == (f"GET {BASE}/health failed after 3 attempts: InfraError: GET {BASE}/health: HTTP 503: "
                              f"status 503; is the service at {BASE} up?")


def test_service_client_rides_out_refused_connections(sleeps):
    seen, handle = _answers(0, 502)
    with _client(handle, retries=2) as client:
        assert client.post("/score", {"x": 1}) == {"ok": True}
    assert len(seen) == 3


def test_service_client_does_not_retry_a_client_error(sleeps):
    seen, handle = _answers(404)
    with _client(handle, retries=4) as client, pytest.raises(DataError, match="HTTP 404: status 404"):
        client.get("/missing")
    assert len(seen) == 1 and sleeps == []


def test_service_client_with_no_retries_tries_once(sleeps):
    seen, handle = _answers(0)
    with _client(handle, retries=0) as client, pytest.raises(InfraError, match="failed after 1 attempts: ConnectError"):
        client.get("/health")
    assert len(seen) == 1 and sleeps == []


async def _async_post(handle, retries: int) -> object:
    client = AsyncServiceClient(BASE, token="t", retries=retries, backoff_s=0)
    client._http = httpx.AsyncClient(base_url=BASE, transport=httpx.MockTransport(handle))
    try:
        return await client.post("/batch_reward", {"items": []})
    finally:
        await client.aclose()


def test_async_client_gives_up_after_retries_plus_one():
    seen, handle = _answers(*[429] * 10)
    with pytest.raises(InfraError) as err:
        asyncio.run(_async_post(handle, retries=3))
    assert len(seen) == 4
    assert str(err.value) == (f"POST {BASE}/batch_reward failed after 4 attempts: InfraError: "
                              f"POST {BASE}/batch_reward: HTTP 429: status 429; is the service at {BASE} up?")


def test_async_client_rides_out_refused_connections():
    seen, handle = _answers(0, 500)
    assert asyncio.run(_async_post(handle, retries=3)) == {"ok": True}
    assert len(seen) == 3


def test_a_service_with_replicas_is_spread_over_them_and_a_retry_takes_the_next(sleeps):
    """services.retrieval.replicas > 1 exports one URL per replica, comma-separated; SkyPilot's job-group DNS has no
    name that spreads over a task's nodes, so the client does."""
    seen, handle = _answers(0)  # the first attempt's replica refuses the connection
    client = ServiceClient("http://r-0.g:8002, http://r-1.g:8002/", token="t", retries=2, backoff_s=0.5)
    client._http = httpx.Client(transport=httpx.MockTransport(handle))
    with client:
        assert client.urls == ["http://r-0.g:8002", "http://r-1.g:8002"]
        client.post("/retrieve", {"queries": ["q"]})
        for _ in range(4):
            client.get("/health")
    hosts = [r.url.host for r in seen]
    assert hosts[0] != hosts[1]  # the retry after the refused connection went to the other replica
    assert hosts == hosts[:2] * 3  # and the requests take the replicas in turn


def test_service_url_keeps_every_replica():
    env = {"VERL_GRPO_RETRIEVAL_SERVER_URL": "http://r-0.g:8002/,http://r-1.g:8002"}
    assert service_url("retrieval", env) == "http://r-0.g:8002,http://r-1.g:8002"
    with pytest.raises(ConfigError, match="names no URL"):
        replica_urls(" , ")
