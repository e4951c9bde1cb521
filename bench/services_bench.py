"""Services benchmark → bench/results/services.md.

1. reward-server batch throughput vs in-process scoring (GSM8K and MBPP), overhead ratio.
2. retrieval over the 2,067 SQuAD dev paragraphs: recall@1/5/10 and search queries/s of FAISS HNSW,
   FAISS flat, exact numpy search and BM25 on a seeded sample of SQuAD questions; end-to-end queries/s through
   the retrieval-server (embedding included); the cost of building each index. The dense index is built once into
   the local store and reused.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from verl_grpo.config import RunConfig, StorageConfig  # noqa: E402
from verl_grpo.local_paths import data_mirror_dir  # noqa: E402
from verl_grpo.rewards import compute_scores  # noqa: E402
from verl_grpo.services.bm25_index import Bm25  # noqa: E402
from verl_grpo.services.client import ServiceClient  # noqa: E402
from verl_grpo.services.local_group import start_local_services, stop_local_services  # noqa: E402
from verl_grpo.services.retrieval_index import (  # noqa: E402
    EMBED_BATCH,
    Embedder,
    index_exists,
    load_index,
    load_squad,
    make_faiss_index,
    passage_texts,
    recall_at_k,
    sample_questions,
)
from verl_grpo.services.retrieval_server import ensure_index  # noqa: E402
from verl_grpo.store import Store  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "services.md"
INDEX = "squad-dev"
BATCH = 64
QUESTIONS = 2000
SERVER_QUERIES = 256
EMBED_TIMING_PASSAGES = 256
"""Paragraphs embedded to time the dense index's build (the whole corpus takes minutes on 2 cores)."""
KS = (1, 5, 10)


def gsm8k_items(n: int) -> list[dict]:
    rows = [json.loads(line) for line in (data_mirror_dir() / "gsm8k" / "test.jsonl").read_text().splitlines()[:n]]
    items = []
    for i, row in enumerate(rows):
        gold = row["answer"].split("####")[-1].strip()
        answer = gold if i % 2 == 0 else f"{gold}1"
        items.append({"data_source": "gsm8k", "ground_truth": gold,
                      "solution_str": f"<think>{row['answer'][:300]}</think><answer>{answer}</answer>"})
    return items


def mbpp_items(n: int) -> list[dict]:
    rows = [json.loads(line) for line in (data_mirror_dir() / "mbpp" / "mbpp.jsonl").read_text().splitlines()[:n]]
    return [{"data_source": "mbpp",
             "ground_truth": json.dumps({"test_list": r["test_list"], "test_setup_code": r.get("test_setup_code", ""),
                                         "challenge_test_list": []}),
             "solution_str": f"<think>ok</think><answer>```python\n{r['code']}\n```</answer>"} for r in rows]


def time_in_process(items: list[dict]) -> float:
    started = time.perf_counter()
    for i in range(0, len(items), BATCH):
        chunk = items[i : i + BATCH]
        compute_scores(chunk[0]["data_source"], [x["solution_str"] for x in chunk], [x["ground_truth"] for x in chunk])
    return time.perf_counter() - started


def time_server(client: ServiceClient, items: list[dict]) -> float:
    started = time.perf_counter()
    for i in range(0, len(items), BATCH):
        client.post("/batch_reward", {"items": items[i : i + BATCH]})
    return time.perf_counter() - started


def reward_section(url: str) -> list[str]:
    lines = ["## reward-server vs in-process scoring", "",
             f"Batches of {BATCH} items, sequential; the server is one uvicorn process on 127.0.0.1.", "",
             "| data | items | in-process items/s | server items/s | overhead ratio (server time / in-process) |",
             "|---|---|---|---|---|"]
    with ServiceClient(url) as client:
        for name, items in (("gsm8k", gsm8k_items(1024)), ("mbpp", mbpp_items(128))):
            time_in_process(items[:BATCH])  # warm-up (MBPP pool start, math-verify imports)
            time_server(client, items[:BATCH])
            local = time_in_process(items)
            remote = time_server(client, items)
            lines.append(f"| {name} | {len(items)} | {len(items) / local:,.0f} | {len(items) / remote:,.0f} | "
                         f"{remote / local:.2f} |")
            print(lines[-1], flush=True)
    return lines


