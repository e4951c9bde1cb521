"""Rewards from the reward-server, for verl and TRL.

verl: point `reward.custom_reward_function.path=pkg://verl_grpo.services.reward_client` (name `compute_score`).
It is a coroutine, so verl's reward loop awaits it without a thread; it posts one item to
`$VERL_GRPO_REWARD_SERVER_URL/batch_reward` with retries and timeouts and returns the score dict (the
`components` of the answer's one entry in `rewards`).

TRL: `remote_trl_reward_functions(data_source)` returns the same (functions, weights) as
`verl_grpo.rewards.trl_adapter.trl_reward_functions`, but each training step's completions are scored by
the server in one request (the first component's call), the other components reuse that result.
"""

from __future__ import annotations

import asyncio
import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from verl_grpo.config.env import env_setting, non_negative_int, positive_float
from verl_grpo.rewards.scoring import WEIGHTS, dataset_of
from verl_grpo.rewards.trl_adapter import texts_and_truths
from verl_grpo.services.client import AsyncServiceClient, ServiceClient, service_url

TIMEOUT_ENV = "VERL_GRPO_REWARD_TIMEOUT_S"
RETRIES_ENV = "VERL_GRPO_REWARD_RETRIES"

_clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncServiceClient]" = weakref.WeakKeyDictionary()


def jsonable(value: Any) -> Any:
    """`value` with numpy scalars/arrays and other non-JSON leaves turned into JSON values (verl's extra_info
    holds numpy types)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return jsonable(value.tolist())
    if hasattr(value, "item"):
        return jsonable(value.item())
    return str(value)


def reward_item(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, Any]:
    return {"data_source": str(data_source), "solution_str": solution_str, "ground_truth": jsonable(ground_truth),
            "extra_info": jsonable(extra_info) if extra_info else None}


def _client_settings() -> dict[str, Any]:
    return {"timeout_s": env_setting(TIMEOUT_ENV, positive_float, 60.0, "a number of seconds > 0"),
            "retries": env_setting(RETRIES_ENV, non_negative_int, 4, "a whole number >= 0")}


def _async_client() -> AsyncServiceClient:
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = AsyncServiceClient(service_url("reward"), **_client_settings())
        _clients[loop] = client
    return client


async def compute_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None,
                        **kwargs: Any) -> dict[str, Any]:
    """verl's scorer signature, answered by the reward-server (extra kwargs such as reward_router_address
    are accepted and unused)."""
    body = {"items": [reward_item(data_source, solution_str, ground_truth, extra_info)]}
    response = await _async_client().post("/batch_reward", body)
    return score_dicts(response)[0]


def score_dicts(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The score dicts (`score` plus components) of a /batch_reward answer, in item order."""
    return [result["components"] for result in response["rewards"]]


def score_batch(items: Sequence[dict[str, Any]], client: ServiceClient | None = None) -> list[dict[str, Any]]:
    """Score dicts for reward items (see `reward_item`) in one request."""
    own = client is None
    client = client or ServiceClient(service_url("reward"), **_client_settings())
    try:
        return score_dicts(client.post("/batch_reward", {"items": list(items)}))
    finally:
        if own:
            client.close()


class _RemoteScores:
    """Score dicts of recent (dataset, completion, ground truth) triples, fetched from the reward-server."""

    def __init__(self, client_factory: Callable[[], ServiceClient], size: int = 8192):
        self._client_factory = client_factory
        self._client: ServiceClient | None = None
        self._items: OrderedDict[tuple[str, str, str], dict] = OrderedDict()
        self._lock = threading.Lock()
        self.size = size
        self.requests = 0

    def results(self, dataset: str, texts: Sequence[str], truths: Sequence[Any]) -> list[dict]:
        keys = [(dataset, t, json.dumps(g, sort_keys=True, default=str)) for t, g in zip(texts, truths, strict=True)]
        with self._lock:
            missing = list(dict.fromkeys(k for k in keys if k not in self._items))
            if missing:
                if self._client is None:
                    self._client = self._client_factory()
                items = [reward_item(dataset, k[1], json.loads(k[2])) for k in missing]
                for k, result in zip(missing, score_batch(items, self._client), strict=True):
                    self._items[k] = result
                self.requests += 1
            out = [self._items[k] for k in keys]
            for k in keys:
                self._items.move_to_end(k)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
            return out


class RemoteComponentReward:
    """A TRL reward function returning one component of the reward-server's score dict."""

    def __init__(self, dataset: str, component: str, scores: _RemoteScores):
        self.dataset = dataset
        self.component = component
        self.scores = scores
        self.__name__ = component

    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
                 **kwargs: Any) -> list[float]:
        texts, truths = texts_and_truths(completions, kwargs)
        return [float(r[self.component]) for r in self.scores.results(self.dataset, texts, truths)]

    def __getstate__(self) -> dict[str, Any]:  # TRL may deep-copy reward functions; the HTTP client is not copied
        return {"dataset": self.dataset, "component": self.component}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["dataset"], state["component"], _RemoteScores(_default_client))

    def __repr__(self) -> str:
        return f"RemoteComponentReward({self.dataset!r}, {self.component!r})"


def _default_client() -> ServiceClient:
    return ServiceClient(service_url("reward"), **_client_settings())


def remote_trl_reward_functions(data_source: str, client_factory: Callable[[], ServiceClient] | None = None
                                ) -> tuple[list[Callable[..., list[float]]], list[float]]:
    """(reward_funcs, reward_weights) for GRPOTrainer, scored by the reward-server; one function per component."""
    dataset = dataset_of(data_source)
    scores = _RemoteScores(client_factory or _default_client)
    weights = WEIGHTS[dataset]
    return [RemoteComponentReward(dataset, name, scores) for name in weights], list(weights.values())


class RemoteResults:
    """Score dicts of rows from the reward-server, one request per call (a run scored by its own function: the server
    runs it). Picklable: the HTTP client is made on first use."""

    def __init__(self, client_factory: Callable[[], ServiceClient] | None = None):
        self._client_factory = client_factory or _default_client
        self._client: ServiceClient | None = None

    def __call__(self, data_sources: Sequence[Any], texts: Sequence[str], truths: Sequence[Any],
                 extra_infos: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        extra_infos = list(extra_infos) if extra_infos is not None else [None] * len(texts)
        if self._client is None:
            self._client = self._client_factory()
        items = [reward_item(d, t, g, e) for d, t, g, e in zip(data_sources, texts, truths, extra_infos, strict=True)]
        return score_batch(items, self._client)

    def __getstate__(self) -> dict[str, Any]:
        return {"client_factory": self._client_factory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["client_factory"])


def remote_results(client_factory: Callable[[], ServiceClient] | None = None) -> RemoteResults:
    return RemoteResults(client_factory)
