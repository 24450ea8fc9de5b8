"""BM25 search, one face over several backends (pyserini style): `Searcher.search(text, k) -> [(ticket_id, score)]`.

- `IndexSearcher` (in `serving/searchers.py`, the default pre-filter) scores the BM25 postings of the index version
  being served: the one BM25 of `bm25.py`, exact top K in a compiled pass, fast at a million tickets.
- `MemorySearcher` scores a list of tickets held in memory with the same BM25 (`Bm25Scorer`): evaluation's backend.
- `Fts5Searcher` (embedded, needs no index) reads the store's `tickets_fts` table (SQLite FTS5, `porter unicode61`
  tokenizer), which the store's triggers keep in sync with `tickets`, and ranks with FTS5's `bm25()` (k1 = 1.2,
  b = 0.75 fixed by FTS5; the column weights explicit, `DEFAULT_WEIGHTS`).
- `ElasticsearchSearcher` (distributed) keeps its own index (English analyzer, explicit BM25 similarity with the
  same k1, b), filled by `rebuild` (fresh index, then an atomic alias swap) or upserted by `index`.

Where FTS5 differs from the one BM25: the formula, weights and parameters are the same, but FTS5 stems with its own
Porter tokenizer (our `fts5_stem` is NLTK's Porter, which agrees on most but not all words: a word stemmed
differently is a different term, with its own document frequency), and it counts N and n(t) over every ticket of
the store, which can differ from an index version's tickets between reindexes. Elasticsearch differs more (its
English analyzer has other stop words and stems, and Lucene's IDF is ln(1 + (N − n + 0.5)/(n + 0.5))). The
metric's lexical feature is therefore defined by the one BM25 only; `benchmarks/lexical_agreement.py` measures the
top-10 overlap and score differences between the backends (docs/internals.md, "Lexical agreement").

User text is never query syntax on any backend: it is tokenised by the analyser (`query_terms`), stop words are
dropped, and only plain terms reach the engine (quoted FTS5 strings; an ES `multi_match`, never `query_string`).
A query keeps at most `MAX_QUERY_TERMS` distinct terms, so a 100 KB paste stays fast.

Scores are BM25, higher is better, best first.
"""
from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import Iterable, Iterator, Sequence

import numpy as np
from tqdm import tqdm

from ..data.records import Ticket
from ..errors import IndexStateError, InputError, ServiceUnavailable, TicketrecError
from .analyzer import MAX_QUERY_TERMS, fts5_stem, query_terms
from .bm25 import BM25_B, BM25_K1, DEFAULT_WEIGHTS, FIELDS, Bm25Scorer, select_terms


def fts5_match_expression(terms: Sequence[str]) -> str:
    """An FTS5 MATCH expression that ORs the terms, each quoted as an FTS5 string (inner quotes doubled),
    so no keyword (AND, OR, NOT, NEAR), operator (`*`, `^`, `-`, `:`) or parenthesis is ever interpreted."""
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)


class Searcher(ABC):
    """BM25 search for a query text, one face over several backends."""

    name: str = "searcher"

    @abstractmethod
    def search(self, text: str, k: int) -> list[tuple[str, float]]:
        """The k best tickets for `text` as (ticket_id, BM25 score), best first; [] when no word matches."""

    def batch_search(self, texts: Sequence[str], k: int) -> list[list[tuple[str, float]]]:
        """`search` for many texts, in order."""
        return [self.search(t, k) for t in texts]

    def search_rows(self, text: str, k: int, index) -> tuple[np.ndarray, np.ndarray]:
        """`search` as (rows of `index`, float64 scores), best first, for the engine: hits `index` does not hold
        are dropped (`index` is anything with `rows_for(ids) -> (rows, positions)`, e.g. a `TicketIndex`)."""
        hits = self.search(text, k)
        if not hits:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        rows, positions = index.rows_for([tid for tid, _ in hits])
        scores = np.asarray([s for _, s in hits], dtype=np.float64)
        return rows, scores[positions] if len(positions) else np.zeros(0, np.float64)

    def score_index(self, text: str, index) -> np.ndarray:
        """BM25 of `text` against every row of `index`, float64 [len(index)] (0 where no term is shared): the
        lexical scores of exhaustive scoring (K = 0)."""
        rows, scores = self.search_rows(text, max(self.count(), len(index)), index)
        dense = np.zeros(len(index), dtype=np.float64)
        dense[rows] = scores
        return dense

    @abstractmethod
    def score_tickets(self, text: str, ticket_ids: Sequence[str]) -> dict[str, float]:
        """BM25 of `text` against each of `ticket_ids` (the same scores `search` gives); 0.0 for a ticket
        that shares no term with the text or is not indexed."""

    @abstractmethod
    def index(self, tickets: Iterable[Ticket], progress: bool = True) -> int:
        """Add or update these tickets in the backend's index; the number written."""

    @abstractmethod
    def remove(self, ticket_ids: Iterable[str]) -> int:
        """Drop these tickets (removed from the knowledge base) from the backend's index; the number dropped."""

    @abstractmethod
    def rebuild(self, tickets: Iterable[Ticket], progress: bool = True) -> int:
        """Replace the whole index by exactly these tickets, atomically; the number indexed."""

    @abstractmethod
    def count(self) -> int:
        """How many tickets the index holds."""

    def params(self) -> dict:
        """The backend and its BM25 parameters, for reports that must be reproducible."""
        return {"backend": self.name}


