"""Engineers' relevant judgements as ranking queries: each judged query must find its ticket in the knowledge base.

Feedback re-selects the channel weights (`feedback.reselect_weights`) and adapts the S channel
(`feedback_encoder.py`) only when that pays in cross-validation over these queries. Judgements are not independent:
a query often is a stored ticket's own text (the engineer's new ticket, filed since), two duplicates judged both
ways give two queries over the same two tickets, and one query judged relevant to several tickets (a labelled set's
query and its relevant answers) is one text asked several times. Folds therefore split *groups* of judgements that
share a ticket (as the judged one or as their query's own stored copy) or a query, so that no fold is scored on a
text another trained on, and the adaptation of S keeps a group out of its own in-batch negatives.
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
    stored ticket with the query's own text, else -1, and `others[i]` the columns of the other tickets its query was
    judged relevant to, all left out of its ranking (they are no competitors: the "filtered" ranking); `groups[i]` its
    group (judgements that share a ticket or a query share a group)."""

    queries: list[Query]
    kb: list[Ticket]
    ranked: np.ndarray
    truth: np.ndarray
    own: np.ndarray
    others: list[np.ndarray]
    groups: np.ndarray
    #: what these queries and their subsets share once computed: the BM25 over `kb`
    _shared: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.queries)

    def subset(self, mask: np.ndarray) -> "JudgedQueries":
        """The queries `mask` selects, against the same tickets."""
        keep = np.flatnonzero(mask)
        return JudgedQueries([self.queries[i] for i in keep], self.kb, self.ranked, self.truth[keep], self.own[keep],
                             [self.others[i] for i in keep], self.groups[keep], self._shared)

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
        for qi, (same, others) in enumerate(zip(self.own, self.others)):
            out = np.r_[others, same] if same >= 0 else others
            dist[:, :, qi, out] = _LAST
            if lex is not None:
                lex[qi, out] = -_LAST
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
    own_text = {_text(kb[int(r)]): i for i, r in enumerate(ranked)}
    own = np.array([own_text.get(_text(q), -1) for q, _ in relevant], np.int64)
    own[own == truth] = -1  # a query judged relevant to its own text keeps it
    asked = [_text(q) for q, _ in relevant]  # a query is its text: one text stored under two ids is one query
    relevant_to: dict[tuple[str, str], list[int]] = {}
    for q, column in zip(asked, truth):
        relevant_to.setdefault(q, []).append(int(column))
    others = [np.array([c for c in relevant_to[q] if c != column], np.int64) for q, column in zip(asked, truth)]
    return JudgedQueries([q for q, _ in relevant], kb, ranked, truth, own, others, _groups(truth, own, asked))


def _text(record: Query | Ticket) -> tuple[str, str]:
    """What a query or ticket says (subject and description, outer white space aside): the key that finds a query's
    stored copy and joins the judgements of one query text."""
    return record.subject.strip(), (record.description or "").strip()


def _groups(truth: np.ndarray, own: np.ndarray, queries: Sequence) -> np.ndarray:
    """Per judgement, the smallest ticket column of its connected group (judgements joined through shared tickets,
    their judged ones and their queries' own stored copies, and through shared `queries`: one key per query text)."""
    truth = np.asarray(truth, np.int64)
    other = np.where(np.asarray(own) >= 0, own, truth).astype(np.int64)
    n = int(max(truth.max(), other.max())) + 1 if len(truth) else 0
    ids = {q: n + i for i, q in enumerate(dict.fromkeys(queries))}  # one node per query after the tickets' nodes
    asked = np.array([ids[q] for q in queries], np.int64)
    size = n + len(ids)
    graph = coo_matrix((np.ones(2 * len(truth)), (np.r_[truth, truth], np.r_[other, asked])), shape=(size, size))
    _, component = connected_components(graph, directed=False)
    smallest = np.full(component.max(initial=-1) + 1, n, np.int64)
    np.minimum.at(smallest, component[:n], np.arange(n))
    return smallest[component[truth]]
