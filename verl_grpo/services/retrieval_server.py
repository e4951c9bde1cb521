"""retrieval-server: `POST /retrieve {queries, top_k}` → the top passages per query from a FAISS (or BM25) index.

`/retrieve` also speaks Search-R1's retriever API (`search_r1/search/retrieval_server.py` of
PeterGriffinJin/Search-R1 @ a14dc3a, which verl's `verl/tools/utils/search_r1_like_utils.py` @ 55e3c5b calls): a
request with `topk` or `return_scores` is answered `{"result": [[hit, ...], ...]}`, each hit a document `{"id",
"contents"}` whose contents are wiki-18's (the title in double quotes, a newline, the text), wrapped as
`{"document": ..., "score": ...}` with return_scores. Our own requests (`top_k` or neither) keep `{"results": ...}`;
a request naming both APIs' fields is refused (422).

`build-index` embeds a SQuAD-format corpus (default: the 2,067 SQuAD dev paragraphs of the data mirror)
with MiniLM under a progress bar (or, `--kind bm25`, indexes its words), writes the index to the store and reports
recall@k on the corpus's questions. `serve` loads the index from the store, building it first when the store has none.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path

import click
from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field
from tqdm import tqdm

from verl_grpo.errors import ConfigError, DataError
from verl_grpo.services import SERVICES
from verl_grpo.services.http import ERROR_RESPONSES, ServiceError, create_app
from verl_grpo.services.retrieval_index import (
    INDEX_KINDS,
    LEXICAL,
    Embedder,
    RetrievalIndex,
    build_index,
    index_exists,
    load_index,
    load_squad,
    recall_at_k,
    sample_questions,
)
from verl_grpo.services.serving import Serving, cli_errors, serve_command, service_cli
from verl_grpo.services.state import open_store
from verl_grpo.store import Store, filesystem_for, strip_scheme

logger = logging.getLogger(__name__)
SPEC = SERVICES["retrieval"]
MAX_QUERY_CHARS = 4000


class RetrieveRequest(BaseModel):
    """This server's request (`top_k`), or Search-R1's (`topk`, `return_scores`), answered in Search-R1's shape."""

    queries: list[str] = Field(min_length=1, examples=[["Which team won Super Bowl 50?"]])
    top_k: int | None = Field(None, ge=1, description="Passages per query; the server's default when omitted.")
    topk: int | None = Field(None, ge=1, description="Search-R1's name for top_k; the answer is then in Search-R1's "
                                                     "shape (`result`). Not together with top_k.")
    return_scores: bool = Field(False, description="Search-R1's: wrap each document as {document, score}; the answer "
                                                   "is then in Search-R1's shape (`result`).")


class Hit(BaseModel):
    id: str
    title: str
    text: str
    score: float


class RetrieveResponse(BaseModel):
    results: list[list[Hit]]
    """One ranked list per query, best first."""


class SearchR1Document(BaseModel):
    """A passage as Search-R1's wiki-18 corpus stores it."""

    id: str
    contents: str = Field(description='The title in double quotes on the first line, then the text: "Title"\\ntext.')


class SearchR1ScoredDocument(BaseModel):
    """A Search-R1 hit with return_scores."""

    document: SearchR1Document
    score: float


class SearchR1Response(BaseModel):
    """Search-R1's answer: one ranked list per query, best first; scored documents with return_scores, else the bare
    documents."""

    result: list[list[SearchR1ScoredDocument]] | list[list[SearchR1Document]]


def search_r1_hit(hit: Hit, with_score: bool) -> SearchR1ScoredDocument | SearchR1Document:
    document = SearchR1Document(id=hit.id, contents=f'"{hit.title}"\n{hit.text}')
    return SearchR1ScoredDocument(document=document, score=hit.score) if with_score else document


class Retriever:
    """A loaded index (and, for a dense one, its embedder) answering batches of queries."""

    def __init__(self, index: RetrievalIndex, embedder: Embedder | None):
        self.index = index
        self.embedder = embedder

    def retrieve(self, queries: list[str], k: int) -> list[list[Hit]]:
        scores, ids = self.index.search_texts(queries, self.embedder, k)
        passages = self.index.passages
        return [[Hit(id=passages[i].id, title=passages[i].title, text=passages[i].text, score=float(s))
                 for s, i in zip(srow, irow) if i >= 0] for srow, irow in zip(scores, ids)]