# -- in memory --------------------------------------------------------------------------------------------------
class MemorySearcher(Searcher):
    """The one BM25 (`Bm25Scorer`) over tickets held in memory, IDF over exactly them: `ticketrec evaluate`
    scores each split's knowledge base with it, as an index version of those tickets would."""

    name = "memory"

    def __init__(self, tickets: Iterable[Ticket] = (), weights: Sequence[float] = DEFAULT_WEIGHTS,
                 max_terms: int = MAX_QUERY_TERMS):
        if len(weights) != 3 or any(w < 0 for w in weights):
            raise InputError(f"BM25 field weights must be three non-negative numbers (subject, description, solution), not {weights!r}")
        self.weights, self.max_terms = tuple(float(w) for w in weights), int(max_terms)
        self._tickets: dict[str, Ticket] = {}
        self.rebuild(tickets, progress=False)

    @property
    def scorer(self) -> Bm25Scorer:
        return self._scorer

    def params(self) -> dict:
        return self._scorer.params()

    def search(self, text: str, k: int) -> list[tuple[str, float]]:
        rows, scores = self._scorer.top_k(text, k)
        ids = self._scorer.ids
        return [(ids[int(r)], float(s)) for r, s in zip(rows, scores)]

    def score_tickets(self, text: str, ticket_ids: Sequence[str]) -> dict[str, float]:
        ids = list(dict.fromkeys(ticket_ids))
        known = [tid for tid in ids if tid in self._scorer.row_of]
        scores = {tid: 0.0 for tid in ids}
        if known:
            values = self._scorer.score(text, [self._scorer.row_of[tid] for tid in known])
            scores.update(zip(known, values.tolist()))
        return scores

    def index(self, tickets: Iterable[Ticket], progress: bool = True) -> int:
        """Add or update these tickets (the statistics are recomputed over all of them)."""
        fresh = {t.id: t for t in tickets}
        self._tickets.update(fresh)
        self._scorer = Bm25Scorer(list(self._tickets.values()), self.weights, max_terms=self.max_terms)
        return len(fresh)

    def remove(self, ticket_ids: Iterable[str]) -> int:
        """Drop these tickets (the statistics are recomputed over the rest)."""
        dropped = sum(self._tickets.pop(tid, None) is not None for tid in ticket_ids)
        if dropped:
            self._scorer = Bm25Scorer(list(self._tickets.values()), self.weights, max_terms=self.max_terms)
        return dropped

    def rebuild(self, tickets: Iterable[Ticket], progress: bool = True) -> int:
        self._tickets = {}
        return self.index(tickets, progress)

    def count(self) -> int:
        return len(self._scorer)


