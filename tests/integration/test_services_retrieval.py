"""retrieval-server in-process over a small SQuAD slice: index build to the store, load, /retrieve, recall@k,
FAISS vs exact numpy search, and the verl tool config loading through verl's own loader."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from verl_grpo.errors import ConfigError, DataError
from verl_grpo.services.retrieval_index import (
    Embedder,
    build_index,
    load_index,
    load_squad,
    make_faiss_index,
    recall_at_k,
    sample_questions,
)
from verl_grpo.services.retrieval_server import Retriever, build_app, ensure_index
from verl_grpo.services.search_tool import validate_tool_config
from verl_grpo.store import Store

AUTH = {"Authorization": "Bearer tok"}
N_PASSAGES = 40


@pytest.fixture(scope="module")
def corpus(data_mirror):
    return load_squad(data_mirror / "squad" / "dev-v1.1.json", limit=N_PASSAGES)


@pytest.fixture(scope="module")
def embedder():
    return Embedder()


@pytest.fixture(scope="module")
def built(tmp_path_factory, corpus, embedder):
    store = Store(f"file://{tmp_path_factory.mktemp('store')}")
    build_index(store, "squad-slice", corpus[0], embedder, kind="hnsw")
    return store


def test_full_corpus_has_the_2067_dev_paragraphs(data_mirror):
    passages, questions = load_squad(data_mirror / "squad" / "dev-v1.1.json")
    assert len(passages) == 2067 and len(questions) == 10570
    assert len({p.id for p in passages}) == 2067


def test_index_round_trips_through_the_store(built, corpus):
    index = load_index(built, "squad-slice")
    assert index.meta["kind"] == "hnsw" and index.meta["passages"] == N_PASSAGES
    assert [p.id for p in index.passages] == [p.id for p in corpus[0]]
    assert index.embeddings.shape == (N_PASSAGES, 384)
    assert np.allclose(np.linalg.norm(index.embeddings, axis=1), 1.0, atol=1e-4)
    with pytest.raises(DataError, match="build-index --index nope"):
        load_index(built, "nope")


def test_recall_on_the_slice_and_faiss_matches_exact_search(built, corpus, embedder):
    index = load_index(built, "squad-slice")
    questions = corpus[1][:120]
    vecs = embedder.encode([q.question for q in questions])
    _, faiss_ids = index.search(vecs, 5)
    _, exact_ids = index.exact_search(vecs, 5)
    _, flat_ids = make_faiss_index(index.embeddings, "flat").search(vecs, 5)
    assert (flat_ids == exact_ids).mean() > 0.99
    recall = recall_at_k(faiss_ids, index.passages, questions, (1, 5))
    assert recall[5] >= recall[1] > 0.5
    assert recall[5] == pytest.approx(recall_at_k(exact_ids, index.passages, questions, (5,))[5], abs=0.02)


def test_retrieve_endpoint(built, embedder, corpus):
    app = build_app(Retriever(load_index(built, "squad-slice"), embedder), "tok", 1 << 16, default_top_k=3, max_top_k=5)
    with TestClient(app) as c:
        q = corpus[1][0]
        r = c.post("/retrieve", json={"queries": [q.question, "Where was the game played?"]}, headers=AUTH)
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [len(x) for x in results] == [3, 3]
        assert results[0][0]["score"] >= results[0][1]["score"] >= results[0][2]["score"]
        assert q.passage_id in [h["id"] for h in results[0]]
        assert c.post("/retrieve", json={"queries": ["x"], "top_k": 6}, headers=AUTH).json()["error"]["code"] == "top_k_too_large"
        assert c.post("/retrieve", json={"queries": ["  "]}, headers=AUTH).json()["error"]["code"] == "invalid_query"
        assert c.post("/retrieve", json={"queries": []}, headers=AUTH).status_code == 422
        assert c.post("/retrieve", json={"queries": ["x"]}).status_code == 401
        assert c.get("/health").json()["info"]["passages"] == N_PASSAGES


def test_verl_tool_config_loads_with_verls_loader(monkeypatch):
    monkeypatch.setenv("VERL_GRPO_RETRIEVAL_SERVER_URL", "http://retrieval-server-0.grp:8002")
    from verl.tools.tool_registry import initialize_tools_from_config

    from verl_grpo.services.search_tool import SearchTool, tool_config_path

    assert validate_tool_config() == ["search"]
    (tool,) = initialize_tools_from_config(str(tool_config_path()))
    assert isinstance(tool, SearchTool) and tool.url == "http://retrieval-server-0.grp:8002"
    assert tool.tool_schema.function.parameters.required == ["query"]


def test_bm25_index_of_the_whole_corpus_finds_the_questions_paragraph_and_serves_like_the_dense_one(
        data_mirror, tmp_path, corpus, built):
    """kind bm25: nothing embedded (no embedder at all), the passages alone in the store, the scores rebuilt on load;
    over all 2,067 paragraphs the question's own paragraph comes first for most questions (0.76 measured on 2,000)."""
    store = Store(f"file://{tmp_path / 'store'}")
    path = data_mirror / "squad" / "dev-v1.1.json"
    index = ensure_index(store, "squad-bm25", str(path), "bm25", embedder=None)
    assert index.meta["kind"] == "bm25" and index.meta["passages"] == 2067
    assert sorted(p.name for p in (tmp_path / "store" / "retrieval" / "squad-bm25").iterdir()) == [
        "meta.json", "passages.jsonl"]
    loaded = load_index(store, "squad-bm25")
    sample = sample_questions(load_squad(path)[1], 400, seed=1)
    _, ids = loaded.search_texts([q.question for q in sample], None, 5)
    recall = recall_at_k(ids, loaded.passages, sample, (1, 5))
    assert recall[5] >= recall[1] > 0.65, recall
    app = build_app(Retriever(loaded, None), "tok", 1 << 16, default_top_k=1, max_top_k=5)
    with TestClient(app) as c:
        hits = c.post("/retrieve", json={"queries": [sample[0].question]}, headers=AUTH).json()["results"]
        assert len(hits[0]) == 1 and hits[0][0]["score"] > 0
        assert c.get("/health").json()["info"]["kind"] == "bm25"
    # One name holds one kind: a dense index is not served as BM25 (nor the reverse) under the same name.
    with pytest.raises(ConfigError, match="services.retrieval.index 'squad-slice' .* is a hnsw index, not bm25"):
        ensure_index(built, "squad-slice", None, "bm25", embedder=None)
    with pytest.raises(ConfigError, match="is a bm25 index, not flat"):
        ensure_index(store, "squad-bm25", None, "flat", embedder=None)