def build_app(retriever: Retriever, token: str | None, max_body_bytes: int, default_top_k: int = 3,
              max_top_k: int = 50, max_queries: int = 256):
    app, auth = create_app(SPEC.task, token, max_body_bytes,
                           description="Passage retrieval (MiniLM + FAISS, or BM25) for Search-R1 style tool use.",
                           health_info=lambda: {k: retriever.index.meta[k]
                                                for k in ("name", "kind", "passages", "model")})
    router = APIRouter(dependencies=[Depends(auth)], responses=ERROR_RESPONSES)

    @router.post("/retrieve", response_model=RetrieveResponse | SearchR1Response)
    def retrieve(request: RetrieveRequest) -> RetrieveResponse | SearchR1Response:
        """The top_k passages for every query, best first, with cosine scores: `{results}` for this server's request,
        `{result}` (Search-R1's retriever API) for a request with `topk` or `return_scores`."""
        search_r1 = sorted({"topk", "return_scores"} & request.model_fields_set)
        if search_r1 and "top_k" in request.model_fields_set:
            raise ServiceError(422, "mixed_request", f"the request names both top_k and {' and '.join(search_r1)}: "
                                                     "send top_k (answered as {results}) or Search-R1's topk and "
                                                     "return_scores (answered as {result}), not both")
        k_field = "topk" if search_r1 else "top_k"
        k = request.topk or request.top_k or default_top_k
        if k > max_top_k:
            raise ServiceError(422, "top_k_too_large", f"{k_field} {k} exceeds the limit of {max_top_k}")
        if len(request.queries) > max_queries:
            raise ServiceError(422, "too_many_queries", f"{len(request.queries)} queries exceed the limit of "
                                                        f"{max_queries}; split the batch")
        for i, q in enumerate(request.queries):
            if not q.strip() or len(q) > MAX_QUERY_CHARS:
                raise ServiceError(422, "invalid_query", f"queries[{i}] must be 1..{MAX_QUERY_CHARS} non-blank "
                                                         "characters")
        results = retriever.retrieve(request.queries, k)
        # One line per call: the search tool's traffic, readable in the service log (query cut to 80 characters).
        logger.info("search: %d quer%s, top_k=%d, first %r -> %s%s", len(request.queries),
                    "y" if len(request.queries) == 1 else "ies", k, request.queries[0][:80],
                    results[0][0].title if results[0] else "no hit", " (Search-R1 API)" if search_r1 else "")
        if search_r1:
            return SearchR1Response(result=[[search_r1_hit(h, request.return_scores) for h in hits]
                                            for hits in results])
        return RetrieveResponse(results=results)

    app.include_router(router)
    return app


def ensure_index(store: Store, name: str, corpus: str | None, kind: str, embedder: Embedder | None,
                 limit: int | None = None) -> RetrievalIndex:
    """The index `name` from the store, built from `corpus` first when it is not there. `corpus` is a local
    path or a file:// / s3:// URI (a job-group node has no data mirror: it reads the corpus from the store). An
    index of the name that is lexical where `kind` is dense (or the reverse) is refused: it would answer otherwise
    than the settings say."""
    if index_exists(store, name):
        index = load_index(store, name)
        stored = index.meta.get("kind")
        if (stored == LEXICAL) != (kind == LEXICAL):
            raise ConfigError(f"services.retrieval.index {name!r} in {store.uri} is a {stored} index, not {kind}; "
                              f"set services.retrieval.index to another name (e.g. {name}-{kind}) for a {kind} index")
        return index
    if corpus and "://" in corpus:
        with tempfile.TemporaryDirectory(prefix="verl-grpo-corpus-") as tmp:
            local = Path(tmp) / "corpus.json"
            try:
                filesystem_for(corpus, store.endpoint_url).get_file(strip_scheme(corpus), str(local))
            except FileNotFoundError:
                raise DataError(f"corpus {corpus} not found in the store; upload it with "
                                "verl_grpo.services.commands.publish_retrieval_corpus before launch") from None
            passages, _ = load_squad(local, limit)
    else:
        passages, _ = load_squad(corpus, limit)
    if kind == LEXICAL:
        logger.info("index %s not in %s: BM25 over %d passages", name, store.uri, len(passages))
        return build_index(store, name, passages, None, kind, corpus=str(corpus or "squad dev"))
    logger.info("index %s not in %s: embedding %d passages", name, store.uri, len(passages))
    with tqdm(total=len(passages), desc=f"embedding {name}", unit="passage", file=sys.stderr) as bar:
        return build_index(store, name, passages, embedder, kind, corpus=str(corpus or "squad dev"), progress=bar)


