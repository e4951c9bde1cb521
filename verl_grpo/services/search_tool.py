"""The Search-R1 style `search` tool over the retrieval-server, for verl multi-turn rollouts and for TRL.

verl: `actor_rollout_ref.rollout.multi_turn.tool_config_path=infra/verl/search_tool.yaml`, which declares
`SearchTool` (a verl `BaseTool`) with the retrieval-server URL from `$VERL_GRPO_RETRIEVAL_SERVER_URL`.
TRL: pass `search` (a plain function with a Google-style docstring) in GRPOTrainer's `tools=[...]`.
Both return the passages formatted as Search-R1 does: `Doc 1(Title: ...) text`.

Search-R1 compatibility, after verl's Search-R1 tool (`verl/tools/search_tool.py` and
`verl/tools/utils/search_r1_like_utils.py` of volcengine/verl @ 55e3c5b, gone from the verl 0.9.1 pinned here) and
Search-R1's retriever (`search_r1/search/retrieval_server.py` of PeterGriffinJin/Search-R1 @ a14dc3a): `SearchTool`
also takes Search-R1's `query_list` argument (`infra/verl/search_r1_tool.yaml` declares it), sends the queries in one
request and joins the queries' passages with a `---` line as verl's tool did. With `retriever_api: search_r1` it
talks to a Search-R1 retriever: it sends `{"queries", "topk", "return_scores": true}` and reads
`{"result": [[{"document": {"contents"}, "score"}, ...], ...]}`, the first line of contents as the title (quotes
kept, as Search-R1's client renders it) and the rest as the text.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from verl_grpo.errors import ConfigError, DataError, InfraError
from verl_grpo.local_paths import repo_root
from verl_grpo.services.client import AsyncServiceClient, ServiceClient, service_url

DEFAULT_TOP_K = 3
MAX_TOP_K = 10
MAX_QUERIES = 10
"""Queries one `query_list` call may hold."""
MAX_QUERY_CHARS = 2000
RETRIEVER_APIS = ("verl_grpo", "search_r1")
QUERY_SEPARATOR = "\n---\n"
"""Between the passages of the queries of one call, as verl's Search-R1 tool joined them."""
TRUNCATED = "...(truncated)"
"""The mark at the end of a cut result, verl's own."""


def format_passages(hits: list[dict[str, Any]]) -> str:
    """Search-R1's rendering of retrieved passages."""
    return "\n".join(f"Doc {i}(Title: {h['title']}) {h['text']}" for i, h in enumerate(hits, start=1))


def clip_result(text: str, max_chars: int | None) -> str:
    """A tool result cut to `max_chars` characters at its end, as verl's tool loop cuts one
    (multi_turn.max_tool_response_length with tool_response_truncate_side=right); None keeps it whole."""
    return text if max_chars is None or len(text) <= max_chars else text[:max_chars] + TRUNCATED


def search(query: str, top_k: int | None = None) -> str:
    """Search the passage corpus and return the most relevant passages.

    Args:
        query: What to look up, as a question or keywords.
        top_k: How many passages to return (1 to 10; the server's default when omitted).
    """
    return _search(_client(None, None), query, top_k, None)


def bound_search(max_chars: int, url: str | None = None, token: str | None = None,
                 api: str = "verl_grpo", default_top_k: int | None = None) -> Callable[..., str]:
    """`search` with its results cut at `max_chars` (services.retrieval.max_result_chars), answered by the
    retriever at `url` in `api`'s shape with `token` (default: the run's retrieval-server and the environment's
    token, as `search`; "" sends none), asking `default_top_k` passages when the call names none (None: the
    retriever's own default). The same name, docstring and signature, so every caller offers the model the schema
    training offered."""

    @functools.wraps(search)
    def bound(query: str, top_k: int | None = None) -> str:
        return _search(_client(url, token), query, default_top_k if top_k is None else top_k, max_chars, api)

    return bound


def _client(url: str | None, token: str | None) -> ServiceClient:
    """A client of the retriever at `url` with `token`, or of the run's retrieval-server with the environment's."""
    if url:
        return ServiceClient(base_url(url), token=token, timeout_s=30.0, retries=2)
    return ServiceClient(service_url("retrieval"), timeout_s=30.0, retries=2)


def _search(client: ServiceClient, query: str, top_k: int | None, max_chars: int | None,
            api: str = "verl_grpo") -> str:
    top_k = None if top_k is None else max(1, min(int(top_k), MAX_TOP_K))
    with client:
        hits = answer_hits(api, client.post("/retrieve", request_body(api, [query], top_k)))
    return clip_result(format_passages(hits[0]), max_chars)


def base_url(url: str) -> str:
    """A retriever URL (several comma-separated) as the clients take it: a trailing `/retrieve`, as Search-R1
    configs write it, dropped."""
    return ",".join(u.strip().rstrip("/").removesuffix("/retrieve") for u in url.split(","))


def request_body(api: str, queries: list[str], top_k: int | None) -> dict[str, Any]:
    """POST /retrieve's body in `api`'s shape: Search-R1's `{queries, topk, return_scores}` or our own
    `{queries, top_k}`; without top_k the retriever's default count."""
    key = "topk" if api == "search_r1" else "top_k"
    body = {"queries": queries, **({key: top_k} if top_k is not None else {})}
    return body | {"return_scores": True} if api == "search_r1" else body


