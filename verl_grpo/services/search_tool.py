"""The Search-R1 style `search` tool for verl's multi-turn rollouts: `SearchTool`, a verl `BaseTool`.

`actor_rollout_ref.rollout.multi_turn.tool_config_path=infra/verl/search_tool.yaml` declares it, with the
retrieval-server URL from `$VERL_GRPO_RETRIEVAL_SERVER_URL`. The client side it shares with TRL's tool function and
the evaluation (which run where verl is not installed) is `verl_grpo.services.search`.

Search-R1 compatibility, after verl's Search-R1 tool (`verl/tools/search_tool.py` and
`verl/tools/utils/search_r1_like_utils.py` of volcengine/verl @ 55e3c5b, gone from the verl 0.9.1 pinned here):
`SearchTool` also takes Search-R1's `query_list` argument (`infra/verl/search_r1_tool.yaml` declares it), sends the
queries in one request and joins the queries' passages with a `---` line as verl's tool did; with
`retriever_api: search_r1` it talks to a Search-R1 retriever.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from verl_grpo.errors import ConfigError, DataError, InfraError
from verl_grpo.local_paths import repo_root
from verl_grpo.services.client import AsyncServiceClient, service_url
from verl_grpo.services.search import (
    MAX_QUERIES,
    MAX_QUERY_CHARS,
    MAX_TOP_K,
    QUERY_SEPARATOR,
    RETRIEVER_APIS,
    answer_hits,
    base_url,
    format_passages,
    request_body,
)


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
    retrieval-server's API, or `search_r1`, a Search-R1 retriever's), `top_k` (none: the retriever's default),
    `timeout_s`, `retries`. The call takes
    `query` (a string) or Search-R1's `query_list` (strings). The token comes from the environment, never from the
    tool config; `send_token: false` sends none (a retriever outside the run's services gets no services token)."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
        super().__init__(config, tool_schema)
        self.url = base_url(config.get("retrieval_service_url") or "") or None
        self.token = None if config.get("send_token", True) else ""
        self.retriever_api = config.get("retriever_api", "verl_grpo")
        top_k = config.get("top_k")
        self.top_k = None if top_k in (None, "") else int(top_k)
        """Passages per query; None asks the retriever's default (ours: services.retrieval.default_top_k)."""
        self.timeout_s = float(config.get("timeout_s", 30.0))
        self.retries = int(config.get("retries", 2))
        if self.retriever_api not in RETRIEVER_APIS:
            raise ConfigError(f"search tool config retriever_api={self.retriever_api!r} must be one of: "
                              f"{', '.join(RETRIEVER_APIS)}")
        if self.top_k is not None and not 1 <= self.top_k <= MAX_TOP_K:
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
