"""The recommender: encode the query once → BM25 pre-filter → score precomputed ticket vectors → top k.

Scoring runs in-process, or — when TICKETREC_BROKER_URL is set — on Celery workers, one index shard each,
within `settings.query_deadline`; a dead or slow broker makes the engine answer in-process and log why, and
its circuit breaker (`distributed.CircuitBreaker`) keeps answering in-process, without touching the broker, for
TICKETREC_BROKER_RETRY_AFTER seconds before one query tries the workers again.

One engine serves many threads at once: each query takes the index version being served once, answers with that
version and the model it carries (`TicketIndex.model`), and returns its results together with how they were made
(`Answer`); the engine keeps no per-query state. Loading (the first version, a new one after a reindex) happens
under a lock, by one thread; the query path takes none.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Sequence, overload

import numpy as np

from ..config import Settings
from ..errors import IndexStateError, InputError, ServiceUnavailable
from ..data.filters import MetadataTable, TicketFilter
from ..data.records import Query, Recommendation, Ticket, query_text, ticket_text
from ..lexical.analyzer import content_words, matched_keys, stem_key, tokenize, word_spans
from ..lexical.bm25 import MIN_IDF
from .distributed import CircuitBreaker

log = logging.getLogger(__name__)

#: The circuit breaker's clock (its back-off is TICKETREC_BROKER_RETRY_AFTER; tests replace it).
monotonic = time.monotonic
#: Tickets added or changed since the metadata table was read that are patched into it rather than all read again
#: (at least this many, or a twentieth of the index if more).
METADATA_DELTA_MIN = 1000


def query_words(query: Query) -> list[str]:
    """The query's content words, in order (tokenised once per query)."""
    return content_words(tokenize(query_text(query)))


def shared_terms(query: Query | list[str], ticket: Ticket, word_idf: Callable[[str], float] | None = None) -> list[str]:
    """Content words of the query (or its `query_words`) that the ticket holds too, as BM25 matches words: by the
    stems of their terms (`stem_key`: the query's "attaching" is shared with a ticket's "attachments", "mozilla/5.0"
    only with a word of the same three terms, and a word of one term also with that term inside a longer word, as
    "dictionary" with ".../dictionaries/en-US.aff"), in the query's order, each stem key once, in the query's first
    form.

    With `word_idf` (a word's IDF in the knowledge base: `Bm25Postings.word_idf`) only the words that tell tickets
    apart, rarest first (ties in the query's order): a word in half the tickets or more, which BM25 weighs at its
    floor (a form's "steps to reproduce", the product's own name), says nothing about why this ticket came up.
    """
    words = query_words(query) if isinstance(query, Query) else query
    ticket_keys = set().union(*(matched_keys(stem_key(match.group(0))) for match in word_spans(ticket_text(ticket))))
    seen: set[tuple[str, ...]] = set()
    out = []
    for word in words:
        key = stem_key(word)
        if key and key not in seen and key in ticket_keys:
            seen.add(key)
            out.append(word)
    if word_idf is None:
        return out
    weight = {word: word_idf(word) for word in out}
    return sorted((word for word in out if weight[word] > MIN_IDF), key=lambda word: -weight[word])


@dataclass(frozen=True)
class AnswerInfo:
    """How one answer was made: the index version and the model it carries, the path that served it, timings."""

    index_version: str
    model_version: str
    #: Pre-filter that chose the candidates: "index" (BM25 on the version's own postings), "topics" (nearest topic
    #: vectors), "fts5", "elasticsearch",
    #: or "none" (the whole index scored without a lexical term: K = 0 for a model without BM25, or the search
    #: server was down).
    prefilter: str
    #: Where the candidates were scored: "celery" (the workers, one shard each) or "in-process".
    mode: str
    #: Why the answer was scored in-process although Celery workers are configured (None otherwise).
    fallback_reason: str | None
    #: Candidates scored; None = every ticket of the index.
    candidates: int | None
    #: Seconds per stage: encode, prefilter, score, tickets (fetch and explain), total.
    timings: dict[str, float] = field(default_factory=dict)
    #: The metadata conditions the results had to pass, as read (`data.filters`); empty without a filter.
    where: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return asdict(self)