def answer_hits(api: str, result: Any) -> list[list[dict[str, Any]]]:
    """Each query's title/text hits in a retriever's answer of `api`'s shape."""
    if api == "search_r1":
        return search_r1_hits(result)
    if not isinstance(result, dict) or "results" not in result:
        raise DataError("the retriever's answer has no 'results'; for a Search-R1 retriever set the search tool "
                        "config retriever_api: search_r1")
    return result["results"]


def search_r1_hits(result: Any) -> list[list[dict[str, Any]]]:
    """A Search-R1 retriever's `{"result": [[{"document": {"contents"}, "score"}, ...], ...]}` as title/text hits:
    the title is the first line of contents, as Search-R1's client splits it."""
    try:
        contents = [[hit["document"]["contents"] for hit in hits] for hits in result["result"]]
    except (KeyError, TypeError) as e:
        raise DataError(f"the retriever's answer is not Search-R1's {{result: [[{{document, score}}]]}}: "
                        f"{type(e).__name__} {e}") from None
    return [[{"title": title, "text": text} for title, _, text in (c.partition("\n") for c in per_query)]
            for per_query in contents]


def _queries(parameters: dict[str, Any]) -> list[str] | str:
    """The call's queries, or the error message for the model."""
    if "query_list" in parameters:
        queries = parameters["query_list"]
        if (not isinstance(queries, list) or not 1 <= len(queries) <= MAX_QUERIES
                or not all(isinstance(q, str) and q.strip() for q in queries)):
            return f"Error: 'query_list' must be a list of 1 to {MAX_QUERIES} non-empty strings."
        return [q[:MAX_QUERY_CHARS] for q in queries]
    query = parameters.get("query")
    if not isinstance(query, str) or not query.strip():
        return "Error: 'query' must be a non-empty string."
    return [query[:MAX_QUERY_CHARS]]


class SearchTool(BaseTool):
    """verl native tool `search`: config `retrieval_service_url` (default `$VERL_GRPO_RETRIEVAL_SERVER_URL`; a
    trailing `/retrieve`, as Search-R1 configs write it, is accepted), `retriever_api` (`verl_grpo`, our
    retrieval-server's API, or `search_r1`, a Search-R1 retriever's), `top_k`, `timeout_s`, `retries`. The call takes
    `query` (a string) or Search-R1's `query_list` (strings). The token comes from the environment, never from the
    tool config; `send_token: false` sends none (a retriever outside the run's services gets no services token)."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
        super().__init__(config, tool_schema)
        self.url = base_url(config.get("retrieval_service_url") or "") or None
        self.token = None if config.get("send_token", True) else ""
        self.retriever_api = config.get("retriever_api", "verl_grpo")
        self.top_k = int(config.get("top_k", DEFAULT_TOP_K))
        self.timeout_s = float(config.get("timeout_s", 30.0))
        self.retries = int(config.get("retries", 2))
        if self.retriever_api not in RETRIEVER_APIS:
            raise ConfigError(f"search tool config retriever_api={self.retriever_api!r} must be one of: "
                              f"{', '.join(RETRIEVER_APIS)}")
        if not 1 <= self.top_k <= MAX_TOP_K:
            raise ConfigError(f"search tool config top_k={self.top_k} must be within 1..{MAX_TOP_K}")
        self._clients: dict[int, AsyncServiceClient] = {}

    def _client(self) -> AsyncServiceClient:
        loop_id = id(asyncio.get_running_loop())
        if loop_id not in self._clients:
            self._clients[loop_id] = AsyncServiceClient(self.url or service_url("retrieval"), token=self.token,
                                                        timeout_s=self.timeout_s, retries=self.retries)
        return self._clients[loop_id]

    async def _retrieve(self, queries: list[str]) -> list[list[dict[str, Any]]]:
        body = request_body(self.retriever_api, queries, self.top_k)
        return answer_hits(self.retriever_api, await self._client().post("/retrieve", body))

    async def execute(self, instance_id: str, parameters: dict[str, Any],
                      **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        queries = _queries(parameters)
        if isinstance(queries, str):
            return ToolResponse(text=queries), 0.0, {"error": "bad_query"}
        try:
            results = await self._retrieve(queries)
        except (InfraError, DataError) as e:
            return ToolResponse(text=f"Error: search failed ({type(e).__name__})."), 0.0, {"error": type(e).__name__}
        text = QUERY_SEPARATOR.join(format_passages(hits) for hits in results)
        return ToolResponse(text=text), 0.0, {"num_results": sum(len(hits) for hits in results)}


def tool_config_path() -> Path:
    """The shipped verl tool config (`infra/verl/search_tool.yaml`)."""
    root = repo_root() or Path.cwd()
    return root / "infra" / "verl" / "search_tool.yaml"


def validate_tool_config(path: str | Path | None = None) -> list[str]:
    """Load the tool config with verl's own loader (no network); the tool names, or ConfigError."""
    from verl.tools.tool_registry import initialize_tools_from_config

    path = Path(path) if path else tool_config_path()
    if not path.is_file():
        raise ConfigError(f"verl tool config {path} not found")
    try:
        tools = initialize_tools_from_config(str(path))
    except Exception as e:  # verl's loader raises whatever OmegaConf/pydantic/importlib raise
        raise ConfigError(f"verl tool config {path} does not load with verl's loader: {type(e).__name__}: {e}") from e
    return [t.name for t in tools]