# -- SQLite FTS5 ------------------------------------------------------------------------------------------------
class Fts5Searcher(Searcher):
    """BM25 over the store's FTS5 table `tickets_fts` (k1 = 1.2, b = 0.75 fixed by FTS5; explicit column weights).

    The store's triggers keep `tickets_fts` in sync with `tickets`, so `index` has nothing to do; `rebuild`
    re-derives the whole FTS5 index from the `tickets` table (e.g. after a VACUUM renumbered rowids).
    """

    name = "fts5"

    def __init__(self, store, weights: Sequence[float] = DEFAULT_WEIGHTS, max_terms: int = MAX_QUERY_TERMS):
        if len(weights) != 3 or any(w < 0 for w in weights):
            raise InputError(f"BM25 column weights must be three non-negative numbers (subject, description, solution), not {weights!r}")
        self.store = store
        self.weights = tuple(float(w) for w in weights)
        self.max_terms = int(max_terms)
        self._vocab_conn = None  # the connection that holds our temp fts5vocab table
        self._df_cache: dict[str, int] = {}  # FTS5 stem -> document frequency, valid for _df_key
        self._df_key: tuple | None = None
        self._n_docs = 0

    def params(self) -> dict:
        return {"backend": self.name, "k1": BM25_K1, "b": BM25_B, "weights": dict(zip(FIELDS, self.weights)),
                "max_terms": self.max_terms, "tokenizer": "porter unicode61"}

    # -- query building
    def _document_frequencies(self, terms: Sequence[str]) -> tuple[dict[str, int], int]:
        """Document frequency of each term (via its FTS5 stem) and the number of tickets.

        fts5vocab reads a term's whole doclist to count it, so counts are cached until the database changes
        (this connection's `total_changes` or, for other connections' commits, `PRAGMA data_version`).
        """
        conn = self.store.conn
        if self._vocab_conn is not conn:  # a per-connection temp table: the store's schema stays untouched
            conn.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.ticketrec_fts_vocab USING fts5vocab(main, tickets_fts, 'row')")
            self._vocab_conn, self._df_key = conn, None
        key = (conn.total_changes, conn.execute("PRAGMA data_version").fetchone()[0])
        if key != self._df_key or len(self._df_cache) > 200_000:  # changed, or grown too big for a long-lived server
            self._df_cache.clear()
            self._n_docs = conn.execute("SELECT COUNT(*) FROM tickets").fetchone()[0]
            self._df_key = key
        stems = {t: fts5_stem(t) for t in terms}
        missing = sorted(set(stems.values()) - self._df_cache.keys())
        for start in range(0, len(missing), 900):
            chunk = missing[start : start + 900]
            marks = ",".join("?" * len(chunk))
            self._df_cache.update(dict.fromkeys(chunk, 0))
            self._df_cache.update(conn.execute(f"SELECT term, doc FROM temp.ticketrec_fts_vocab WHERE term IN ({marks})", chunk).fetchall())
        return {t: self._df_cache.get(s, 0) for t, s in stems.items()}, self._n_docs

    def match_expression(self, text: str) -> str:
        """The FTS5 MATCH expression for a user text ('' when it has no searchable word)."""
        counts = query_terms(text)
        if len(counts) > self.max_terms:
            df, n_docs = self._document_frequencies(list(counts))
            terms = select_terms(counts, df, n_docs, self.max_terms)
        else:
            terms = list(counts)
        return fts5_match_expression(terms)

    # -- searching
    def search(self, text: str, k: int) -> list[tuple[str, float]]:
        if k <= 0:
            return []
        expr = self.match_expression(text)
        if not expr:
            return []
        rows = self.store.conn.execute(
            "SELECT t.id, -m.s FROM (SELECT rowid, bm25(tickets_fts, ?, ?, ?) AS s FROM tickets_fts "
            "WHERE tickets_fts MATCH ? ORDER BY s, rowid LIMIT ?) AS m JOIN tickets AS t ON t.rowid = m.rowid "
            "ORDER BY m.s, m.rowid",
            (*self.weights, expr, int(k)),
        ).fetchall()
        return [(r[0], float(r[1])) for r in rows]

    def score_tickets(self, text: str, ticket_ids: Sequence[str]) -> dict[str, float]:
        ids = list(dict.fromkeys(ticket_ids))
        scores = {tid: 0.0 for tid in ids}
        expr = self.match_expression(text)
        if not expr or not ids:
            return scores
        conn = self.store.conn
        for start in range(0, len(ids), 900):
            chunk = ids[start : start + 900]
            marks = ",".join("?" * len(chunk))
            rows = conn.execute(
                f"SELECT t.id, -bm25(tickets_fts, ?, ?, ?) FROM tickets_fts JOIN tickets AS t "
                f"ON t.rowid = tickets_fts.rowid WHERE tickets_fts MATCH ? "
                f"AND tickets_fts.rowid IN (SELECT rowid FROM tickets WHERE id IN ({marks}))",
                (*self.weights, expr, *chunk),
            ).fetchall()
            scores.update((r[0], float(r[1])) for r in rows)
        return scores

    # -- indexing
    def index(self, tickets: Iterable[Ticket], progress: bool = True) -> int:
        """Nothing to do: the store's triggers already indexed every ticket it holds. Returns 0."""
        return 0

    def remove(self, ticket_ids: Iterable[str]) -> int:
        """Nothing to do: the store's triggers dropped every ticket it removed. Returns 0."""
        return 0

    def rebuild(self, tickets: Iterable[Ticket] | None = None, progress: bool = True) -> int:
        """Rebuild `tickets_fts` from the store's `tickets` table in one transaction (`tickets` is ignored:
        FTS5 indexes exactly what the store holds; import tickets into the store to add them)."""
        with self.store.transaction() as conn:
            conn.execute("INSERT INTO tickets_fts(tickets_fts) VALUES ('rebuild')")
        return self.count()

    def count(self) -> int:
        return int(self.store.conn.execute("SELECT COUNT(*) FROM tickets").fetchone()[0])


