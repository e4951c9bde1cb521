"""A retrieval-server off this machine reads its corpus from the store: the verl plan publishes it there first.

A job group's retrieval-server (and a vLLM eval node's own one) builds its index from `retrieval_corpus_uri(cfg)` in
the store, never from services.retrieval.corpus on the machine that launched; before this was published at plan the
first launch of a job group with retrieval failed on the node ("corpus ... not found in the store").
"""

from __future__ import annotations

import json

from verl_grpo.config import load_config
from verl_grpo.contracts import Cluster
from verl_grpo.services.commands import retrieval_corpus_path, retrieval_corpus_uri
from verl_grpo.store import Store
from verl_grpo.trainers.verl.backend import corpus_on_cluster


def _setup(tmp_path, *extra: str):
    corpus = tmp_path / "corpus.json"
    corpus.write_text(json.dumps({"version": "1.1", "data": [{"title": "T", "paragraphs": [
        {"context": "A paragraph.", "qas": []}]}]}))
    store = Store(f"file://{tmp_path / 'store'}")
    cfg = load_config(["gsm8k"], ["services.enabled=[retrieval]", f"services.retrieval.corpus={corpus}",
                                  f"storage.uri={store.uri}", *extra], env={})
    return cfg, store, corpus


def test_a_remote_cluster_gets_the_corpus_where_its_retrieval_server_reads_it(tmp_path):
    cfg, store, corpus = _setup(tmp_path)
    corpus_on_cluster(cfg, store, Cluster(provider="skypilot", name="c", workdir="/tmp/verl-grpo"))
    rel = retrieval_corpus_path(cfg.services.retrieval.index)
    assert store.url(rel) == retrieval_corpus_uri(cfg)
    assert store.read_text(rel) == corpus.read_text()


def test_nothing_is_published_for_this_machine_or_a_retriever_already_serving(tmp_path):
    cfg, store, _ = _setup(tmp_path)
    corpus_on_cluster(cfg, store, Cluster(provider="local", name="c", workdir=str(tmp_path), on_this_machine=True))
    outside, _, _ = _setup(tmp_path, "services.retrieval.url=http://10.0.0.5:8000/retrieve")
    corpus_on_cluster(outside, store, Cluster(provider="skypilot", name="c", workdir="/tmp/verl-grpo"))
    assert not store.exists(retrieval_corpus_path(cfg.services.retrieval.index))

