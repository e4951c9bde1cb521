"""The `search` tool's client side, without verl: what TRL's rollouts, the evaluation (on the CPU or on a vLLM eval
node, neither of which has verl) and the warm start's trajectories call, and what the verl tool
(`search_tool.SearchTool`) builds on.

`search` (a plain function with a Google-style docstring, as TRL's GRPOTrainer takes tools) asks the run's
retrieval-server; `bound_search` the same with results cut as verl cuts them, at another retriever if asked. Both
return the passages formatted as Search-R1 does: `Doc 1(Title: ...) text`. Requests and answers come in our
retrieval-server's shape or a Search-R1 retriever's (`search_r1/search/retrieval_server.py` of
PeterGriffinJin/Search-R1 @ a14dc3a): `{"queries", "topk", "return_scores": true}` answered by
`{"result": [[{"document": {"contents"}, "score"}, ...], ...]}`, the first line of contents the title (quotes kept,
as Search-R1's client renders it) and the rest the text.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from verl_grpo.errors import DataError
from verl_grpo.services.client import ServiceClient, service_url

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
