"""The retrieval-server and the verl `search` tool against Search-R1's retriever API and verl's Search-R1 tool, over a
three-passage index with a hashed bag-of-words embedder (no model), in process and on a 127.0.0.1 port."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
import zlib

import numpy as np
import pytest
from fastapi.testclient import TestClient
from ports import free_port
from verl.tools.schemas import OpenAIFunctionToolSchema

from verl_grpo.errors import ConfigError, DataError
from verl_grpo.services.retrieval_index import Passage, RetrievalIndex, make_faiss_index
from verl_grpo.services.retrieval_server import Retriever, build_app
from verl_grpo.services.search import TRUNCATED, bound_search, clip_result, search
from verl_grpo.services.search_tool import SearchTool, tool_config_path, validate_tool_config

TOKEN = "tok"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PASSAGES = [Passage("0-0", "Super Bowl 50", "The Denver Broncos won Super Bowl 50."),
            Passage("1-0", "Warsaw", "Warsaw is the capital of Poland."),
            Passage("2-0", "Normans", "The Normans gave their name to Normandy, a region in France.")]
BRONCOS = '"Super Bowl 50"\nThe Denver Broncos won Super Bowl 50.'
WARSAW = '"Warsaw"\nWarsaw is the capital of Poland.'
SCHEMA = OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {"name": "search", "description": "s"}})


class WordEmbedder:
    """A hashed bag of words: a query finds the passages that share its words."""

    name = "words"
    dim = 256

    def encode(self, texts, batch_size=64, progress=None):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in zip(out, texts):
            for word in re.findall(r"\w+", text.lower()):
                row[zlib.crc32(word.encode()) % self.dim] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def passages2string(retrieval_result):
    """Search-R1's client rendering (search_r1/llm_agent/generation.py, PeterGriffinJin/Search-R1 @ a14dc3a)."""
    format_reference = ''
    for idx, doc_item in enumerate(retrieval_result):
        content = doc_item['document']['contents']
        title = content.split("\n")[0]
        text = "\n".join(content.split("\n")[1:])
        format_reference += f"Doc {idx+1}(Title: {title}) {text}\n"
    return format_reference


@pytest.fixture(scope="module")
def app():
    embedder = WordEmbedder()
    embeddings = embedder.encode([f"{p.title}. {p.text}" for p in PASSAGES])
    meta = {"name": "tiny", "kind": "flat", "passages": len(PASSAGES), "model": embedder.name}
    index = RetrievalIndex(make_faiss_index(embeddings, "flat"), PASSAGES, embeddings, meta)
    return build_app(Retriever(index, embedder), TOKEN, 1 << 16, default_top_k=2, max_top_k=3, max_queries=4)


@pytest.fixture(scope="module")
def client(app):
    with TestClient(app) as c:
        yield c


@pytest.fixture(scope="module")
def server_url(app):
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the app did not start on 127.0.0.1"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def token_env(monkeypatch):
    monkeypatch.delenv("VERL_GRPO_SERVICES_TOKEN_ENV", raising=False)
    monkeypatch.delenv("VERL_GRPO_SERVICES_TOKEN_FILE", raising=False)
    monkeypatch.setenv("VERL_GRPO_SERVICES_TOKEN", TOKEN)


def run_tool(config, parameters):
    tool = SearchTool({"type": "native", "retries": 0, **config}, SCHEMA)
    return asyncio.run(tool.execute("i-1", parameters))


def test_search_r1_client_request_gets_search_r1_scored_documents(client, caplog):
    # Exactly what Search-R1's client sends (search_r1/llm_agent/generation.py, _batch_search).
    payload = {"queries": ["Who won Super Bowl 50?", "What is the capital of Poland?"], "topk": 3,
               "return_scores": True}
    with caplog.at_level(logging.INFO, logger="verl_grpo.services.retrieval_server"):
        r = client.post("/retrieve", json=payload, headers=AUTH)
    assert r.status_code == 200, r.text
    body = r.json()
    assert list(body) == ["result"] and [len(hits) for hits in body["result"]] == [3, 3]
    first = body["result"][0][0]
    assert set(first) == {"document", "score"} and first["document"] == {"id": "0-0", "contents": BRONCOS}
    assert body["result"][1][0]["document"]["contents"] == WARSAW
    scores = [hit["score"] for hit in body["result"][0]]
    assert scores == sorted(scores, reverse=True) and 0 < scores[0] <= 1.0001
    assert passages2string(body["result"][1]).startswith('Doc 1(Title: "Warsaw") Warsaw is the capital of Poland.\n')
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("search:")]
    assert line == "search: 2 queries, top_k=3, first 'Who won Super Bowl 50?' -> Super Bowl 50 (Search-R1 API)"