cli = service_cli("retrieval-server: MiniLM + FAISS (or BM25) passage retrieval.")


def _index_options(fn):
    fn = click.option("--store-endpoint", default=None, help="S3 endpoint (default: $VERL_GRPO_STORE_ENDPOINT).")(fn)
    fn = click.option("--store-uri", default=None, help="Store root (default: $VERL_GRPO_STORE_URI, else the local "
                                                        "store).")(fn)
    fn = click.option("--kind", type=click.Choice(list(INDEX_KINDS)), default="hnsw", show_default=True,
                      help="hnsw/flat: MiniLM vectors in FAISS; bm25: Okapi BM25 on the words (no embedding).")(fn)
    fn = click.option("--corpus", default=None, help="SQuAD-format JSON, a path or a file:// / s3:// URI (default: "
                                                     "<data mirror>/squad/dev-v1.1.json).")(fn)
    fn = click.option("--index", "index_name", default="squad-dev", show_default=True,
                      envvar="VERL_GRPO_RETRIEVAL_INDEX",
                      help="Index name in the store (retrieval/<name>/).")(fn)
    return fn


@cli.command("build-index")
@_index_options
@click.option("--limit", type=int, default=None, help="Index only the first N paragraphs.")
@click.option("--eval-questions", type=int, default=1000, show_default=True,
              help="Questions (seeded sample) to measure recall@k on; 0 skips.")
@cli_errors
def build_index_cmd(index_name, corpus, kind, store_uri, store_endpoint, limit, eval_questions) -> None:
    """Embed the corpus, write the FAISS index (or the BM25 index) to the store, print recall@1/5/10."""
    store = open_store(store_uri, store_endpoint)
    passages, questions = load_squad(corpus, limit)
    embedder = None if kind == LEXICAL else Embedder()
    started = time.perf_counter()
    with tqdm(total=len(passages), desc=f"indexing {index_name}", unit="passage") as bar:
        index = build_index(store, index_name, passages, embedder, kind, corpus=str(corpus or "squad dev"),
                            progress=bar)
    click.echo(f"index {index_name} ({kind}, {len(passages)} passages) written to {store.url('retrieval', index_name)} "
               f"in {time.perf_counter() - started:.1f}s")
    if eval_questions:
        sample = sample_questions(questions, eval_questions)
        _, ids = index.search_texts([q.question for q in sample], embedder, 10)
        recall = recall_at_k(ids, index.passages, sample, (1, 5, 10))
        click.echo(f"recall on {len(sample)} questions: " + ", ".join(f"@{k}={v:.3f}" for k, v in recall.items()))


@serve_command(cli, SPEC.port, _index_options,
               click.option("--default-top-k", type=int, default=3, show_default=True),
               click.option("--max-top-k", type=int, default=50, show_default=True),
               click.option("--max-queries", type=int, default=256, show_default=True))
def serve(serving: Serving, index_name, corpus, kind, store_uri, store_endpoint, default_top_k, max_top_k,
          max_queries) -> None:
    embedder = None if kind == LEXICAL else Embedder()
    index = ensure_index(open_store(store_uri, store_endpoint), index_name, corpus, kind, embedder)
    serving.run(build_app(Retriever(index, embedder), serving.token, serving.max_body_bytes, default_top_k, max_top_k,
                          max_queries))


if __name__ == "__main__":
    cli()