@dataclass(frozen=True)
class Answer(Sequence[Recommendation]):
    """The answer to one query: its recommendations (`items`, best first) and how they were made (`info`).

    It is also the sequence of its items (len, index, iterate)."""

    items: list[Recommendation]
    info: AnswerInfo

    @overload
    def __getitem__(self, i: int) -> Recommendation: ...

    @overload
    def __getitem__(self, i: slice) -> list[Recommendation]: ...

    def __getitem__(self, i):
        return self.items[i]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Recommendation]:
        return iter(self.items)


def mark_copies(items: Sequence[Recommendation], before: Sequence[Ticket] = ()) -> None:
    """Set each result's `same_text_as` to the id of the first higher result whose ticket reads the same
    (`Ticket.text_key`), or of a ticket of `before` (shown above the results: a ticket page's own ticket), so that
    copies of one record under several ids are shown as one; rankings do not change."""
    first: dict[tuple[str, str, str], str] = {}
    for ticket in before:
        first.setdefault(ticket.text_key(), ticket.id)
    for rec in items:
        owner = first.setdefault(rec.ticket.text_key(), rec.ticket.id)
        rec.same_text_as = None if owner == rec.ticket.id else owner


def validate_query(query: Query, settings: Settings) -> None:
    """InputError for a query the engine cannot answer (empty, or a description that is too long)."""
    subject = (query.subject or "").strip()
    description = (query.description or "").strip()
    if not subject and not description:
        raise InputError("the query is empty; give a subject and/or a description")
    if len(query.description or "") > settings.max_description:
        raise InputError(f"the description has {len(query.description)} characters, more than the "
                         f"{settings.max_description} accepted; shorten it (or raise TICKETREC_MAX_DESCRIPTION)")
    if not tokenize(query_text(query)):
        raise InputError("the query has no words (only punctuation or markup); describe the problem in words")


