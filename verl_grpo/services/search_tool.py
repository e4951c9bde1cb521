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


def format_passages(hits: list[dict[str, Any]]) -> str:
    """Search-R1's rendering of retrieved passages."""
    return "\n".join(f"Doc {i}(Title: {h['title']}) {h['text']}" for i, h in enumerate(hits, start=1))


def search(query: str, top_k: int = DEFAULT_TOP_K) -> str:
    """Search the passage corpus and return the most relevant passages.

    Args:
        query: What to look up, as a question or keywords.
        top_k: How many passages to return (1 to 10).
    """
    return _search(ServiceClient(service_url("retrieval"), timeout_s=30.0, retries=2), query, top_k)


def search_at(url: str, token: str | None) -> Callable[..., str]:
    """`search` answered by the retrieval-server at `url` with `token` rather than the environment's: the same name,
    docstring and signature, so the model is offered the schema training offered."""

    @functools.wraps(search)
    def bound(query: str, top_k: int = DEFAULT_TOP_K) -> str:
        return _search(ServiceClient(url, token=token, timeout_s=30.0, retries=2), query, top_k)

    return bound


def _search(client: ServiceClient, query: str, top_k: int) -> str:
    top_k = max(1, min(int(top_k), MAX_TOP_K))
    with client:
        result = client.post("/retrieve", {"queries": [query], "top_k": top_k})
    return format_passages(result["results"][0])


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
    tool config."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
        super().__init__(config, tool_schema)
        url = config.get("retrieval_service_url") or ""
        self.url = ",".join(u.strip().rstrip("/").removesuffix("/retrieve") for u in url.split(",")) or None
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
            self._clients[loop_id] = AsyncServiceClient(self.url or service_url("retrieval"),
                                                        timeout_s=self.timeout_s, retries=self.retries)
        return self._clients[loop_id]

    async def _retrieve(self, queries: list[str]) -> list[list[dict[str, Any]]]:
        if self.retriever_api == "search_r1":
            body = {"queries": queries, "topk": self.top_k, "return_scores": True}
            return search_r1_hits(await self._client().post("/retrieve", body))
        result = await self._client().post("/retrieve", {"queries": queries, "top_k": self.top_k})
        if not isinstance(result, dict) or "results" not in result:
            raise DataError("the retriever's answer has no 'results'; for a Search-R1 retriever set the search tool "
                            "config retriever_api: search_r1")
        return result["results"]

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
