"""The recommender: encode the query once → BM25 pre-filter → score precomputed ticket vectors → top k.

Scoring runs in-process, or — when TICKETREC_BROKER_URL is set — on Celery workers, one index shard each,
within `settings.query_deadline`; a dead or slow broker makes the engine answer in-process and log why.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Sequence

import numpy as np

from ..config import Settings
from ..errors import IndexStateError, InputError, ServiceUnavailable
from ..data.records import Query, Recommendation, Ticket
from ..lexical.analyzer import content_words, tokenize

log = logging.getLogger(__name__)

#: After a distributed failure, score in-process for this many seconds before trying the workers again.
BROKER_RETRY_AFTER = 30.0


def query_words(query: Query) -> list[str]:
    """The query's content words, in order (tokenised once per query)."""
    return content_words(tokenize(f"{query.subject}\n{query.description}"))


def shared_terms(query: Query | list[str], ticket: Ticket) -> list[str]:
    """Content words that occur in both the query (or its `query_words`) and the ticket, in the query's order."""
    words = query_words(query) if isinstance(query, Query) else query
    ticket_words = set(content_words(tokenize(f"{ticket.subject}\n{ticket.description}\n{ticket.solution}")))
    seen: set[str] = set()
    out = []
    for word in words:
        if word in ticket_words and word not in seen:
            seen.add(word)
            out.append(word)
    return out


def validate_query(query: Query, settings: Settings) -> None:
    """InputError for a query the engine cannot answer (empty, or a description that is too long)."""
    subject = (query.subject or "").strip()
    description = (query.description or "").strip()
    if not subject and not description:
        raise InputError("the query is empty; give a subject and/or a description")
    if len(query.description or "") > settings.max_description:
        raise InputError(f"the description has {len(query.description)} characters, more than the "
                         f"{settings.max_description} accepted; shorten it (or raise TICKETREC_MAX_DESCRIPTION)")
    if not tokenize(f"{subject}\n{description}"):
        raise InputError("the query has no words (only punctuation or markup); describe the problem in words")


