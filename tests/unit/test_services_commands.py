"""The retrieval corpus a job-group node reads from the store: published before launch, read by URI by `serve`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from run_configs import build_config

from verl_grpo.errors import DataError
from verl_grpo.services.commands import publish_retrieval_corpus, retrieval_corpus_uri, service_settings_args
from verl_grpo.services.retrieval_index import META_FILE, index_dir
from verl_grpo.services.retrieval_server import ensure_index
from verl_grpo.store import Store

SQUAD = {"data": [{"title": "Super_Bowl_50", "paragraphs": [
    {"context": "Denver won Super Bowl 50.", "qas": [{"question": "Who won Super Bowl 50?"}]},
    {"context": "It was played in Santa Clara.", "qas": [{"question": "Where was it played?"}]},
]}]}


@pytest.fixture
def store(tmp_path):
    return Store((tmp_path / "store").as_uri())


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps(SQUAD))
    return path


class FakeEmbedder:
    name = "fake"
    dim = 8

    def encode(self, texts, batch_size=64, progress=None):
        rng = np.random.default_rng(len(texts))
        vecs = rng.normal(size=(len(texts), self.dim)).astype(np.float32)
        return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def test_publish_uploads_the_corpus_where_the_rendered_command_points(store, corpus):
    cfg = build_config(f"storage.uri={store.uri}", f"services.retrieval.corpus={corpus}")
    uri = publish_retrieval_corpus(cfg, store)
    assert uri == retrieval_corpus_uri(cfg) == store.url("services/retrieval-server/corpus/squad-dev.json")
    assert json.loads(store.read_text("services/retrieval-server/corpus/squad-dev.json")) == SQUAD
    args = service_settings_args("retrieval", cfg, "run-1", corpus=uri)
    assert args[args.index("--corpus") + 1] == uri


def test_publish_skips_the_upload_when_the_index_is_in_the_store(store, corpus, tmp_path):
    store.write_text("{}", index_dir("squad-dev"), META_FILE)
    cfg = build_config(f"storage.uri={store.uri}", f"services.retrieval.corpus={tmp_path / 'absent.json'}")
    assert publish_retrieval_corpus(cfg, store) == retrieval_corpus_uri(cfg)
    assert not store.exists("services/retrieval-server/corpus/squad-dev.json")


def test_publish_names_the_setting_when_the_corpus_is_missing(store, tmp_path):
    cfg = build_config(f"storage.uri={store.uri}", f"services.retrieval.corpus={tmp_path / 'absent.json'}")
    with pytest.raises(DataError, match="services.retrieval.corpus"):
        publish_retrieval_corpus(cfg, store)


def test_a_corpus_uri_in_the_config_is_used_as_is(store):
    cfg = build_config(f"storage.uri={store.uri}", "services.retrieval.corpus=s3://other/corpus.json")
    assert retrieval_corpus_uri(cfg) == publish_retrieval_corpus(cfg, store) == "s3://other/corpus.json"


def test_serve_builds_a_missing_index_from_a_corpus_uri(store, corpus):
    cfg = build_config(f"storage.uri={store.uri}", f"services.retrieval.corpus={corpus}")
    uri = publish_retrieval_corpus(cfg, store)
    index = ensure_index(store, "squad-dev", uri, "flat", FakeEmbedder())
    assert [p.text for p in index.passages] == ["Denver won Super Bowl 50.", "It was played in Santa Clara."]
    assert store.exists(index_dir("squad-dev"), META_FILE)


def test_serve_names_publish_when_the_corpus_uri_is_absent(store):
    with pytest.raises(DataError, match="publish_retrieval_corpus"):
        ensure_index(store, "squad-dev", store.url("nope.json"), "flat", FakeEmbedder())
