"""Lexical passage retrieval: Okapi BM25 (the `bm25s` package) over the passages of a retrieval index.

SQuAD's questions were written beside their paragraph and share its words, so BM25 ranks the question's paragraph
first more often than MiniLM embeddings do, and its index builds far faster than embedding the corpus on a CPU
(bench/results/services.md has both figures). Only the passages are stored
(`passages.jsonl`, `meta.json` with kind `bm25`): the scores are rebuilt from them on load.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

STOPWORDS = "en"
"""bm25s's English stop-word list, applied to passages and queries alike."""


class Bm25:
    """BM25 scores of a fixed list of texts (row i of the results is texts[i])."""

    name = "bm25s"

    def __init__(self, texts: Sequence[str]):
        import bm25s

        self.size = len(texts)
        self.model = bm25s.BM25()
        self.model.index(self._tokens(texts), show_progress=False)

    @staticmethod
    def _tokens(texts: Sequence[str]):
        import bm25s

        return bm25s.tokenize(list(texts), stopwords=STOPWORDS, show_progress=False)

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, row ids), each (n_queries, min(k, size)), best first; a query sharing no word with any text
        gets score-0 rows."""
        k = min(k, self.size)
        ids, scores = self.model.retrieve(self._tokens(queries), k=k, show_progress=False, n_threads=1)
        return np.asarray(scores, dtype=np.float32), np.asarray(ids, dtype=np.int64)
