"""What a help desk would run instead of a trained model, over a labelled split: BM25, the off-the-shelf MiniLM
zero-shot and their reciprocal-rank fusion, with the two faces the labelled protocols ask of a system
(`score(query, ids)` for the rerank protocol, `retrieve(query, k)` for the knowledge-base protocol).

They are the duplicates protocol's reference systems (`duplicates.baseline_systems`: the same BM25, the same MiniLM
vectors, the same fusion constant), so that `ticketrec evaluate --model DIR --test FILE` compares a model with the
same three systems on labelled data as `--kb … --duplicates …` does on duplicate links."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..data.records import Query, query_text, ticket_text
from .duplicates import BM25_NAME, MINILM_NAME, RRF_K, RRF_NAME, minilm_vectors, reciprocal_rank_fusion, top_rows
from .experiments import BM25System, Split
from .metrics import rank_by_score


class MiniLMSystem:
    """The pretrained MiniLM alone, zero-shot: cosine of the query's SUBJECT + DESCRIPTION to each ticket's
    SUBJECT + DESCRIPTION + SOLUTION over the split's tickets (as `duplicates.minilm_ranker`); raw cosines, no
    calibration."""

    calibrate = None

    def __init__(self, split: Split, progress: bool = False):
        tickets = split.dataset.tickets
        self.ticket_ids = [t.id for t in tickets]
        self.row_of = {tid: i for i, tid in enumerate(self.ticket_ids)}
        self.matrix = minilm_vectors([ticket_text(t) for t in tickets], progress=progress)

    def _cosines(self, query: Query) -> np.ndarray:
        return (self.matrix @ minilm_vectors([query_text(query)])[0]).astype(np.float64)

    def score(self, query: Query, ids: Sequence[str]) -> np.ndarray:
        return self._cosines(query)[[self.row_of[t] for t in ids]]

    def retrieve(self, query: Query, k: int):
        cosines = self._cosines(query)
        return [(self.ticket_ids[int(i)], float(cosines[i]), float(cosines[i])) for i in top_rows(cosines, k)]


class RRFSystem:
    """Reciprocal-rank fusion of `systems`: score(t) = Σ_systems 1 / (k + rank of t) (Cormack et al. 2009), ranks
    taken among the candidates in the rerank protocol and over each system's whole ranking of the knowledge base in
    the knowledge-base protocol; ties keep the first system's order."""

    calibrate = None

    def __init__(self, systems: Sequence, n_tickets: int, k: int = RRF_K):
        self.systems, self.n_tickets, self.k = list(systems), n_tickets, k

    def score(self, query: Query, ids: Sequence[str]) -> np.ndarray:
        ids = list(ids)
        fused = reciprocal_rank_fusion([rank_by_score(list(zip(ids, s.score(query, ids)))) for s in self.systems],
                                       self.k)
        return np.array([fused.get(t, 0.0) for t in ids])

    def retrieve(self, query: Query, k: int):
        fused = reciprocal_rank_fusion([[tid for tid, *_ in s.retrieve(query, self.n_tickets)] for s in self.systems],
                                       self.k)
        return [(tid, fused[tid], fused[tid]) for tid in list(fused)[:k]]


def labelled_baselines(split: Split, progress: bool = False) -> dict:
    """{name: system} of the three reference systems over `split` (BM25 uncalibrated). Raises ModelError when the
    pretrained extra that MiniLM needs is not installed."""
    bm25 = BM25System(split)
    minilm = MiniLMSystem(split, progress=progress)
    return {BM25_NAME: bm25, MINILM_NAME: minilm,
            RRF_NAME: RRFSystem([bm25, minilm], n_tickets=len(split.dataset.tickets))}