def retrieval_section(store: Store, url: str) -> list[str]:
    embedder = Embedder()
    index = load_index(store, INDEX)
    _, questions = load_squad()
    sample = sample_questions(questions, QUESTIONS)
    started = time.perf_counter()
    vecs = embedder.encode([q.question for q in sample])
    embed_qps = len(sample) / (time.perf_counter() - started)
    flat = make_faiss_index(index.embeddings, "flat")
    rows = []
    for name, search in (("FAISS HNSW (served)", index.search),
                         ("FAISS flat", lambda v, k: flat.search(v, k)),
                         ("numpy exact", index.exact_search)):
        started = time.perf_counter()
        _, ids = search(vecs, max(KS))
        qps = len(sample) / (time.perf_counter() - started)
        recall = recall_at_k(ids, index.passages, sample, KS)
        rows.append(f"| {name} | " + " | ".join(f"{recall[k]:.3f}" for k in KS) + f" | {qps:,.0f} |")
        print(rows[-1], flush=True)
    texts = passage_texts(index.passages)
    started = time.perf_counter()
    bm25 = Bm25(texts)
    bm25_build_s = time.perf_counter() - started
    started = time.perf_counter()
    _, ids = bm25.search([q.question for q in sample], max(KS))
    qps = len(sample) / (time.perf_counter() - started)
    recall = recall_at_k(ids, index.passages, sample, KS)
    rows.append("| BM25 (bm25s; queries tokenized) | " + " | ".join(f"{recall[k]:.3f}" for k in KS) + f" | {qps:,.0f} |")
    print(rows[-1], flush=True)
    timed = texts[:: max(1, len(texts) // EMBED_TIMING_PASSAGES)][:EMBED_TIMING_PASSAGES]
    started = time.perf_counter()
    embedder.encode(timed, batch_size=EMBED_BATCH)
    embed_pps = len(timed) / (time.perf_counter() - started)
    _, hnsw_ids = index.search(vecs, 5)
    _, exact_ids = index.exact_search(vecs, 5)
    overlap = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(hnsw_ids, exact_ids)])
    with ServiceClient(url) as client:
        queries = [q.question for q in sample[:SERVER_QUERIES]]
        client.post("/retrieve", {"queries": queries[:1], "top_k": 5})
        started = time.perf_counter()
        for q in queries:
            client.post("/retrieve", {"queries": [q], "top_k": 5})
        one_qps = len(queries) / (time.perf_counter() - started)
        started = time.perf_counter()
        for i in range(0, len(queries), 32):
            client.post("/retrieve", {"queries": queries[i : i + 32], "top_k": 5})
        batch_qps = len(queries) / (time.perf_counter() - started)
    return [
        "## retrieval: SQuAD dev (2,067 paragraphs), all-MiniLM-L6-v2", "",
        f"{len(sample)} seeded SQuAD dev questions; a hit is the paragraph the question was written about.", "",
        "| search | recall@1 | recall@5 | recall@10 | search-only queries/s |", "|---|---|---|---|---|", *rows, "",
        f"- HNSW top-5 overlap with exact search: {overlap:.3f}",
        f"- building the index: MiniLM embeds {embed_pps:,.1f} paragraphs/s ({len(timed)} spread over the corpus), "
        f"so {len(texts) / embed_pps:,.0f} s for all {len(texts):,}; BM25 over all of them {bm25_build_s:.2f} s "
        f"({len(texts) / embed_pps / bm25_build_s:,.0f}x less)",
        f"- query embedding in-process: {embed_qps:,.0f} queries/s",
        f"- retrieval-server end to end (embed + search + HTTP): {one_qps:,.1f} queries/s one query per request, "
        f"{batch_qps:,.1f} queries/s in batches of 32",
    ]


def main() -> None:
    store = Store(StorageConfig().uri)
    if not index_exists(store, INDEX):
        print(f"building index {INDEX} into {store.uri} (once; ~3 min on 2 CPU cores)", flush=True)
        ensure_index(store, INDEX, None, "hnsw", Embedder())
    cfg = RunConfig.model_validate({"services": {"enabled": ["reward", "retrieval"], "termination_delay_s": 0,
                                                 "retrieval": {"index": INDEX}}})
    workdir = Path(StorageConfig().uri[len("file://"):]).parent / "work" / "services-bench"
    group = start_local_services(cfg, "services-bench", workdir)
    os.environ["VERL_GRPO_SERVICES_TOKEN_FILE"] = group.token_file
    try:
        reward = reward_section(group.endpoints["reward-server"])
        retrieval = retrieval_section(store, group.endpoints["retrieval-server"])
    finally:
        stop_local_services(workdir, delay_s=0)
    header = ["# Services benchmark", "",
              f"`python bench/services_bench.py` on {platform.machine()}, {os.cpu_count()} CPU cores, "
              f"Python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d')}.", ""]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(header + reward + [""] + retrieval) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
