"""BM25 postings stored in every index version: the embedded pre-filter that stays fast at a million tickets.

FTS5 answers an OR query by scoring, one row at a time, every ticket that holds any query term, so a query of
common words costs hundreds of milliseconds at 100k tickets. Here each index version carries an inverted index
over exactly the tickets of its vectors (same rows), and a query adds its terms' postings into one accumulator
in a compiled loop (numba), then keeps the K best rows.

The score is the one BM25 of `bm25.py` (FTS5's `bm25()` formula, field weights, IDF over the version's tickets),
computed with its functions (`document_terms`, `query_stems`, `idf`, `length_norm`, `term_score`), so a version's
postings score exactly like a `Bm25Scorer` over the same tickets. Stop words are counted in |d| but get no
postings (no query holds them). Files of a version directory:

    bm25_terms.json   the terms; a term's id is its position
    bm25_ptr.npy      int64 [T + 1]: term t's postings are [ptr[t], ptr[t+1])
    bm25_rows.npy     int32 [P]: the index rows holding the term
    bm25_tf.npy       float32 [P]: their weighted term frequency f(t, d)
    bm25_length.npy   float32 [N]: every row's length |d| in tokens
"""
from __future__ import annotations

import json
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from ..data.records import Ticket
from ..errors import IndexStateError
from .analyzer import MAX_QUERY_TERMS
from .bm25 import BM25_B, BM25_K1, DEFAULT_WEIGHTS, FIELDS, document_terms, idf, length_norm, query_stems, term_score

TERMS_FILE = "bm25_terms.json"
ARRAYS = ("ptr", "rows", "tf", "length")
_RUN_INDEX = "run `ticketrec index --full` to rebuild it"

try:  # the fast path; the numpy path below computes the same scores (TICKETREC_NO_NUMBA=1 forces it, for tests)
    if os.environ.get("TICKETREC_NO_NUMBA", "0") not in ("", "0"):
        raise ImportError("TICKETREC_NO_NUMBA is set")
    import numba

    _term_score = numba.njit(nogil=True, cache=True, inline="always")(term_score)  # bm25.py's own function

    @numba.njit(nogil=True, cache=True)
    def _accumulate(ptr, rows, tf, norm, term_ids, idfs, k1p1, acc, touched):  # pragma: no cover - compiled
        n_touched = 0
        for q in range(term_ids.shape[0]):
            t = term_ids[q]
            idf = idfs[q]
            for j in range(ptr[t], ptr[t + 1]):
                r = rows[j]
                f = tf[j]
                if acc[r] == 0.0:  # every contribution is > 0, so 0 means "not seen yet"
                    touched[n_touched] = r
                    n_touched += 1
                acc[r] += _term_score(idf, f, norm[r], k1p1)
        return n_touched

    @numba.njit(nogil=True, cache=True, inline="always")
    def _worse(s_a, r_a, s_b, r_b):  # pragma: no cover - compiled
        return s_a < s_b or (s_a == s_b and r_a > r_b)

    @numba.njit(nogil=True, cache=True)
    def _sift_down(heap_s, heap_r, i, m):  # pragma: no cover - compiled
        while True:
            left, worst = 2 * i + 1, i
            if left < m and _worse(heap_s[left], heap_r[left], heap_s[worst], heap_r[worst]):
                worst = left
            if left + 1 < m and _worse(heap_s[left + 1], heap_r[left + 1], heap_s[worst], heap_r[worst]):
                worst = left + 1
            if worst == i:
                return
            heap_s[i], heap_s[worst] = heap_s[worst], heap_s[i]
            heap_r[i], heap_r[worst] = heap_r[worst], heap_r[i]
            i = worst

    @numba.njit(nogil=True, cache=True)
    def _select_best(acc, touched, n_touched, k, heap_s, heap_r):  # pragma: no cover - compiled
        # the k best touched rows (score desc, row asc) in a heap whose root is the worst kept; zeroes acc again
        m = 0
        for i in range(n_touched):
            r = touched[i]
            s = acc[r]
            acc[r] = 0.0
            if m < k:
                heap_s[m], heap_r[m] = s, r
                j = m
                m += 1
                while j > 0:  # sift up
                    parent = (j - 1) // 2
                    if not _worse(heap_s[j], heap_r[j], heap_s[parent], heap_r[parent]):
                        break
                    heap_s[j], heap_s[parent] = heap_s[parent], heap_s[j]
                    heap_r[j], heap_r[parent] = heap_r[parent], heap_r[j]
                    j = parent
            elif _worse(heap_s[0], heap_r[0], s, r):
                heap_s[0], heap_r[0] = s, r
                _sift_down(heap_s, heap_r, 0, m)
        return m

    HAVE_NUMBA = True