class Recommender:
    """Answers queries with the most similar historical tickets of the current index."""

    def __init__(self, settings: Settings, store=None, model=None, index=None, prefilter=None):
        self.settings = settings
        self._store = store
        self._model = model
        self._index = index
        self._follow_current = index is None  # pick up new index versions (nightly reindex) when not pinned
        self._prefilter = prefilter
        self._lock = threading.Lock()
        self._switching = threading.Lock()  # held by the one thread opening a new index version
        self._broker_down_until = 0.0
        #: How the last query was answered: mode ("in-process" | "celery"), versions, fallback reason, timings.
        self.last_info: dict = {}

    # -- resources, loaded lazily -----------------------------------------------------------
    @property
    def store(self):
        if self._store is None:
            from ..data.store import Store

            self._store = Store(self.settings.db)
        return self._store

    @property
    def model(self):
        if self._model is None:
            from ..model.bundle import TicketModel

            self._model = TicketModel.load(self.settings.model)
        return self._model

    @property
    def prefilter(self):
        if self._prefilter is None:
            from ..lexical.searchers import make_prefilter

            self._prefilter = make_prefilter(self.settings, self.store)
        return self._prefilter

    @property
    def index(self):
        """The serving index; follows CURRENT when a reindex switched it (unless an index was pinned).

        A version is opened and warmed (its pages mapped) before it serves; while one thread warms a new version,
        the others go on answering from the old one.
        """
        from .index import current_version, open_current, open_version

        with self._lock:
            if self._index is None:  # nothing to serve yet: the first callers wait for it
                fresh = open_current(self.settings)
                fresh.warm()
                self._index = fresh
            index = self._index
        if self._follow_current:
            latest = current_version(self.settings)
            if latest and latest != index.version and self._switching.acquire(blocking=False):
                try:
                    fresh = open_version(self.settings, latest)
                    fresh.warm()
                    with self._lock:
                        self._index = index = fresh
                except IndexStateError as exc:
                    log.warning("index %s cannot be opened (%s); still serving %s", latest, exc, index.version)
                finally:
                    self._switching.release()
        self._check_model(index)
        return index

    def _check_model(self, index) -> None:
        model = self.model
        if index.model_version == model.version:
            return
        if self._follow_current and self._model is not None:
            from ..model.bundle import TicketModel

            try:
                reloaded = TicketModel.load(self.settings.model)
            except Exception as exc:  # keep serving what we have; say why
                log.warning("cannot reload the model for index %s: %s", index.version, exc)
            else:
                if reloaded.version == index.model_version:
                    self._model = reloaded
                    return
        raise IndexStateError(f"index {index.version} was built with model {index.model_version}, the model "
                              f"serving is {model.version}; rebuild the index: ticketrec index")

    @property
    def model_version(self) -> str:
        return self.model.version

    @property
    def index_version(self) -> str:
        return self.index.version

    # -- the query path ---------------------------------------------------------------------
    def recommend(self, query: Query, k: int = 10) -> list[Recommendation]:
        """The k historical tickets most similar to `query`, best first, each with its calibrated score and why."""
        validate_query(query, self.settings)
        if k < 1:
            raise InputError(f"k must be at least 1, not {k}")
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        index, model = self.index, self.model
        query_vecs = model.encode_queries([query])
        timings["encode"] = time.perf_counter() - t0

        t1 = time.perf_counter()
        rows, bm25 = self._candidates(query, index)
        timings["prefilter"] = time.perf_counter() - t1

        t2 = time.perf_counter()
        best, mode, reason = self._score(index, query_vecs, k, rows, bm25)
        timings["score"] = time.perf_counter() - t2

        ids = [tid for tid, _, _ in best]
        tickets = {t.id: t for t in self.store.get_tickets(ids)}
        best = [item for item in best if item[0] in tickets]  # deleted since the index was built
        raw = np.array([g for _, g, _ in best], dtype=np.float64)
        calibrated = model.calibrate(raw) if len(raw) else raw
        out = []
        words = query_words(query)
        for rank, ((tid, g, bm), score) in enumerate(zip(best, calibrated), start=1):
            ticket = tickets[tid]
            out.append(Recommendation(
                ticket=ticket, rank=rank, raw_score=float(g), score=float(score),
                shared_terms=shared_terms(words, ticket),
                topics=model.top_topics(index.vectors, index.row_of[tid], n=3),
                bm25=None if bm is None else float(bm),
            ))
        timings["total"] = time.perf_counter() - t0
        self.last_info = {"mode": mode, "fallback_reason": reason, "index_version": index.version,
                          "model_version": model.version, "candidates": None if rows is None else int(len(rows)),
                          "timings": timings}
        return out

    def _candidates(self, query: Query, index) -> tuple[np.ndarray | None, np.ndarray | None]:
        """BM25 candidate rows and their scores; (None, None) = score the whole index.

        K = settings.candidates; K = 0 scores everything (the BM25 term is then left out). When the pre-filter
        finds nothing (no shared word) or its server is down, the whole index is scored instead.
        """
        k = self.settings.candidates
        if k <= 0:
            return None, None
        if self.settings.prefilter == "index":  # this index version's own postings: rows directly, same version
            rows, scores = index.bm25.top_k(f"{query.subject}\n{query.description}", k)
            return (rows, scores.astype(np.float32)) if rows.size else (None, None)
        try:
            hits = self.prefilter.candidates(f"{query.subject}\n{query.description}", k)
        except ServiceUnavailable as exc:
            log.warning("BM25 pre-filter unavailable (%s); scoring the whole index", exc)
            return None, None
        if not hits:
            return None, None
        rows, positions = index.rows_for([tid for tid, _ in hits])
        if rows.size == 0:
            return None, None
        scores = np.asarray([float(s) for _, s in hits], dtype=np.float32)[positions]
        return rows, scores

    def _score(self, index, query_vecs, k: int, rows, bm25) -> tuple[list[tuple[str, float, float | None]], str, str | None]:
        """Top k as (ticket id, g, bm25): on the Celery workers when configured and healthy, else in-process."""
        reason = None
        if self.settings.broker_url:
            if time.monotonic() < self._broker_down_until:
                reason = "the workers failed recently; retrying them later"
            else:
                from .distributed import score_on_workers

                try:
                    return score_on_workers(self.settings, index.version, query_vecs, k, rows, bm25), "celery", None
                except ServiceUnavailable as exc:
                    reason = str(exc)
                    self._broker_down_until = time.monotonic() + BROKER_RETRY_AFTER
                    log.warning("answering in-process: %s (the workers are retried in %.0fs)", reason,
                                BROKER_RETRY_AFTER)
        return score_in_process(index, query_vecs, k, rows, bm25), "in-process", reason


def score_in_process(index, query_vecs, k: int, rows=None, bm25=None) -> list[tuple[str, float, float | None]]:
    """Top k of one encoded query over the index (or its candidate rows) as (ticket id, g, bm25), best first."""
    from .scoring import rank

    best_rows, g, best_bm25 = rank(index.metric_spec, query_vecs, index.vectors, k, rows, bm25)
    ids = index.ticket_ids
    bms: Sequence = [None] * len(best_rows) if best_bm25 is None else best_bm25.tolist()
    return [(ids[int(r)], float(s), b) for r, s, b in zip(best_rows, g, bms)]