# -- Elasticsearch ----------------------------------------------------------------------------------------------
class ElasticsearchSearcher(Searcher):
    """BM25 in Elasticsearch (8 or newer, official client): fields subject, description, solution with the
    `english` analyzer and an explicit BM25 similarity; queries are one `multi_match` (most_fields, boosts).

    `index_name` is an alias; `rebuild` fills a fresh concrete index `<alias>-<time>-<id>` and swaps the alias
    onto it in one atomic `update_aliases` call, so searches never see a half-filled index. Searches assume a
    single shard (the mapping's default) so BM25 statistics are global and scores are reproducible.
    """

    name = "elasticsearch"
    #: The most hits one search request asks for (Elasticsearch's default `index.max_result_window`, which refuses
    #: more); a search for more (every ticket's BM25: K = 0, a metadata filter) pages through a point in time.
    result_window = 10_000
    #: How long a point in time stays open between two pages.
    pit_keep_alive = "1m"

    def __init__(self, url: str, index_name: str = "ticketrec-tickets", weights: Sequence[float] = DEFAULT_WEIGHTS,
                 k1: float = BM25_K1, b: float = BM25_B, max_terms: int = MAX_QUERY_TERMS,
                 request_timeout: float = 10.0, client=None):
        if not url and client is None:
            raise TicketrecError("the Elasticsearch searcher needs a server: set TICKETREC_ES_URL "
                                 "(e.g. http://localhost:9200) or TICKETREC_PREFILTER=fts5")
        if len(weights) != 3 or any(w < 0 for w in weights):
            raise InputError(f"BM25 field boosts must be three non-negative numbers (subject, description, solution), not {weights!r}")
        self.url, self.alias = url, index_name
        self.weights = tuple(float(w) for w in weights)
        self.k1, self.b, self.max_terms = float(k1), float(b), int(max_terms)
        self._timeout = request_timeout
        self._client = client

    def params(self) -> dict:
        return {"backend": self.name, "k1": self.k1, "b": self.b, "weights": dict(zip(FIELDS, self.weights)),
                "max_terms": self.max_terms, "analyzer": "english", "index": self.alias}

    @property
    def client(self):
        if self._client is None:
            from elasticsearch import Elasticsearch

            self._client = Elasticsearch(self.url, request_timeout=self._timeout, max_retries=1, retry_on_timeout=False)
        return self._client

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Turn client exceptions into project errors that say what to do."""
        import elasticsearch

        try:
            yield
        except elasticsearch.ConnectionError as exc:  # also ConnectionTimeout
            raise ServiceUnavailable(f"cannot reach Elasticsearch at {self.url}: {exc}; start it or unset "
                                     f"TICKETREC_ES_URL (and TICKETREC_PREFILTER) to use the embedded FTS5 pre-filter") from exc
        except elasticsearch.NotFoundError as exc:
            raise IndexStateError(f"the Elasticsearch index {self.alias!r} does not exist at {self.url}; "
                                  f"fill it with `ticketrec prefilter-index`") from exc
        except (elasticsearch.AuthenticationException, elasticsearch.AuthorizationException) as exc:
            raise ServiceUnavailable(f"Elasticsearch at {self.url} refused us ({exc}); put valid credentials "
                                     f"in TICKETREC_ES_URL (https://user:password@host:9200)") from exc
        except elasticsearch.ApiError as exc:
            raise TicketrecError(f"Elasticsearch at {self.url} answered an error: {exc}") from exc

    # -- bodies (pure, unit-tested without a server)
    def index_body(self) -> dict:
        """Settings and mappings of a fresh index: one shard, explicit BM25, English analyzer on every field."""
        text = {"type": "text", "analyzer": "english", "similarity": "ticketrec_bm25"}
        return {
            "settings": {
                "number_of_shards": 1,
                "number_of_replicas": 0,
                "similarity": {"ticketrec_bm25": {"type": "BM25", "k1": self.k1, "b": self.b}},
            },
            "mappings": {"dynamic": "strict", "properties": {f: dict(text) for f in FIELDS}},
        }

    def _query_text(self, text: str) -> str:
        return " ".join(select_terms(query_terms(text), None, 0, self.max_terms))

    def _multi_match(self, query_text: str) -> dict:
        return {"multi_match": {
            "query": query_text,
            "type": "most_fields",
            "fields": [f"{f}^{w:g}" for f, w in zip(FIELDS, self.weights) if w > 0],
            "operator": "or",
        }}

    def query_body(self, text: str, k: int) -> dict | None:
        """The search body for `text` (None when it has no searchable word): a `multi_match` over the three
        fields with boosts, of at most `max_terms` plain terms (the most frequent in the query)."""
        query_text = self._query_text(text)
        if not query_text or k <= 0:
            return None
        return {"query": self._multi_match(query_text), "size": int(k), "_source": False, "track_total_hits": False}

    def score_body(self, text: str, ticket_ids: Sequence[str]) -> dict | None:
        """The search body that scores exactly `ticket_ids` (an `ids` filter does not change the scores)."""
        query_text = self._query_text(text)
        if not query_text or not ticket_ids:
            return None
        return {"query": {"bool": {"must": [self._multi_match(query_text)], "filter": [{"ids": {"values": list(ticket_ids)}}]}},
                "size": len(ticket_ids), "_source": False, "track_total_hits": False}

    def page_body(self, body: dict, pit_id: str, after: Sequence | None, size: int) -> dict:
        """`body` (a `query_body`) as one page of a point-in-time search: `size` hits after the sort values
        `after` (None: the first page), best first, ties in the index's own order (`_shard_doc`)."""
        page = {key: value for key, value in body.items() if key != "size"}
        page.update(size=int(size), pit={"id": pit_id, "keep_alive": self.pit_keep_alive},
                    sort=[{"_score": "desc"}, {"_shard_doc": "asc"}])
        if after is not None:
            page["search_after"] = list(after)
        return page

    @staticmethod
    def _hits(response) -> list[tuple[str, float]]:
        return [(h["_id"], float(h["_score"])) for h in response["hits"]["hits"]]

    def _paged_hits(self, body: dict) -> list[tuple[str, float]]:
        """The hits of a body asking for more than `result_window`, a page at a time through one point in time
        (a consistent view of the index while it pages), which is closed again even when a page fails."""
        import elasticsearch

        wanted = int(body["size"])
        pit = self.client.open_point_in_time(index=self.alias, keep_alive=self.pit_keep_alive)["id"]
        hits: list[tuple[str, float]] = []
        after = None
        try:
            while len(hits) < wanted:
                size = min(self.result_window, wanted - len(hits))
                response = self.client.search(body=self.page_body(body, pit, after, size))
                page = response["hits"]["hits"]
                hits += self._hits(response)
                pit = response.get("pit_id", pit)
                if len(page) < size:
                    break
                after = page[-1]["sort"]
        finally:
            try:
                self.client.close_point_in_time(id=pit)
            except (elasticsearch.ApiError, elasticsearch.TransportError):
                pass  # it expires by itself after `pit_keep_alive`; the search's own error, if any, is the one to see
        return hits

    # -- searching
    def search(self, text: str, k: int) -> list[tuple[str, float]]:
        body = self.query_body(text, k)
        if body is None:
            return []
        with self._errors():
            if k > self.result_window:
                return self._paged_hits(body)
            return self._hits(self.client.search(index=self.alias, body=body))

    def batch_search(self, texts: Sequence[str], k: int) -> list[list[tuple[str, float]]]:
        """One `msearch` round trip for all texts (one paged search per text for more than `result_window` hits)."""
        if k > self.result_window:
            return [self.search(t, k) for t in texts]
        bodies = [self.query_body(t, k) for t in texts]
        searches: list[dict] = []
        for body in bodies:
            if body is not None:
                searches += [{"index": self.alias}, body]
        if not searches:
            return [[] for _ in texts]
        with self._errors():
            responses = iter(self.client.msearch(searches=searches)["responses"])
        out: list[list[tuple[str, float]]] = []
        for body in bodies:
            if body is None:
                out.append([])
                continue
            resp = next(responses)
            if "error" in resp:
                raise TicketrecError(f"Elasticsearch at {self.url} failed a search: {resp['error']}")
            out.append(self._hits(resp))
        return out

    def score_tickets(self, text: str, ticket_ids: Sequence[str]) -> dict[str, float]:
        ids = list(dict.fromkeys(ticket_ids))
        scores = {tid: 0.0 for tid in ids}
        for start in range(0, len(ids), 1000):
            body = self.score_body(text, ids[start : start + 1000])
            if body is None:
                break
            with self._errors():
                scores.update(self._hits(self.client.search(index=self.alias, body=body)))
        return scores

    # -- indexing
    def _actions(self, tickets: Iterable[Ticket], index: str) -> Iterator[dict]:
        for t in tickets:
            yield {"_op_type": "index", "_index": index, "_id": t.id,
                   "_source": {"subject": t.subject, "description": t.description, "solution": t.solution}}

    def _bulk(self, tickets: Iterable[Ticket], index: str, progress: bool) -> int:
        from elasticsearch.helpers import streaming_bulk

        total = len(tickets) if hasattr(tickets, "__len__") else None
        written, failed = 0, []
        with tqdm(total=total, desc=f"BM25 index {index}", unit="ticket", disable=not progress, leave=False) as bar:
            for ok, item in streaming_bulk(self.client, self._actions(tickets, index), chunk_size=500,
                                           raise_on_error=False, max_retries=3):
                if ok:
                    written += 1
                else:
                    failed.append(item)
                bar.update(1)
        if failed:
            raise TicketrecError(f"Elasticsearch rejected {len(failed)} tickets, e.g. {failed[0]}; fix them and run again")
        return written

    def _alias_targets(self) -> list[str]:
        import elasticsearch

        try:
            return sorted(self.client.indices.get_alias(name=self.alias).body)
        except elasticsearch.NotFoundError:
            return []

    def index(self, tickets: Iterable[Ticket], progress: bool = True) -> int:
        """Add or update these tickets in the index behind the alias (created by `rebuild` when missing)."""
        with self._errors():
            if not self._alias_targets() and not self.client.indices.exists(index=self.alias):
                return self.rebuild(tickets, progress)
            written = self._bulk(tickets, self.alias, progress)
            self.client.indices.refresh(index=self.alias)
            return written

    def remove(self, ticket_ids: Iterable[str]) -> int:
        """Delete these tickets from the index behind the alias (one already absent is no error)."""
        from elasticsearch.helpers import streaming_bulk

        actions = ({"_op_type": "delete", "_index": self.alias, "_id": tid} for tid in ticket_ids)
        dropped, failed = 0, []
        with self._errors():
            for ok, item in streaming_bulk(self.client, actions, chunk_size=500, raise_on_error=False, max_retries=3):
                if ok:
                    dropped += 1
                elif item.get("delete", {}).get("status") != 404:
                    failed.append(item)
            if failed:
                raise TicketrecError(f"Elasticsearch could not delete {len(failed)} tickets, e.g. {failed[0]}; run "
                                     "`ticketrec prefilter-index` to rebuild its index from the store")
            self.client.indices.refresh(index=self.alias)
        return dropped

    def rebuild(self, tickets: Iterable[Ticket], progress: bool = True) -> int:
        """Fill a fresh index with exactly `tickets`, then point the alias at it atomically and drop the old one.

        On any failure (or Ctrl-C) the fresh index is deleted and the alias keeps serving the old one.
        """
        fresh = f"{self.alias}-{time.strftime('%Y%m%d%H%M%S')}-{uuid.uuid4().hex[:6]}"
        with self._errors():
            old = self._alias_targets()
            concrete_old = not old and self.client.indices.exists(index=self.alias)
            self.client.indices.create(index=fresh, **self.index_body())
            try:
                written = self._bulk(tickets, fresh, progress)
                self.client.indices.refresh(index=fresh)
                actions = [{"remove": {"index": o, "alias": self.alias}} for o in old]
                if concrete_old:  # a plain index squatting the alias name: replaced in the same atomic call
                    actions.append({"remove_index": {"index": self.alias}})
                actions.append({"add": {"index": fresh, "alias": self.alias}})
                self.client.indices.update_aliases(actions=actions)
            except BaseException:
                self.client.indices.delete(index=fresh, ignore_unavailable=True)
                raise
            for o in old:
                self.client.indices.delete(index=o, ignore_unavailable=True)
        return written

    def count(self) -> int:
        with self._errors():
            return int(self.client.count(index=self.alias)["count"])