class Recommender:
    """Answers queries with the most similar historical tickets of the current index version, with the model that
    version was encoded with. Safe to call from many threads.

    `store`: used by every thread (the caller's; default: one connection per thread). `model`: a model already
    loaded, served for the versions it encoded (others load their own). `index`: a pinned version (default:
    follow CURRENT, switching when a reindex moves it).
    """

    def __init__(self, settings: Settings, store=None, model=None, index=None, prefilter=None):
        self.settings = settings
        self._store = store
        self._local = threading.local()  # this thread's store, when none was given
        self._model = model
        self._index = index
        self._follow_current = index is None  # pick up new index versions (nightly reindex) when not pinned
        self._prefilter = prefilter
        self._lock = threading.Lock()  # held while the first version is opened
        self._switching = threading.Lock()  # held by the one thread opening a new index version
        self._failed_version: str | None = None  # a version that could not be opened: not tried again
        #: (index version, the store's change mark, its tickets' metadata by row): what filters read
        self._metadata: tuple | None = None
        self._metadata_lock = threading.Lock()  # one thread reads the store's metadata; the others wait for it
        #: Closed: queries go to the Celery workers; open: in-process (see `distributed.CircuitBreaker`).
        self.breaker = CircuitBreaker(settings.broker_retry_after, clock=lambda: monotonic())

    # -- resources, loaded lazily -----------------------------------------------------------
    @property
    def store(self):
        """The store of this thread."""
        if self._store is not None:
            return self._store
        store = getattr(self._local, "store", None)
        if store is None:
            from ..data.store import Store

            store = self._local.store = Store(self.settings.db)
        return store

    @property
    def model(self):
        """The model of the index version being served."""
        return self.model_for(self.index)

    def model_for(self, index):
        """The model `index` was encoded with: the one given to the engine when it is that model, else the copy
        inside the version (loaded once)."""
        given = self._model
        if given is not None and given.version == index.model_version:
            return given
        return index.model

    @property
    def searcher(self):
        """The BM25 searcher (`TICKETREC_PREFILTER`) of the index version being served."""
        return self._searcher_for(self.index)

    def _searcher_for(self, index):
        """The searcher for `index`: an `IndexSearcher` over that very version (made once per version), or the
        FTS5 / Elasticsearch backend (made once)."""
        from .searchers import IndexSearcher, make_searcher

        searcher = self._prefilter
        if searcher is None or (isinstance(searcher, IndexSearcher) and searcher.ticket_index is not index):
            searcher = self._prefilter = make_searcher(self.settings, self.store, index)
        return searcher

    @property
    def index(self):
        """The serving index version; follows CURRENT when a reindex switched it (unless an index was pinned).

        A version is opened, warmed (its pages mapped) and its model loaded before it serves; while one thread does
        that for a new version, the others go on answering from the old one. A version that cannot be opened (or
        whose model is missing or corrupt) is logged and skipped: the old one keeps serving.
        """
        from .index import current_version, open_current, open_version

        index = self._index  # one read: a query sees one version, old or new, never a mix
        if index is None:  # nothing to serve yet: the first callers wait for it
            with self._lock:
                if self._index is None:
                    fresh = open_current(self.settings)
                    self._prepare(fresh)
                    self._index = fresh
                index = self._index
        if self._follow_current:
            latest = current_version(self.settings)
            if (latest and latest != index.version and latest != self._failed_version
                    and self._switching.acquire(blocking=False)):
                try:
                    fresh = open_version(self.settings, latest)
                    self._prepare(fresh)
                    self._index = index = fresh
                except IndexStateError as exc:
                    self._failed_version = latest
                    log.warning("index %s cannot be served (%s); still serving %s", latest, exc, index.version)
                finally:
                    self._switching.release()
        return index

    def _prepare(self, index) -> None:
        """Make `index` ready to serve: its pages mapped, its model loaded (IndexStateError when it cannot be)."""
        index.warm()
        self.model_for(index)

    @property
    def model_version(self) -> str:
        """The fingerprint of the served version's model (from its manifest; nothing loaded)."""
        return self.index.model_version

    @property
    def index_version(self) -> str:
        return self.index.version

    # -- the query path ---------------------------------------------------------------------
    def recommend(self, query: Query, k: int = 10, where: TicketFilter | None = None) -> Answer:
        """The k historical tickets most similar to `query`, best first, each with its calibrated score and why,
        and how they were found (`Answer.info`); with `where`, only tickets whose metadata passes it, each scored
        as it would be without the filter (`filtered_candidates`)."""
        validate_query(query, self.settings)
        if k < 1:
            raise InputError(f"k must be at least 1, not {k}")
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        index = self.index  # taken once: everything below uses this version and its model
        model = self.model_for(index)
        query_vecs = model.encode_queries([query])
        timings["encode"] = time.perf_counter() - t0

        t1 = time.perf_counter()
        bm25_max = allowed = None
        if where is None:
            rows, bm25 = self.candidates(query, index, least=k)
        else:
            rows, bm25, bm25_max, allowed = self.filtered_candidates(query, index, where, least=k)
        timings["prefilter"] = time.perf_counter() - t1

        best, tickets, mode, reason = self._best_stored(index, query_vecs, k, rows, bm25, timings, where, bm25_max)
        t3 = time.perf_counter()
        raw = np.array([g for _, g, _ in best], dtype=np.float64)
        calibrated = model.calibrate(raw) if len(raw) else raw
        shares = result_channel_shares(index, query_vecs, best, rows, bm25, bm25_max,
                                       pool=self._reference_pool(index, rows, allowed))
        out = []
        words, version_idf = query_words(query), index.bm25.word_idf
        idf_of = {word: version_idf(word) for word in dict.fromkeys(words)}  # once a query: they choose shared terms
        with_topics = index.metric_spec["channels"].get("T", 0.0) > 0  # topics say why only when T weighs
        for rank, ((tid, g, bm), score, share) in enumerate(zip(best, calibrated, shares), start=1):
            ticket = tickets[tid]
            out.append(Recommendation(
                ticket=ticket, rank=rank, raw_score=float(g), score=float(score),
                shared_terms=shared_terms(words, ticket, idf_of.__getitem__),
                topics=result_topics(model, index.vectors, index.row_of[tid], n=3) if with_topics else [],
                bm25=None if bm is None else float(bm), channel_shares=share,
            ))
        mark_copies(out)
        timings["tickets"] += time.perf_counter() - t3
        timings["total"] = time.perf_counter() - t0
        prefilter = "none" if rows is None and bm25 is None else str(self._searcher_for(index).name)
        info = AnswerInfo(index_version=index.version, model_version=model.version, prefilter=prefilter, mode=mode,
                          fallback_reason=reason, candidates=None if rows is None else int(len(rows)),
                          timings=timings, where=[] if where is None else [str(c) for c in where.conditions])
        return Answer(out, info)

    def _best_stored(self, index, query_vecs, k: int, rows, bm25, timings: dict, where: TicketFilter | None = None,
                     bm25_max: float | None = None) -> tuple[list, dict, str, str | None]:
        """The k best of `index` that the store still holds (and that pass `where` as stored now), with those
        tickets: a ticket removed since the index was built (`ticketrec remove`), or changed so that the filter
        no longer keeps it, is skipped, and as many more are scored as were skipped."""
        want, scored, fetched = k, 0.0, 0.0
        while True:
            t = time.perf_counter()
            best, mode, reason = self._score(index, query_vecs, want, rows, bm25, bm25_max)
            scored += time.perf_counter() - t
            t = time.perf_counter()
            tickets = {ticket.id: ticket for ticket in self.store.get_tickets([tid for tid, _, _ in best])}
            fetched += time.perf_counter() - t
            stored = [item for item in best
                      if item[0] in tickets and (where is None or where.matches(tickets[item[0]].metadata))]
            if len(stored) >= k or len(best) < want:  # enough, or no candidate left
                break
            want += len(best) - len(stored)
        timings["score"], timings["tickets"] = scored, fetched
        return stored[:k], tickets, mode, reason

    def candidates(self, query: Query, index, least: int = 1) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(candidate rows, their BM25) from the searcher face; rows None = score the whole index, with `bm25`
        then None (no lexical term) or one score per index row.

        K = settings.candidates. The lexical feature is bm25 / the query's maximum over the index (`lexical.bm25`):
        the top K always holds that maximum. K = 0 scores every ticket, so when the model weighs BM25 every
        ticket's BM25 is computed too. When fewer than `least` tickets share a word with the query (none, by
        default; `recommend` asks for as many as the results it returns), the whole index is scored, every ticket
        that shares none with lexical 0 (`scores_every_ticket`); when the searcher's server is down, it is scored
        without the lexical term (logged).
        """
        k = self.settings.candidates
        exhaustive = k <= 0
        lexical = weighs_bm25(index)
        if exhaustive and not lexical:
            return None, None
        text = query_text(query)
        searcher = self._searcher_for(index)
        try:
            if exhaustive:
                return None, searcher.score_index(text, index).astype(np.float32)
            rows, scores = searcher.search_rows(text, k, index)
        except ServiceUnavailable as exc:
            log.warning("BM25 searcher unavailable (%s); scoring the whole index", exc)
            return None, None
        if scores_every_ticket(rows.size, least, k, weighs_dense(index.metric_spec)):
            if not lexical:
                return None, None
            every = np.zeros(len(index), np.float32)  # fewer than K share a word: the rows hold all of them
            every[rows] = scores
            return None, every
        return rows, scores.astype(np.float32)

    def metadata_table(self, index) -> MetadataTable:
        """The metadata of the tickets of `index`, by row, as the store holds it now (`Store.change_mark` says when
        it changed); a row whose ticket was removed has none. After tickets were added, changed or removed, only
        the changed ones are read (`_metadata_changes`); after changes to many, every ticket's metadata is."""
        mark = self.store.change_mark()
        cached = self._metadata
        if cached is None or cached[0] != index.version or cached[1] != mark:
            with self._metadata_lock:
                cached = self._metadata
                if cached is None or cached[0] != index.version or cached[1] != mark:
                    changed = None if cached is None or cached[0] != index.version else \
                        self._metadata_changes(index, cached, mark)
                    if changed is None:
                        row_of, unindexed = index.row_of, set()
                        rows = []
                        for tid, metadata in self.store.ticket_metadata():
                            if tid in row_of:
                                rows.append((row_of[tid], metadata))
                            else:  # new since the index was built: no row to filter, but known (see below)
                                unindexed.add(tid)
                        changed = (MetadataTable.of(len(index), rows), frozenset(unindexed))
                    self._metadata = cached = (index.version, mark, *changed)
        return cached[2]

    def _metadata_changes(self, index, cached: tuple, mark: tuple[int, float]) -> tuple | None:
        """(table, unindexed ids) of `cached` brought to the store's `mark` by reading only the tickets added or
        changed after its mark's newest change, or None when too many changed for that to be worth it. When the
        count is not the old one plus the new ids, tickets were removed: the store's ids (not their metadata) say
        which, and their rows are emptied. (A change that moves neither the count nor the newest time is not seen
        at all, here as by `Store.change_mark`.)"""
        _, (count, newest), table, unindexed = cached
        changes = list(self.store.ticket_metadata(since=newest))
        if len(changes) > max(METADATA_DELTA_MIN, len(index) // 20):
            return None
        row_of = index.row_of
        rows = {row_of[tid]: metadata for tid, metadata in changes if tid in row_of}
        new = {tid for tid, _ in changes if tid not in row_of and tid not in unindexed}
        if mark[0] != count + len(new):
            present = set(self.store.ticket_ids())
            rows.update((row, {}) for tid, row in row_of.items() if tid not in present)
            unindexed = frozenset(tid for tid in unindexed if tid in present)
        return table.with_rows(rows.items()), unindexed | new

    def filtered_candidates(self, query: Query, index, where: TicketFilter, least: int = 1
                            ) -> tuple[np.ndarray, np.ndarray | None, float | None, np.ndarray]:
        """`candidates` among the tickets `where` keeps: (rows, their BM25, the query's BM25 maximum over the whole
        index, every row `where` keeps). The K best by BM25 of those sharing a word with the query (all of them
        when fewer than `least` do, as `candidates` decides, or K = 0); the maximum is the one the unfiltered
        ranking normalises by, so a ticket scores the same with a filter as without. InputError for a filter on a
        field no ticket has (`MetadataTable.mask`)."""
        from .scoring import top_k

        allowed = np.flatnonzero(self.metadata_table(index).mask(where)).astype(np.int64)
        k = self.settings.candidates
        lexical = weighs_bm25(index)
        if allowed.size == 0 or (k <= 0 and not lexical):
            return allowed, None, None, allowed
        try:
            dense = self._searcher_for(index).score_index(query_text(query), index).astype(np.float32)
        except ServiceUnavailable as exc:
            log.warning("BM25 searcher unavailable (%s); scoring the filtered tickets without it", exc)
            return allowed, None, None, allowed
        scores, top = dense[allowed], float(dense.max(initial=0.0))
        sharing = np.flatnonzero(scores > 0)
        if k > 0 and not scores_every_ticket(sharing.size, least, k, weighs_dense(index.metric_spec)):
            best = sharing[top_k(scores[sharing], k)]
            return allowed[best], scores[best], top, allowed
        return allowed, scores if lexical else None, top, allowed

    def _reference_pool(self, index, rows, allowed: np.ndarray | None) -> np.ndarray | None:
        """The rows a result's "why" is measured against when the candidates `rows` are every ticket (of the rows
        a filter keeps, `allowed`; None: no filter) that shares a word with the query, fewer than K: all those
        tickets, the ones outside `rows` with no words in common; None when the candidates themselves are the
        reference (the BM25 top K, or every ticket already). Without it, a query that few tickets share a word
        with had its results explained against those few, mostly the results themselves ("LSTM 100 %" for a result
        that shares the query's rarest word)."""
        k = self.settings.candidates
        if rows is None or k <= 0 or len(rows) >= k:
            return None
        return np.arange(len(index), dtype=np.int64) if allowed is None else allowed

    def _score(self, index, query_vecs, k: int, rows, bm25, bm25_max: float | None = None,
               ) -> tuple[list[tuple[str, float, float | None]], str, str | None]:
        """Top k as (ticket id, g, bm25): on the Celery workers when configured and healthy, else in-process
        (`bm25_max`: the BM25 maximum to normalise by, when not the candidates' own)."""
        reason = None
        if self.settings.broker_url:
            if not self.breaker.allow():  # open: no connection attempt, the answer says why
                reason = self.breaker.reason() or "another query is trying the workers again"
            else:
                from .distributed import score_on_workers

                try:
                    best = score_on_workers(self.settings, index.version, query_vecs, k, rows, bm25,
                                            bm25_max=bm25_max)
                except ServiceUnavailable as exc:
                    reason = str(exc)
                    self.breaker.failure(reason)
                    log.warning("answering in-process: %s (the workers are retried in %.0fs)", reason,
                                self.breaker.backoff)
                except BaseException as exc:  # not the broker's fault, but the trial must end
                    self.breaker.failure(f"{type(exc).__name__}: {exc}")
                    raise
                else:
                    self.breaker.success()
                    return best, "celery", None
        return score_in_process(index, query_vecs, k, rows, bm25, bm25_max), "in-process", reason


def scores_every_ticket(sharing: int, least: int, k: int, dense: bool) -> bool:
    """Whether a query that `sharing` tickets share a word with is scored against every ticket rather than its BM25
    top K: when none does, or when fewer than `least` (the results asked for) and fewer than K do and the metric
    weighs a `dense` channel, which can rank the others. A short query in words that few tickets use (on SeaMonkey
    "spellchecker dictionary": 6 tickets) then still gets its results, the others found by meaning (term
    mismatch); a model of BM25 alone has nothing to rank them by."""
    return sharing == 0 or (dense and sharing < least and sharing < k)


def weighs_dense(spec: dict) -> bool:
    """Whether the metric `spec` weighs a channel besides BM25 above 0."""
    return any(float(w) > 0 for w in spec.get("channels", {}).values())


def weighs_bm25(index) -> bool:
    """Whether the model `index` was encoded with weighs BM25 (the lexical feature) above 0."""
    return bool(float(index.metric_spec.get("bm25", 0.0) or 0.0))


#: Candidates (at most) whose per-channel distances stand for "the typical candidate" of a query.
REFERENCE_SAMPLE = 256

#: Each served model's DocNADE topic words (model → (its fingerprint, words)): a top-k over the whole vocabulary per
#: topic, which `TicketModel.top_topics` recomputed for every result (40 ms a query on a real vocabulary).
_TOPIC_WORDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def result_topics(model, ticket_vecs, row: int, n: int = 3) -> list[dict]:
    """`model.top_topics(ticket_vecs, row, n)` with the topics' top words computed once per model."""
    keys = [key for key in ticket_vecs if key.endswith(".T")]
    if not keys or model.topic_model is None:
        return []
    cached = _TOPIC_WORDS.get(model)
    if cached is None or cached[0] != model.version:
        cached = _TOPIC_WORDS[model] = (model.version, model.topic_words(5))
    words = cached[1]
    vec = np.mean([ticket_vecs[key][row] for key in keys], axis=0)
    best = np.argsort(-vec, kind="stable")[:n]
    return [{"id": int(i), "weight": float(vec[i]), "words": words[i] if i < len(words) else []} for i in best]


#: Readable names of the metric's channels (`Recommendation.channel_shares` keys) and what each one is.
CHANNEL_LABELS = {
    "bm25": ("words in common", "BM25 over the subject, description and solution"),
    "S": ("meaning", "pretrained sentence encoder (MiniLM)"),
    "T": ("topics", "DocNADE topic mix"),
    "h": ("LSTM", "LSTM trained on this knowledge base's pairs"),
    "E": ("word embeddings", "IDF-weighted mean of the word vectors"),
    "C": ("spelling", "character-level Siamese BLSTM (robust to typos and word order)"),
    "V": ("intent", "variational Siamese encoder (Gaussian intents)"),
}

#: What the CLI and the web UI say of a result whose shares are all 0 (no channel puts it closer than the typical
#: candidate).
NO_CHANNEL_SETS_IT_APART = "no channel sets it apart from the typical candidate"


def share_percentages(shares: dict[str, float]) -> list[tuple[str, int]]:
    """(channel, whole percent) of a result's `channel_shares`, adding up to 100 (largest remainder), largest
    first; channels at 0 % left out (an empty list when no channel sets the result apart)."""
    items = [(c, float(v)) for c, v in shares.items() if float(v) > 0.0]
    if not items:
        return []
    total = sum(v for _, v in items)
    raw = [(c, 100.0 * v / total) for c, v in items]
    percent = {c: int(p) for c, p in raw}
    for c, _ in sorted(raw, key=lambda cp: cp[1] - int(cp[1]), reverse=True)[: 100 - sum(percent.values())]:
        percent[c] += 1
    return [(c, p) for c, p in sorted(percent.items(), key=lambda cp: -cp[1]) if p > 0]


def _evenly_spaced(n: int) -> np.ndarray:
    """At most REFERENCE_SAMPLE positions of 0 … n − 1, evenly spaced (all of them when n is no more)."""
    if n <= REFERENCE_SAMPLE:
        return np.arange(n, dtype=np.int64)
    return np.unique(np.linspace(0, n - 1, REFERENCE_SAMPLE).round().astype(np.int64))


def result_channel_shares(index, query_vecs, best: Sequence[tuple[str, float, float | None]], rows=None,
                          bm25=None, bm25_max: float | None = None, pool=None) -> list[dict[str, float]]:
    """Each result's channel shares (`scoring.channel_shares`) against an evenly spaced sample of at most
    REFERENCE_SAMPLE of the query's scored candidates (`rows`, or every index row when None; `bm25` and `bm25_max`
    as given to the scorer); with `pool` (index rows holding every candidate, which are all of the pool's tickets
    that share a word with the query), a sample of the pool instead, a ticket that is no candidate with BM25 0.
    One pass over the results and the sample, whichever path (in-process, Celery) scored them."""
    from .scoring import channel_distances, channel_shares

    if not best:
        return []
    spec = index.metric_spec
    if pool is None:
        positions = _evenly_spaced(len(index) if rows is None else len(rows))
        reference_rows = positions if rows is None else np.asarray(rows, dtype=np.int64)[positions]
    else:
        pool = np.asarray(pool, dtype=np.int64)
        reference_rows = pool[_evenly_spaced(len(pool))]
    result_rows = np.array([index.row_of[tid] for tid, _, _ in best], dtype=np.int64)
    all_bm25 = None
    if bm25 is not None:
        bm25 = np.asarray(bm25, dtype=np.float32)
        if bm25_max is None:
            bm25_max = float(bm25.max(initial=0.0))  # the normalisation the ranking used
        if rows is None:  # one score per index row
            result_bm25 = bm25[result_rows]
        else:  # the scorer returned each result's own BM25
            result_bm25 = np.array([0.0 if bm is None else bm for _, _, bm in best], dtype=np.float32)
        if pool is None:
            reference_bm25 = bm25[positions]
        else:  # a pooled ticket's BM25 where it is a candidate, else 0 (as `candidates` fills every ticket's)
            every = np.zeros(len(index), np.float32)
            every[rows] = bm25
            reference_bm25 = every[reference_rows]
        all_bm25 = np.concatenate([result_bm25, reference_bm25])
    d = channel_distances(spec, query_vecs, index.vectors, np.concatenate([result_rows, reference_rows]), all_bm25,
                          bm25_max=bm25_max)
    k = len(best)
    shares = channel_shares({c: v[:k] for c, v in d.items()}, {c: v[k:] for c, v in d.items()})
    return shares or [{} for _ in best]


def score_in_process(index, query_vecs, k: int, rows=None, bm25=None,
                     bm25_max: float | None = None) -> list[tuple[str, float, float | None]]:
    """Top k of one encoded query over the index (or its candidate rows) as (ticket id, g, bm25), best first."""
    from .scoring import rank

    best_rows, g, best_bm25 = rank(index.metric_spec, query_vecs, index.vectors, k, rows, bm25, bm25_max=bm25_max)
    ids = index.ticket_ids
    bms: Sequence = [None] * len(best_rows) if best_bm25 is None else best_bm25.tolist()
    return [(ids[int(r)], float(s), b) for r, s, b in zip(best_rows, g, bms)]
