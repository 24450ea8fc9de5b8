"""Engineers' relevant judgements as ranking queries: each judged query must find its ticket in the knowledge base.

Feedback re-selects the channel weights (`feedback.reselect_weights`) and adapts the S channel
(`feedback_encoder.py`) only when that pays in cross-validation over these queries. Judgements are not independent:
a query often is a stored ticket's own text (the engineer's new ticket, filed since), and two duplicates judged
both ways give two queries over the same two tickets. Folds therefore split *groups* of queries that share a ticket
(as the judged one or as their own stored copy), so that no fold is scored on a pair of texts another trained on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from ..data.records import Query, Ticket, query_text
from ..lexical.bm25 import Bm25Scorer
from .bundle import TicketModel
from .weight_selection import RankedSlice, rank_distances, ranked_rows

#: The distance that puts a query's own stored copy last (it is the query itself, not a competitor).
_LAST = 1e6


@dataclass
class JudgedQueries:
    """`queries[i]` must find `kb[ranked[truth[i]]]` among the tickets `kb[ranked]`; `own[i]` is the column of a
    stored ticket with the query's own text (left out of its ranking), else -1; `groups[i]` its group (queries that
    share a ticket share a group)."""

    queries: list[Query]
    kb: list[Ticket]
    ranked: np.ndarray
    truth: np.ndarray
    own: np.ndarray
    groups: np.ndarray
    #: what these queries and their subsets share once computed: the BM25 over `kb`
    _shared: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.queries)

    def subset(self, mask: np.ndarray) -> "JudgedQueries":
        """The queries `mask` selects, against the same tickets."""
        keep = np.flatnonzero(mask)
        return JudgedQueries([self.queries[i] for i in keep], self.kb, self.ranked, self.truth[keep], self.own[keep],
                             self.groups[keep], self._shared)

    def scorer(self) -> Bm25Scorer:
        """The BM25 over the knowledge base, built once for these queries and every subset of them."""
        if "bm25" not in self._shared:
            self._shared["bm25"] = Bm25Scorer(self.kb)
        return self._shared["bm25"]

    def folds(self, k: int, rng: np.random.Generator) -> np.ndarray:
        """A fold in [0, k) per query, whole groups to one fold: the largest groups first (random order among equal
        sizes), each to the fold with the fewest queries so far."""
        labels, sizes = np.unique(self.groups, return_counts=True)
        order = sorted(range(len(labels)), key=lambda i: (-sizes[i], rng.random()))
        filled = np.zeros(k, np.int64)
        fold_of = {}
        for i in order:
            f = int(np.argmin(filled))
            fold_of[labels[i]] = f
            filled[f] += sizes[i]
        return np.array([fold_of[g] for g in self.groups], np.int64)

    def ranked_slice(self, model: TicketModel, progress: bool = False) -> RankedSlice:
        """The queries ranked by `model` (its distances per pair and channel, and BM25 over the knowledge base)."""
        dist = rank_distances(model, model.prepare(self.queries, "query", progress),
                              model.prepare([self.kb[int(r)] for r in self.ranked], "ticket", progress))
        dist = dist.astype(np.float64)
        lex = None
        if model.metric_spec()["bm25"] > 0 or model.siamese_config.grid.get("bm25"):
            scorer = self.scorer()
            lex = np.stack([scorer.lexical(query_text(q), self.ranked) for q in self.queries])
        for qi, same in enumerate(self.own):
            if same >= 0:
                dist[:, :, qi, same] = _LAST
                if lex is not None:
                    lex[qi, same] = -_LAST
        observable = [bool((dist[p].max(axis=2) - dist[p].min(axis=2) > 1e-6).any()) for p in range(len(dist))]
        return RankedSlice(dist, lex, self.truth, observable)


def paired_gain(new: np.ndarray, current: np.ndarray) -> tuple[float, float]:
    """(mean gain, its standard error) of per-query figures `new` over `current` on the same queries."""
    diff = np.asarray(new, np.float64) - np.asarray(current, np.float64)
    return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(len(diff)))


def judged_queries(train_queries: Sequence[Query], judgements: Sequence[tuple[str, str, float]],
                   knowledge_base: Sequence[Ticket], judged_tickets: Sequence[Ticket], relevant_min: float,
                   seed: int = 0) -> JudgedQueries:
    """The relevant judgements (query id, ticket id, score ≥ `relevant_min`) as queries against the knowledge base
    plus the judged tickets (at most `weight_selection.MAX_RANKED_VIEWS` of them ranked: every judged one and a seeded
    sample of the rest)."""
    queries = {q.id: q for q in train_queries}
    kb = list({t.id: t for t in (*knowledge_base, *judged_tickets)}.values())
    row = {t.id: i for i, t in enumerate(kb)}
    relevant = [(queries[q], row[t]) for q, t, score in judgements
                if score >= relevant_min and q in queries and t in row]
    rng = np.random.default_rng(seed + 4)
    ranked = ranked_rows(len(kb), np.unique([r for _, r in relevant]).astype(np.int64), rng)
    truth = np.searchsorted(ranked, [r for _, r in relevant]).astype(np.int64)
    own_text = {(kb[int(r)].subject.strip(), kb[int(r)].description.strip()): i for i, r in enumerate(ranked)}
    own = np.array([own_text.get((q.subject.strip(), q.description.strip()), -1) for q, _ in relevant], np.int64)
    own[own == truth] = -1  # a query judged relevant to its own text keeps it
    groups = _groups(truth, own)
    return JudgedQueries([q for q, _ in relevant], kb, ranked, truth, own, groups)


def _groups(truth: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Per query, the smallest ticket column of its connected group (queries joined through shared tickets)."""
    truth = np.asarray(truth, np.int64)
    other = np.where(np.asarray(own) >= 0, own, truth).astype(np.int64)
    n = int(max(truth.max(), other.max())) + 1 if len(truth) else 0
    graph = coo_matrix((np.ones(len(truth)), (truth, other)), shape=(n, n))
    _, component = connected_components(graph, directed=False)
    smallest = np.full(component.max(initial=-1) + 1, n, np.int64)
    np.minimum.at(smallest, component, np.arange(n))
    return smallest[component[truth]]
