"""The serving side of the searcher face: `IndexSearcher` over an index version's BM25 postings, `TopicSearcher`
(candidates by topic, the variational Siamese paper's pre-filter, scored with the same postings), and
`make_searcher`, which picks the backend `TICKETREC_PREFILTER` names (index | topics | fts5 | elasticsearch).

The face and the other backends live in `recommender.lexical.searchers`; this module is here because the default
backend reads a `TicketIndex` (serving → lexical, never the other way).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from ..data.records import Query, Ticket
from ..errors import IndexStateError, TicketrecError
from ..lexical.searchers import ElasticsearchSearcher, Fts5Searcher, Searcher
from .index import TicketIndex


class IndexSearcher(Searcher):
    """The one BM25 over the postings of one index version (`TicketIndex.bm25`): the embedded default. The
    postings are built by `ticketrec index` with the vectors, from the same tickets, so IDF is over exactly the
    tickets the engine scores. It wraps the `TicketIndex` its caller already opened (the engine makes one per
    index version it serves)."""

    name = "index"

    def __init__(self, ticket_index: TicketIndex):
        self.ticket_index = ticket_index

    def params(self) -> dict:
        return self.ticket_index.bm25.params()

    def search(self, text: str, k: int) -> list[tuple[str, float]]:
        rows, scores = self.search_rows(text, k, self.ticket_index)
        ids = self.ticket_index.ticket_ids
        return [(ids[int(r)], float(s)) for r, s in zip(rows, scores)]

    def search_rows(self, text: str, k: int, index) -> tuple[np.ndarray, np.ndarray]:
        """Rows straight from the postings when `index` is this searcher's own index version (no id round trip)."""
        if index is not self.ticket_index:
            return super().search_rows(text, k, index)
        return self.ticket_index.bm25.top_k(text, k)

    def score_index(self, text: str, index) -> np.ndarray:
        """Every row's BM25 straight from the postings (no ranking) when `index` is this searcher's own version."""
        if index is not self.ticket_index:
            return super().score_index(text, index)
        rows, scores = self.ticket_index.bm25.scores(text)
        dense = np.zeros(len(index), dtype=np.float64)
        dense[rows] = scores
        return dense

    def score_tickets(self, text: str, ticket_ids: Sequence[str]) -> dict[str, float]:
        index = self.ticket_index
        ids = list(dict.fromkeys(ticket_ids))
        rows, positions = index.rows_for(ids)
        scores = {tid: 0.0 for tid in ids}
        scores.update((ids[int(p)], float(s)) for p, s in zip(positions, index.bm25.score_rows(text, rows)))
        return scores

    def index(self, tickets: Iterable[Ticket], progress: bool = True) -> int:
        """Nothing to do: every index build writes its own postings. Returns 0."""
        return 0

    def remove(self, ticket_ids: Iterable[str]) -> int:
        """Nothing to do: the next index build writes postings of the store's tickets only. Returns 0."""
        return 0

    def rebuild(self, tickets: Iterable[Ticket] | None = None, progress: bool = True) -> int:
        raise TicketrecError("the index searcher's postings are built with the vectors: run `ticketrec index --full`")

    def count(self) -> int:
        return len(self.ticket_index)


class TopicSearcher(IndexSearcher):
    """Candidates by topic instead of by words: the K tickets nearest to the query in the served model's DocNADE
    topic space (the T vectors `TicketModel.topic_key` names, stored in the index whatever T's weight;
    `model.topic_prefilter.TopicPrefilter`'s order, nearest topic vector first), each with its BM25 from the
    index's postings for the lexical channel. The variational Siamese paper's pre-filter (Deudon 2018), beside
    BM25: it returns K tickets even for a query that shares no word with any of them, but on our data it keeps
    fewer relevant tickets than BM25 at the same K (docs/results/var-siamese.md), so it is not the default.
    Exhaustive scoring (K = 0) is the index searcher's."""

    name = "topics"

    def __init__(self, ticket_index: TicketIndex):
        from ..model.topic_prefilter import TopicPrefilter

        super().__init__(ticket_index)
        model = ticket_index.model
        self.key = model.topic_key()
        if self.key is None or self.key not in ticket_index.vectors.keys():
            raise IndexStateError(f"TICKETREC_PREFILTER=topics needs a model with the topic channel T and an index "
                                  f"that stores its topic vectors (index {ticket_index.version} has none); train a "
                                  "model with T and rebuild the index, or set TICKETREC_PREFILTER=index")
        self.model = model
        self.topics = TopicPrefilter.of_vectors(ticket_index.ticket_ids, "docnade", model.topic_model,
                                                model.topic_vocab, ticket_index.vectors[self.key], cluster=False)

    def params(self) -> dict:
        return {"candidates": f"nearest DocNADE topic vectors ({self.key})", **super().params()}

    def search_rows(self, text: str, k: int, index) -> tuple[np.ndarray, np.ndarray]:
        """The k rows nearest in topic space, best first, with their BM25 scores (0 where no word is shared)."""
        if index is not self.ticket_index:
            raise IndexStateError("the topic searcher serves the index version it was made for; make one per version")
        subject, _, description = text.partition("\n")
        rows, _ = self.topics.search_vector(self.model.query_topic_vector(Query(subject, description)), k)
        return rows, np.asarray(self.ticket_index.bm25.score_rows(text, rows), dtype=np.float64)


def make_searcher(settings, store, index: TicketIndex | None = None) -> Searcher:
    """The searcher the settings name (`TICKETREC_PREFILTER`: index | topics | fts5 | elasticsearch).

    The index and topics backends wrap `index` (the version its caller already opened) or, when None, open the
    current version (IndexStateError when none was built)."""
    backend = (settings.prefilter or "index").lower()
    if backend in ("index", "topics"):
        if index is None:
            from .index import open_current

            index = open_current(settings)
        return IndexSearcher(index) if backend == "index" else TopicSearcher(index)
    if backend == "fts5":
        return Fts5Searcher(store)
    if backend in ("elasticsearch", "es"):
        if not settings.es_url:
            raise TicketrecError("TICKETREC_PREFILTER=elasticsearch needs TICKETREC_ES_URL (e.g. http://localhost:9200); "
                                 "set it, or set TICKETREC_PREFILTER=fts5")
        return ElasticsearchSearcher(settings.es_url, settings.es_index)
    raise TicketrecError(f"TICKETREC_PREFILTER must be index, topics, fts5 or elasticsearch, "
                         f"not {settings.prefilter!r}")
