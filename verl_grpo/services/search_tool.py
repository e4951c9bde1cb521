"""The Search-R1 style `search` tool over the retrieval-server, for verl multi-turn rollouts and for TRL.

verl: `actor_rollout_ref.rollout.multi_turn.tool_config_path=infra/verl/search_tool.yaml`, which declares
`SearchTool` (a verl `BaseTool`) with the retrieval-server URL from `$VERL_GRPO_RETRIEVAL_SERVER_URL`.
TRL: pass `search` (a plain function with a Google-style docstring) in GRPOTrainer's `tools=[...]`.
Both return the passages formatted as Search-R1 does: `Doc 1(Title: ...) text`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from verl_grpo.errors import ConfigError, DataError, InfraError
from verl_grpo.local_paths import repo_root
from verl_grpo.services.client import AsyncServiceClient, ServiceClient, service_url

DEFAULT_TOP_K = 3
MAX_TOP_K = 10


def format_passages(hits: list[dict[str, Any]]) -> str:
    """Search-R1's rendering of retrieved passages."""
    return "\n".join(f"Doc {i}(Title: {h['title']}) {h['text']}" for i, h in enumerate(hits, start=1))


def search(query: str, top_k: int = DEFAULT_TOP_K) -> str:
    """Search the passage corpus and return the most relevant passages.

    Args:
        query: What to look up, as a question or keywords.
        top_k: How many passages to return (1 to 10).
    """
    top_k = max(1, min(int(top_k), MAX_TOP_K))
    with ServiceClient(service_url("retrieval"), timeout_s=30.0, retries=2) as client:
        result = client.post("/retrieve", {"queries": [query], "top_k": top_k})
    return format_passages(result["results"][0])


class SearchTool(BaseTool):
    """verl native tool `search`: config `retrieval_service_url` (default `$VERL_GRPO_RETRIEVAL_SERVER_URL`),
    `top_k`, `timeout_s`, `retries`. The token comes from the environment, never from the tool config."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
        super().__init__(config, tool_schema)
        self.url = (config.get("retrieval_service_url") or "").rstrip("/") or None
        self.top_k = int(config.get("top_k", DEFAULT_TOP_K))
        self.timeout_s = float(config.get("timeout_s", 30.0))
        self.retries = int(config.get("retries", 2))
        if not 1 <= self.top_k <= MAX_TOP_K:
            raise ConfigError(f"search tool config top_k={self.top_k} must be within 1..{MAX_TOP_K}")
        self._clients: dict[int, AsyncServiceClient] = {}

    def _client(self) -> AsyncServiceClient:
        loop_id = id(asyncio.get_running_loop())
        if loop_id not in self._clients:
            self._clients[loop_id] = AsyncServiceClient(self.url or service_url("retrieval"),
                                                        timeout_s=self.timeout_s, retries=self.retries)
        return self._clients[loop_id]

    async def execute(self, instance_id: str, parameters: dict[str, Any],
                      **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        query = parameters.get("query")
        if not isinstance(query, str) or not query.strip():
            return ToolResponse(text="Error: 'query' must be a non-empty string."), 0.0, {"error": "bad_query"}
        try:
            result = await self._client().post("/retrieve", {"queries": [query[:2000]], "top_k": self.top_k})
        except (InfraError, DataError) as e:
            return ToolResponse(text=f"Error: search failed ({type(e).__name__})."), 0.0, {"error": type(e).__name__}
        hits = result["results"][0]
        return ToolResponse(text=format_passages(hits)), 0.0, {"num_results": len(hits)}


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