except ImportError:  # numba missing, or TICKETREC_NO_NUMBA=1 (tests/test_no_numba.py runs this path)
    HAVE_NUMBA = False


# -- documents → terms ------------------------------------------------------------------------------------------
@dataclass
class ChunkTerms:
    """The postings of a chunk of tickets, with chunk-local term ids (merged by `PostingsBuilder.add`)."""

    terms: list[str]  # local term id → term
    docs: np.ndarray  # int32 [p]: position of the ticket in the chunk
    term_ids: np.ndarray  # int32 [p]: local term id
    tf: np.ndarray  # float32 [p]: weighted term frequency
    lengths: np.ndarray  # float32 [n]: tokens per ticket


def ticket_terms(tickets: Sequence[Ticket], weights: Sequence[float] = DEFAULT_WEIGHTS) -> ChunkTerms:
    """Weighted term frequencies and lengths of a chunk of tickets (runs in the encoding workers)."""
    local: dict[str, int] = {}
    docs: list[int] = []
    term_ids: list[int] = []
    tfs: list[float] = []
    lengths = np.zeros(len(tickets), dtype=np.float32)
    for i, ticket in enumerate(tickets):
        freq, lengths[i] = document_terms(ticket.subject, ticket.description, ticket.solution, weights)
        for term, f in freq.items():
            docs.append(i)
            term_ids.append(local.setdefault(term, len(local)))
            tfs.append(f)
    return ChunkTerms(list(local), np.asarray(docs, np.int32), np.asarray(term_ids, np.int32),
                      np.asarray(tfs, np.float32), lengths)


class PostingsBuilder:
    """Collects the postings of one index build (new chunks and rows reused from the previous version), then
    writes them term by term."""

    def __init__(self, n_rows: int, weights: Sequence[float] = DEFAULT_WEIGHTS):
        self.n_rows = n_rows
        self.weights = tuple(float(w) for w in weights)
        self.term_id: dict[str, int] = {}
        self.lengths = np.zeros(n_rows, dtype=np.float32)
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (rows, term ids, tf)

    def _global_ids(self, terms: Sequence[str]) -> np.ndarray:
        ids = self.term_id
        return np.fromiter((ids.setdefault(t, len(ids)) for t in terms), dtype=np.int32, count=len(terms))

    def add(self, rows: np.ndarray, chunk: ChunkTerms) -> None:
        """The postings of freshly tokenised tickets; `rows[i]` is the index row of the chunk's ticket i."""
        rows = np.asarray(rows, dtype=np.int32)
        mapping = self._global_ids(chunk.terms)
        self._parts.append((rows[chunk.docs], mapping[chunk.term_ids], chunk.tf))
        self.lengths[rows] = chunk.lengths

    def add_reused(self, prev: "Bm25Postings", new_row_of_prev: np.ndarray) -> None:
        """Copy the postings of the previous version's rows that the new version keeps (`new_row_of_prev[r]`
        is the new row of old row r, or -1 for a row that was dropped or is encoded again)."""
        if prev.weights != self.weights:
            raise IndexStateError(f"the previous index's BM25 weights {prev.weights} differ from {self.weights}; "
                                  "build without reuse (`ticketrec index --full`)")
        mapping = self._global_ids(prev.terms)
        kept_rows = np.flatnonzero(new_row_of_prev >= 0)
        self.lengths[new_row_of_prev[kept_rows]] = prev.length[kept_rows]
        step = 1 << 24  # bounded temporary memory at millions of postings
        for start in range(0, len(prev.rows), step):
            stop = min(len(prev.rows), start + step)
            old_rows = np.asarray(prev.rows[start:stop])
            new_rows = new_row_of_prev[old_rows]
            keep = new_rows >= 0
            terms = np.searchsorted(prev.ptr, np.arange(start, stop), side="right") - 1
            self._parts.append((new_rows[keep].astype(np.int32), mapping[terms[keep]], np.asarray(prev.tf[start:stop])[keep]))

    def write(self, directory: Path) -> dict:
        """Write the five files into `directory`; the statistics for the manifest."""
        n_terms = len(self.term_id)
        rows = np.concatenate([p[0] for p in self._parts]) if self._parts else np.zeros(0, np.int32)
        terms = np.concatenate([p[1] for p in self._parts]) if self._parts else np.zeros(0, np.int32)
        tf = np.concatenate([p[2] for p in self._parts]) if self._parts else np.zeros(0, np.float32)
        self._parts.clear()
        order = np.argsort(terms, kind="stable")  # rows stay in arrival order within a term
        ptr = np.zeros(n_terms + 1, dtype=np.int64)
        np.cumsum(np.bincount(terms, minlength=n_terms), out=ptr[1:])
        np.save(directory / "bm25_ptr.npy", ptr)
        np.save(directory / "bm25_rows.npy", rows[order])
        np.save(directory / "bm25_tf.npy", tf[order])
        np.save(directory / "bm25_length.npy", self.lengths)
        (directory / TERMS_FILE).write_text(json.dumps(list(self.term_id)), encoding="utf-8")
        return {"k1": BM25_K1, "b": BM25_B, "weights": list(self.weights), "n_terms": n_terms,
                "n_postings": int(len(rows)), "avgdl": float(self.lengths.mean()) if self.n_rows else 0.0}