def test_search_r1_request_without_return_scores_gets_bare_documents(client):
    r = client.post("/retrieve", json={"queries": ["Normandy region"], "topk": 1}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json() == {"result": [[{"id": "2-0", "contents": '"Normans"\nThe Normans gave their name to Normandy, '
                                                               "a region in France."}]]}
    scored_default_k = client.post("/retrieve", json={"queries": ["Poland"], "return_scores": True}, headers=AUTH)
    assert [h["document"]["id"] for h in scored_default_k.json()["result"][0]][:1] == ["1-0"]
    assert len(scored_default_k.json()["result"][0]) == 2  # the server's default_top_k


def test_our_own_request_keeps_our_shape(client):
    for payload, k in (({"queries": ["Who won Super Bowl 50?"], "top_k": 1}, 1), ({"queries": ["Warsaw"]}, 2)):
        r = client.post("/retrieve", json=payload, headers=AUTH)
        assert r.status_code == 200, r.text
        (hits,) = r.json()["results"]
        assert list(r.json()) == ["results"] and len(hits) == k
        assert set(hits[0]) == {"id", "title", "text", "score"}
    assert hits[0]["title"] == "Warsaw" and hits[0]["text"] == "Warsaw is the capital of Poland."


def test_both_apis_fields_are_one_clear_422(client):
    r = client.post("/retrieve", json={"queries": ["x"], "top_k": 2, "topk": 2}, headers=AUTH)
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["code"] == "mixed_request" and "top_k and topk" in error["message"]
    r = client.post("/retrieve", json={"queries": ["x"], "top_k": 2, "return_scores": False}, headers=AUTH)
    assert r.status_code == 422 and "top_k and return_scores" in r.json()["error"]["message"]


def test_search_r1_requests_have_our_limits_and_auth(client):
    def error(payload, headers=AUTH):
        r = client.post("/retrieve", json=payload, headers=headers)
        return r.status_code, r.json()["error"]

    assert error({"queries": ["x"], "topk": 4}) == (422, {"code": "top_k_too_large", "details": [],
                                                         "message": "topk 4 exceeds the limit of 3"})
    assert error({"queries": ["x"] * 5, "topk": 1})[1]["code"] == "too_many_queries"
    assert error({"queries": ["x", " "], "topk": 1})[1]["code"] == "invalid_query"
    assert error({"queries": ["x" * 4001], "return_scores": True})[1]["code"] == "invalid_query"
    assert error({"queries": [], "topk": 1})[0] == 422
    assert error({"queries": ["x"], "topk": 0})[1]["code"] == "invalid_request"
    assert error({"queries": ["x"], "topk": 1}, headers={})[0] == 401


def test_openapi_documents_both_shapes(app):
    schema = app.openapi()
    request = schema["components"]["schemas"]["RetrieveRequest"]["properties"]
    assert "Search-R1" in request["topk"]["description"] and "Search-R1" in request["return_scores"]["description"]
    answer = schema["paths"]["/retrieve"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert {ref["$ref"].rsplit("/", 1)[1] for ref in answer["anyOf"]} == {"RetrieveResponse", "SearchR1Response"}
    assert "wiki-18" in schema["components"]["schemas"]["SearchR1Document"]["description"]


def test_tool_query_list_is_one_request_joined_as_verls_tool_did(server_url, token_env, caplog):
    with caplog.at_level(logging.INFO, logger="verl_grpo.services.retrieval_server"):
        response, reward, metrics = run_tool({"retrieval_service_url": server_url, "top_k": 1},
                                             {"query_list": ["Who won Super Bowl 50?", "capital of Poland"]})
    assert response.text == ("Doc 1(Title: Super Bowl 50) The Denver Broncos won Super Bowl 50.\n---\n"
                             "Doc 1(Title: Warsaw) Warsaw is the capital of Poland.")
    assert reward == 0.0 and metrics == {"num_results": 2}
    assert [r.getMessage()[:28] for r in caplog.records if r.getMessage().startswith("search:")] == [
        "search: 2 queries, top_k=1, "]
    single, _, metrics = run_tool({"retrieval_service_url": server_url}, {"query": "Normandy"})
    assert single.text.startswith("Doc 1(Title: Normans) ") and "---" not in single.text
    assert metrics == {"num_results": 2}  # a config without top_k asks the server's default_top_k


@pytest.mark.parametrize("query_list", [[], ["ok", "  "], "Who won?", ["q"] * 11, [3]])
def test_tool_refuses_a_bad_query_list(query_list):
    response, _, metrics = run_tool({"retrieval_service_url": "http://127.0.0.1:9"}, {"query_list": query_list})
    assert metrics == {"error": "bad_query"} and "'query_list' must be a list of 1 to 10" in response.text


def test_tool_talks_search_r1_to_a_search_r1_retriever(server_url, token_env):
    # Our server answers the Search-R1 shape; the URL is given as Search-R1 configs write it.
    config = {"retrieval_service_url": f"{server_url}/retrieve", "retriever_api": "search_r1", "top_k": 2}
    response, _, metrics = run_tool(config, {"query_list": ["Who won Super Bowl 50?", "capital of Poland"]})
    assert metrics == {"num_results": 4}
    first, second = response.text.split("\n---\n")
    assert first.startswith('Doc 1(Title: "Super Bowl 50") The Denver Broncos won Super Bowl 50.\nDoc 2(Title: "')
    # Each query's text is what Search-R1's own client renders from the same answer (less its trailing newline).
    import httpx

    payload = {"queries": ["capital of Poland"], "topk": 2, "return_scores": True}
    body = httpx.post(f"{server_url}/retrieve", json=payload, headers=AUTH, timeout=10).json()
    assert second + "\n" == passages2string(body["result"][0])


OUR_ANSWER = {"results": [[{"id": "0-0", "title": "T", "text": "x", "score": 1.0}]]}
SEARCH_R1_ANSWER = {"result": [[{"document": {"id": "0-0", "contents": '"T"\nx'}, "score": 1.0}]]}


@pytest.mark.parametrize("api,answer,hint", [("search_r1", OUR_ANSWER, "not Search-R1's"),
                                             ("verl_grpo", SEARCH_R1_ANSWER, "retriever_api: search_r1")])
def test_tool_reports_an_answer_in_the_other_apis_shape(api, answer, hint):
    class Answering:
        async def post(self, path, body):
            return answer

    tool = SearchTool({"type": "native", "retrieval_service_url": "http://127.0.0.1:9", "retriever_api": api}, SCHEMA)
    tool._client = Answering
    response, _, metrics = asyncio.run(tool.execute("i-1", {"query": "Warsaw"}))
    assert metrics == {"error": "DataError"} and response.text == "Error: search failed (DataError)."
    with pytest.raises(DataError, match=hint):
        asyncio.run(tool._retrieve(["Warsaw"]))


def test_bad_retriever_api_names_the_key_and_the_values():
    with pytest.raises(ConfigError, match=r"retriever_api='search-r1' must be one of: verl_grpo, search_r1"):
        SearchTool({"type": "native", "retriever_api": "search-r1"}, SCHEMA)


def test_search_r1_tool_config_loads_with_verls_loader(monkeypatch):
    from verl.tools.tool_registry import initialize_tools_from_config

    monkeypatch.setenv("VERL_GRPO_RETRIEVAL_SERVER_URL", "http://retrieval-server-0.grp:8002")
    path = tool_config_path().with_name("search_r1_tool.yaml")
    assert validate_tool_config(path) == ["search"]
    (tool,) = initialize_tools_from_config(str(path))
    assert isinstance(tool, SearchTool) and tool.url == "http://retrieval-server-0.grp:8002"
    assert tool.retriever_api == "verl_grpo" and tool.top_k is None  # our server's services.retrieval.default_top_k
    parameters = tool.tool_schema.function.parameters
    assert parameters.required == ["query_list"] and parameters.properties["query_list"].type == "array"


def test_the_trl_and_eval_search_asks_the_servers_default_and_cuts_results_as_verl_does(server_url, token_env):
    """TRL's rollouts and the eval call `search(query)`: without top_k the server's default_top_k (2 here, the
    run's services.retrieval.default_top_k) answers, and the text is cut at max_result_chars with verl's mark."""
    import inspect

    from transformers.utils import get_json_schema

    whole = bound_search(10_000, server_url, TOKEN)("Who won Super Bowl 50?")
    assert whole.count("Doc ") == 2 and whole.startswith("Doc 1(Title: Super Bowl 50) ")
    assert bound_search(10_000, server_url, TOKEN)("Who won Super Bowl 50?", top_k=1).count("Doc ") == 1
    cut = bound_search(40, server_url, TOKEN)("Who won Super Bowl 50?")
    assert cut == whole[:40] + TRUNCATED == "Doc 1(Title: Super Bowl 50) The Denver B...(truncated)"
    # The model is offered the same tool whichever caller binds it.
    bound = bound_search(40, server_url, TOKEN)
    assert bound.__name__ == "search" and get_json_schema(bound) == get_json_schema(search)
    assert inspect.signature(bound).parameters["top_k"].default is None
    assert clip_result("abc", None) == clip_result("abc", 3) == "abc" and clip_result("abcd", 3) == "abc" + TRUNCATED

