"""The settings arguments of each service's `serve` command, shared by the local group and the SkyPilot job group,
and the retrieval corpus a remote retrieval-server builds its index from.

A node of a job group has no data mirror: the retrieval-server there reads its corpus from the store
(`services/retrieval-server/corpus/{index}.json`, see `retrieval_corpus_path`). `publish_retrieval_corpus`
uploads it before launch; the rendered command passes its URI as `--corpus`.
"""

from __future__ import annotations

from pathlib import Path

from verl_grpo.config import RunConfig
from verl_grpo.errors import DataError
from verl_grpo.services import SERVICES
from verl_grpo.store import Store
from verl_grpo.store_layout import services_dir


def service_settings_args(name: str, cfg: RunConfig, run_id: str, dataset_uri: str | None = None,
                          corpus: str | None = None, reward_path: str | None = None) -> list[str]:
    """Everything after `serve --host H --port P` for service `name` with the run's settings (no secrets).

    `corpus` overrides services.retrieval.corpus (the SkyPilot job group passes the corpus's store URI);
    `reward_path` overrides reward.path (where the run's reward file lies on a job group's node)."""
    s = cfg.services
    args = ["--token-env", s.token_env, "--max-body-bytes", str(s.max_body_bytes)]
    store = ["--store-uri", cfg.storage.uri] + (["--store-endpoint", cfg.storage.endpoint_url]
                                                 if cfg.storage.endpoint_url else [])
    if name == "data":
        args += store + ["--run-id", run_id, "--seed", str(s.data.seed), "--max-batch", str(s.data.max_batch)]
        args += ["--dataset-uri", dataset_uri] if dataset_uri else ["--dataset", cfg.dataset.name]
    elif name == "reward":
        args += ["--max-items", str(s.reward.max_items), "--model-batch-size", str(s.reward.model_batch_size)]
        args += ["--reward-model", s.reward.reward_model] if s.reward.reward_model else []
        if cfg.reward.path:
            args += ["--reward-path", reward_path or cfg.reward.path, "--reward-name", cfg.reward.name,
                     "--reward-timeout-s", f"{cfg.reward.timeout_s:g}"]
    elif name == "retrieval":
        r = s.retrieval
        args += store + ["--index", r.index, "--kind", r.index_kind, "--default-top-k", str(r.default_top_k),
                         "--max-top-k", str(r.max_top_k), "--max-queries", str(r.max_queries)]
        corpus = corpus or r.corpus
        args += ["--corpus", corpus] if corpus else []
    elif name == "replay":
        p = s.replay
        args += store + ["--run-id", run_id, "--capacity", str(p.capacity), "--alpha", str(p.alpha),
                         "--compact-every", str(p.compact_every)]
    return args


def retrieval_corpus_path(index: str) -> str:
    """Store path of the corpus the retrieval-server builds index `index` from on a node without a data mirror."""
    return f"{services_dir(SERVICES['retrieval'].task)}/corpus/{index}.json"


def retrieval_corpus_uri(cfg: RunConfig) -> str:
    """The corpus URI a remote retrieval-server reads (pure: no I/O): services.retrieval.corpus when it already
    is a URI, else where `publish_retrieval_corpus` uploads it."""
    r = cfg.services.retrieval
    if r.corpus and "://" in r.corpus:
        return r.corpus
    return Store(cfg.storage.uri, cfg.storage.endpoint_url).url(retrieval_corpus_path(r.index))


def publish_retrieval_corpus(cfg: RunConfig, store: Store) -> str:
    """Upload services.retrieval.corpus (default: the data mirror's SQuAD dev set) to the store for a remote
    retrieval-server and return its URI. Skips the upload when the store already holds the index
    (`retrieval/{index}/`: the server then never reads the corpus); otherwise (over)writes the corpus there.
    DataError when the corpus file is missing locally."""
    from verl_grpo.services.retrieval_index import default_corpus, index_exists

    r = cfg.services.retrieval
    rel = retrieval_corpus_path(r.index)
    if (r.corpus and "://" in r.corpus) or index_exists(store, r.index):
        return retrieval_corpus_uri(cfg)
    source = Path(r.corpus) if r.corpus else default_corpus()
    if not source.is_file():
        raise DataError(f"retrieval corpus {source} not found; set services.retrieval.corpus to a SQuAD-format "
                        f"JSON file (or VERL_GRPO_DATA_MIRROR to a mirror holding squad/dev-v1.1.json)")
    return store.put_file(source, rel)