# -- querying ---------------------------------------------------------------------------------------------------
class Bm25Postings:
    """The memory-mapped postings of one index version; `top_k` is the pre-filter."""

    def __init__(self, terms: list[str], arrays: dict[str, np.ndarray], stats: dict, max_terms: int = MAX_QUERY_TERMS):
        self.terms = terms
        self.term_id = {t: i for i, t in enumerate(terms)}
        self.ptr, self.rows, self.tf, self.length = (arrays[a] for a in ARRAYS)
        self.k1, self.b = float(stats["k1"]), float(stats["b"])
        self.weights = tuple(float(w) for w in stats["weights"])
        self.max_terms = max_terms
        self.n_docs = len(self.length)
        self.norm = length_norm(self.length, self.k1, self.b)
        self.df = np.diff(self.ptr)
        self._spare: list[tuple[np.ndarray, np.ndarray]] = []  # accumulators (all zeros) free for the next query
        self._spare_lock = threading.Lock()

    @contextmanager
    def _buffers(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """An accumulator (all zeros; zero it again before leaving) and a touched-row list, reused across queries
        and threads: a fresh 12 MB per query at a million tickets would cost thousands of page faults."""
        with self._spare_lock:
            buffers = self._spare.pop() if self._spare else None
        if buffers is None:
            buffers = (np.zeros(self.n_docs, dtype=np.float64), np.empty(self.n_docs, dtype=np.int32))
        try:
            yield buffers
        except BaseException:
            buffers[0].fill(0.0)
            raise
        finally:
            with self._spare_lock:
                self._spare.append(buffers)

    @classmethod
    def open(cls, directory: str | Path, stats: dict | None, n_rows: int) -> "Bm25Postings":
        """Open the postings of a version directory (memory-mapped); IndexStateError when missing or corrupt."""
        directory = Path(directory)
        if not stats:
            raise IndexStateError(f"index {directory} has no BM25 postings (built by an older ticketrec); {_RUN_INDEX}")
        try:
            terms = json.loads((directory / TERMS_FILE).read_text(encoding="utf-8"))
            arrays = {a: np.load(directory / f"bm25_{a}.npy", mmap_mode="r") for a in ARRAYS}
        except (OSError, ValueError) as exc:
            raise IndexStateError(f"the BM25 postings of index {directory} are missing or corrupt ({exc}); {_RUN_INDEX}") from exc
        ptr = arrays["ptr"]
        problems = []
        if ptr.shape != (len(terms) + 1,) or (len(ptr) and (ptr[0] != 0 or ptr[-1] != len(arrays["rows"]))):
            problems.append(f"bm25_ptr.npy has shape {ptr.shape} for {len(terms)} terms")
        if arrays["tf"].shape != arrays["rows"].shape:
            problems.append("bm25_tf.npy and bm25_rows.npy differ in length")
        if arrays["length"].shape != (n_rows,):
            problems.append(f"bm25_length.npy has shape {arrays['length'].shape}, not ({n_rows},)")
        if problems:
            raise IndexStateError(f"the BM25 postings of index {directory} are inconsistent ({'; '.join(problems)}); {_RUN_INDEX}")
        return cls(terms, arrays, stats)

    def params(self) -> dict:
        return {"backend": "index", "k1": self.k1, "b": self.b, "weights": dict(zip(FIELDS, self.weights)),
                "max_terms": self.max_terms, "tokenizer": "unicode61-like + porter (stop words dropped)"}

    def query_plan(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(term ids, IDFs) of the query's terms that the index holds, as FTS5 would weigh them (one per distinct
        query word; two words with one stem count twice, like two FTS5 phrases)."""
        def document_frequency(stem: str) -> int:
            return int(self.df[self.term_id[stem]]) if stem in self.term_id else 0

        stems = query_stems(text, document_frequency, self.n_docs, self.max_terms)
        ids = [self.term_id[s] for s in stems if s in self.term_id]
        ids = [i for i in ids if self.df[i] > 0]
        return np.asarray(ids, np.int64), np.asarray([idf(int(self.df[i]), self.n_docs) for i in ids], np.float64)

    def scores(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(rows, BM25 scores) of every row holding at least one query term, in no particular order."""
        term_ids, idfs = self.query_plan(text)
        if len(term_ids) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        if HAVE_NUMBA:
            with self._buffers() as (acc, touched):
                n = _accumulate(self.ptr, self.rows, self.tf, self.norm, term_ids, idfs, self.k1 + 1.0, acc, touched)
                rows = touched[:n].astype(np.int64)
                scores = acc[rows]
                acc[rows] = 0.0
            return rows, scores
        acc = np.zeros(self.n_docs, dtype=np.float64)  # without numba
        for t, idf_t in zip(term_ids, idfs):
            sl = slice(int(self.ptr[t]), int(self.ptr[t + 1]))
            r, f = np.asarray(self.rows[sl]), np.asarray(self.tf[sl], np.float64)
            np.add.at(acc, r, term_score(idf_t, f, self.norm[r], self.k1 + 1.0))
        rows = np.flatnonzero(acc)
        return rows, acc[rows]

    def top_k(self, text: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best rows for `text` and their BM25 scores, best first (ties: lower row first, like FTS5's
        rowid order); empty arrays when no query word is indexed."""
        if k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        if HAVE_NUMBA:  # accumulate and select in compiled code: no array of all matching rows is made
            term_ids, idfs = self.query_plan(text)
            if len(term_ids) == 0:
                return np.zeros(0, np.int64), np.zeros(0, np.float64)
            heap_s, heap_r = np.empty(k, np.float64), np.empty(k, np.int32)
            with self._buffers() as (acc, touched):
                n = _accumulate(self.ptr, self.rows, self.tf, self.norm, term_ids, idfs, self.k1 + 1.0, acc, touched)
                m = _select_best(acc, touched, n, k, heap_s, heap_r)
            rows, scores = heap_r[:m].astype(np.int64), heap_s[:m]
            order = np.lexsort((rows, -scores))
            return rows[order], scores[order]
        rows, scores = self.scores(text)  # without numba
        if len(rows) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        if len(rows) > k:
            part = np.argpartition(-scores, k - 1)[:k]
            threshold = scores[part].min()
            above = np.flatnonzero(scores > threshold)
            tied = np.flatnonzero(scores == threshold)
            tied = tied[np.argsort(rows[tied], kind="stable")][: k - len(above)]
            keep = np.concatenate([above, tied])
            rows, scores = rows[keep], scores[keep]
        order = np.lexsort((rows, -scores))
        return rows[order], scores[order]

    def score_rows(self, text: str, rows: Iterable[int]) -> np.ndarray:
        """BM25 of `text` against the given rows (0.0 for a row that shares no term)."""
        rows = np.asarray(list(rows), dtype=np.int64)
        all_rows, all_scores = self.scores(text)
        dense = np.zeros(self.n_docs, dtype=np.float64)
        dense[all_rows] = all_scores
        return dense[rows]
