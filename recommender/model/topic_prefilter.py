"""The topic pre-filter of the variational Siamese network (Deudon 2018, `paper-notes.md` §3): LDA or DocNADE topics
narrow the candidates a model scores, as a pre-filter beside BM25.

A topic model is fitted on the knowledge base's tickets (their text only: no label, no link) and every ticket gets
a topic vector once. A query's candidates, best first:

1. the tickets whose dominant topic is the query's dominant topic (the paper's topic cluster),
2. then every other ticket,

each group ordered by topic affinity, the cosine of the two tickets' topic vectors: for LDA of √θ (the Bhattacharyya
coefficient Σ √(θ_q θ_t) ∈ [0, 1]); for DocNADE of its hidden units standardised over the knowledge base (the raw
sigmoid units share a large common part, so their dominant unit would be the same for most texts). The score is
affinity + 2 · [same dominant topic], so scores are in the order of the rows. `cluster=False` ranks by affinity
alone (nearest topic vectors).

Face: `search(text, k) -> (rows, scores)`, rows into the tickets given (best first), like `Bm25Scorer.top_k`; `top_k`
is the same method, so either can be a model's pre-filter (`var_siamese.ranker`). Unlike BM25 it returns k rows for
any text, even one sharing no word with the knowledge base.
`benchmarks/topic_prefilter.py` measures its recall against BM25 at the same K (docs/results/var-siamese.md).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..data.records import Ticket
from ..errors import InputError, ModelError
from ..lexical.analyzer import tokenize
from .vocab import RESERVED

METHODS = ("lda", "docnade")
#: Score bonus of the query's topic cluster: above any affinity (a cosine, at most 1), so the cluster comes first.
CLUSTER_BONUS = 2.0


class TopicPrefilter:
    """Topic vectors of a knowledge base's tickets and the search over them (build with `fit`)."""

    def __init__(self, ids: Sequence[str], method: str, topic_model, topic_vocab, vectors: np.ndarray,
                 centre: np.ndarray | None = None, scale: np.ndarray | None = None, cluster: bool = True,
                 fields: Sequence[str] = ("subject", "description", "solution")):
        self.ids, self.method, self.topic_model, self.topic_vocab = list(ids), method, topic_model, topic_vocab
        self.centre, self.scale, self.cluster, self.fields = centre, scale, cluster, tuple(fields)
        self.matrix = self._normalise(vectors)
        self.dominant = np.argmax(self._raw_for_dominant(vectors), axis=1)

    @classmethod
    def fit(cls, tickets: Sequence[Ticket], method: str = "lda", n_topics: int = 50, vocab_size: int = 2000,
            seed: int = 0, epochs: int = 10, cluster: bool = True,
            fields: Sequence[str] = ("subject", "description", "solution"), progress: bool = False) -> "TopicPrefilter":
        """Fit LDA (`epochs` passes) or DocNADE (`epochs` epochs) with `n_topics` topics over the `vocab_size` most
        frequent content words of the tickets' `fields`; deterministic for a seed."""
        from .bundle import build_topic_vocab, topic_documents

        if method not in METHODS:
            raise InputError(f"unknown topic pre-filter {method!r}; use one of {', '.join(METHODS)}")
        tickets = list(tickets)
        if len(tickets) < 2:
            raise InputError("a topic pre-filter needs at least 2 tickets; import the knowledge base first")
        tokens = [tokenize("\n".join(getattr(t, f, "") or "" for f in fields)) for t in tickets]
        vocab = build_topic_vocab(tokens, vocab_size)
        n_words = len(vocab) - len(RESERVED)
        if n_words < 2:
            raise InputError("the tickets have fewer than 2 content words seen twice: too little text for topics")
        docs = topic_documents(tokens, vocab)
        if method == "lda":
            from topic_models.lda import fit_lda

            model = fit_lda(docs, n_words, n_topics=n_topics, passes=epochs, seed=seed)
        else:
            from topic_models.docnade import fit as fit_docnade

            model = fit_docnade(docs, n_words, n_topics=n_topics, epochs=epochs, seed=seed, progress=progress)
        raw = np.asarray(model.transform(docs), dtype=np.float64)
        return cls.of_vectors([t.id for t in tickets], method, model, vocab, raw, cluster, fields)

    @classmethod
    def of_vectors(cls, ids: Sequence[str], method: str, topic_model, topic_vocab, raw: np.ndarray,
                   cluster: bool = True, fields: Sequence[str] = ("subject", "description", "solution")
                   ) -> "TopicPrefilter":
        """A pre-filter over topic vectors already computed (`raw` [tickets, topics], e.g. an index's T channel);
        DocNADE's hidden units are standardised over these tickets (see the module's docstring)."""
        raw = np.asarray(raw, dtype=np.float64)
        centre = scale = None
        if method == "docnade":
            centre, scale = raw.mean(axis=0), raw.std(axis=0) + 1e-6
        return cls(ids, method, topic_model, topic_vocab, raw, centre, scale, cluster, fields)

    def __len__(self) -> int:
        return len(self.ids)

    # -- vectors ---------------------------------------------------------------------------------------------------
    def _raw_for_dominant(self, raw: np.ndarray) -> np.ndarray:
        return raw if self.centre is None else (raw - self.centre) / self.scale

    def _normalise(self, raw: np.ndarray) -> np.ndarray:
        """Rows whose dot products are the topic affinity (unit length)."""
        x = np.sqrt(np.clip(raw, 0.0, None)) if self.centre is None else (raw - self.centre) / self.scale
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    def topic_vectors(self, texts: Sequence[str]) -> np.ndarray:
        """The topic model's vectors of texts (LDA θ, or DocNADE's hidden units), float64 [n, topics]."""
        from .bundle import topic_documents

        docs = topic_documents([tokenize(t) for t in texts], self.topic_vocab)
        try:
            return np.asarray(self.topic_model.transform(docs), dtype=np.float64)
        except Exception as exc:  # the topic models raise their own error type
            raise ModelError(f"the {self.method} topic model cannot read these texts ({exc}); refit the pre-filter") from exc

    def dominant_topic(self, text: str) -> int:
        """The topic a text is mostly about (its cluster)."""
        return int(np.argmax(self._raw_for_dominant(self.topic_vectors([text]))[0]))

    # -- the face --------------------------------------------------------------------------------------------------
    def search(self, text: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best rows for `text` and their scores (affinity, + CLUSTER_BONUS in the query's topic cluster),
        best first, ties by row."""
        if k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        return self.search_vector(self.topic_vectors([text])[0], k)

    def search_vector(self, raw: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """`search` for a text whose topic vector (as `topic_vectors` gives it) is already computed: `raw` [topics]."""
        if k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        raw = np.asarray(raw, dtype=np.float64)[None, :]
        scores = self.matrix @ self._normalise(raw)[0]
        if self.cluster:
            scores = scores + CLUSTER_BONUS * (self.dominant == int(np.argmax(self._raw_for_dominant(raw)[0])))
        order = np.lexsort((np.arange(len(scores)), -scores))[:k]
        return order.astype(np.int64), scores[order]

    top_k = search

    def search_ids(self, text: str, k: int) -> list[tuple[str, float]]:
        """`search` as (ticket id, score) pairs, the face of `lexical.searchers.Searcher.search`."""
        rows, scores = self.search(text, k)
        return [(self.ids[int(r)], float(s)) for r, s in zip(rows, scores)]
