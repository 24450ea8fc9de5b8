"""BM25 postings stored in every index version: the embedded pre-filter that stays fast at a million tickets.

FTS5 answers an OR query by scoring, one row at a time, every ticket that holds any query term, so a query of
common words costs hundreds of milliseconds at 100k tickets. Here each index version carries an inverted index
over exactly the tickets of its vectors (same rows), with every posting's BM25 *impact* computed at build time
(eager scoring, as bm25s does), and `top_k` skips what cannot reach the k best (block-max MaxScore, below).

The score is the one BM25 of `bm25.py` (FTS5's `bm25()` formula, field weights, IDF over the version's tickets):
the impacts are `bm25.impacts` of the version's document frequencies and lengths, float32 values whose sums are
exact in float64, so a version's postings score bit for bit like a `Bm25Scorer` over the same tickets, whatever
order the terms are added in. Stop words are counted in |d| but get no postings (no query holds them). The term
frequencies are kept too: an incremental build copies them and computes the impacts again with the new version's
IDF and average length. Files of a version directory:

    bm25_terms.json   the terms; a term's id is its position
    bm25_ptr.npy      int64 [T + 1]: term t's postings are [ptr[t], ptr[t+1]), rows ascending
    bm25_rows.npy     int32 [P]: the index rows holding the term
    bm25_impact.npy   float32 [P]: the posting's BM25 impact (`bm25.impacts`)
    bm25_tf.npy       float32 [P]: its weighted term frequency f(t, d)
    bm25_length.npy   float32 [N]: every row's length |d| in tokens
    bm25_bmax.npy     float32 [B]: the largest impact of each block of BLOCK postings of a term (block-max)
    bm25_blast.npy    int32 [B]: the last row of each block (term t's blocks are [bptr[t], bptr[t+1]),
                      bptr = cumulative ceil(df / BLOCK))

Versions written before the impacts (no "impacts" in the manifest's bm25 statistics, only ptr, rows, tf and
length) are still opened: their impacts and blocks are computed in memory at open (`Bm25Postings.open`).

Top k (`top_k`): block-max MaxScore over windows of WINDOW rows, exactly the exhaustive top k, in compiled loops
(`postings_kernels.py`, whose docstring tells how it skips). Without numba (`TICKETREC_NO_NUMBA=1`) numpy scores every
matching row.
"""
from __future__ import annotations

import json
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterable, Iterator, Sequence

import numpy as np

from ..data.records import Ticket
from ..errors import IndexStateError
from .analyzer import MAX_QUERY_TERMS, fts5_stem
from .analyzer import query_terms as text_terms  # (not the method `Bm25Postings.query_terms`)
from .bm25 import (BM25_B, BM25_K1, DEFAULT_WEIGHTS, FIELDS, MIN_IDF, document_terms, idf, impacts, length_norm,
                   query_stems)
from .postings_kernels import HAVE_NUMBA, accumulate, select_best, top_k_maxscore

TERMS_FILE = "bm25_terms.json"
#: The arrays of a version, each in bm25_<name>.npy.
ARRAYS = ("ptr", "rows", "impact", "tf", "length", "bmax", "blast")
#: The arrays of a version written before the impacts (opened by computing the rest in memory).
LEGACY_ARRAYS = ("ptr", "rows", "tf", "length")
#: Postings per block of the block maxima.
BLOCK = 128
#: Rows per window of `top_k` (its accumulator and candidate marks: 256 KiB, in the L2 cache; 4096 and 65536 rows
#: measured slower at 100k and 1M tickets, docs/results/bm25.md).
WINDOW = 16384
#: A non-essential term is added to every candidate of a window by reading all its postings there when it has
#: fewer than DENSE postings per candidate (else by galloping), and candidates are pruned between terms only when
#: they are fewer than one in DENSE rows of the window (0: always gallop and prune).
DENSE = 8
#: After a window whose candidates were dense (one in DENSE rows or more), the next RETRY windows add every term
#: (the bounds still skip whole windows; twice as many after each such window in a row): splitting the terms would
#: cost more than it saves there.
RETRY = 8
#: `top_k` keeps up to 2k + BUFFER_SLACK rows before it shrinks them to the k best (and from then on skips).
BUFFER_SLACK = 64
#: How `top_k` selects: "auto" (the default: "maxscore" from SKIP_FROM_ROWS rows on, else "windowed"); block-max
#: MaxScore; the same windows without skipping; every matching row added into one accumulator and heaped (the
#: reference). All return the same rows and scores.
METHODS = ("auto", "maxscore", "windowed", "exhaustive")
#: Below this many rows (8 windows) skipping costs more than it saves: the k-th score is known only after the first
#: windows (measured at 20k, 100k and 1M tickets: docs/results/bm25.md).
SKIP_FROM_ROWS = 8 * 16384
#: What the manifest's bm25 statistics say about the impacts (absent: a version written before them).
IMPACTS = "float32, sums exact in float64 (bm25.impacts)"
#: Postings sorted per step of `PostingsBuilder.write` (bounds its memory: about 80 bytes each at the peak).
WRITE_STEP = 1 << 20
#: A posting as `PostingsBuilder` spills it to disk until `write`.
_SPILL = np.dtype([("term", "<i4"), ("row", "<i4"), ("tf", "<f4")])
_RUN_INDEX = "run `ticketrec index --full` to rebuild it"



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


def block_pointers(df: np.ndarray, block: int) -> np.ndarray:
    """bptr (int64 [T + 1]): term t's blocks are [bptr[t], bptr[t+1]), ceil(df[t] / block) of them."""
    out = np.zeros(len(df) + 1, np.int64)
    np.cumsum(-(-np.asarray(df, np.int64) // block), out=out[1:])
    return out


def _sorted_with_impacts(terms: np.ndarray, rows: np.ndarray, tf: np.ndarray, ptr: np.ndarray, t0: int, t1: int,
                         idfs: np.ndarray, norm: np.ndarray, k1p1: float, block: int):
    """The postings of terms [t0, t1) (`terms` global ids, any order) sorted by (term, row), with their impacts and
    the block maxima and last rows of those terms: (rows, impact, tf, bmax, blast)."""
    base = int(ptr[t0])
    order = np.argsort((terms.astype(np.int64) - t0) * (len(norm) + 1) + rows, kind="stable")
    terms, rows, tf = terms[order], rows[order], tf[order]
    imp = impacts(idfs[terms], tf, norm[rows], k1p1)
    df = np.diff(ptr[t0 : t1 + 1])
    nb = -(-df // block)
    first_block = np.repeat(ptr[t0:t1] - base, nb)  # each block's term's first posting (local)
    within = np.arange(int(nb.sum()), dtype=np.int64) - np.repeat(np.cumsum(nb) - nb, nb)
    starts = first_block + within * block
    stops = np.minimum(starts + block, np.repeat(ptr[t0 + 1 : t1 + 1] - base, nb))
    bmax = np.maximum.reduceat(imp, starts) if len(starts) else np.zeros(0, np.float32)
    return rows, imp, tf, bmax.astype(np.float32), rows[stops - 1] if len(stops) else np.zeros(0, np.int32)


class _NpyWriter:
    """A 1-d .npy file written piece by piece (the header first, with the final length)."""

    def __init__(self, path: Path, dtype, length: int):
        self.file = open(path, "wb")
        self.dtype, self.length, self.written = np.dtype(dtype), length, 0
        np.lib.format.write_array_header_1_0(self.file, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                         "fortran_order": False, "shape": (length,)})

    def write(self, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        self.file.write(arr.tobytes())
        self.written += len(arr)

    def close(self) -> None:
        self.file.close()
        if self.written != self.length:
            raise AssertionError(f"{self.file.name}: wrote {self.written} of {self.length} values")


class PostingsBuilder:
    """Collects the postings of one index build (new chunks and rows reused from the previous version) in
    temporary files, then writes them term by term: memory stays bounded whatever the number of tickets (the
    rows' lengths, the vocabulary, and WRITE_STEP postings at a time)."""

    def __init__(self, n_rows: int, weights: Sequence[float] = DEFAULT_WEIGHTS, workdir: str | Path | None = None):
        self.n_rows = n_rows
        self.weights = tuple(float(w) for w in weights)
        self.term_id: dict[str, int] = {}
        self.lengths = np.zeros(n_rows, dtype=np.float32)
        self._df = np.zeros(1024, np.int64)
        self._workdir = None if workdir is None else str(workdir)
        self._spill: IO[bytes] | None = None  # the postings so far, as _SPILL records (an unlinked file)
        self.n_postings = 0

    def _global_ids(self, terms: Sequence[str]) -> np.ndarray:
        ids = self.term_id
        return np.fromiter((ids.setdefault(t, len(ids)) for t in terms), dtype=np.int32, count=len(terms))

    def _append(self, terms: np.ndarray, rows: np.ndarray, tf: np.ndarray) -> None:
        if self._spill is None:
            self._spill = tempfile.TemporaryFile(prefix="bm25-", dir=self._workdir)
        if len(self.term_id) > len(self._df):
            self._df = np.concatenate([self._df, np.zeros(max(len(self.term_id), 2 * len(self._df)) - len(self._df), np.int64)])
        self._df[: len(self.term_id)] += np.bincount(terms, minlength=len(self.term_id))
        records = np.empty(len(terms), _SPILL)
        records["term"], records["row"], records["tf"] = terms, rows, tf
        self._spill.write(records.tobytes())
        self.n_postings += len(terms)

    def add(self, rows: np.ndarray, chunk: ChunkTerms) -> None:
        """The postings of freshly tokenised tickets; `rows[i]` is the index row of the chunk's ticket i."""
        rows = np.asarray(rows, dtype=np.int32)
        mapping = self._global_ids(chunk.terms)
        self._append(mapping[chunk.term_ids], rows[chunk.docs], chunk.tf)
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
        step = 1 << 22  # bounded temporary memory at millions of postings
        for start in range(0, len(prev.rows), step):
            stop = min(len(prev.rows), start + step)
            new_rows = new_row_of_prev[np.asarray(prev.rows[start:stop])]
            keep = new_rows >= 0
            terms = np.searchsorted(prev.ptr, np.arange(start, stop), side="right") - 1
            self._append(mapping[terms[keep]], new_rows[keep], np.asarray(prev.tf[start:stop])[keep])

    def _buckets(self, bounds: np.ndarray) -> Iterator[np.ndarray]:
        """The spilled postings of each term range [bounds[j], bounds[j+1]), one range at a time: read whole when
        there is one range, else first split into one temporary file per range (one pass, WRITE_STEP at a time)."""
        spill, self._spill = self._spill, None
        if spill is None:
            yield from (np.zeros(0, _SPILL) for _ in bounds[1:])
            return
        with spill:
            spill.seek(0)
            if len(bounds) == 2:
                yield np.fromfile(spill, _SPILL)
                return
            parts = [tempfile.TemporaryFile(prefix="bm25-", dir=self._workdir) for _ in bounds[1:]]
            try:
                while True:
                    records = np.fromfile(spill, _SPILL, count=WRITE_STEP)
                    if not len(records):
                        break
                    which = np.searchsorted(bounds, records["term"], side="right") - 1
                    order = np.argsort(which, kind="stable")
                    cuts = np.searchsorted(which[order], np.arange(len(parts) + 1))
                    for j, part in enumerate(parts):
                        if cuts[j + 1] > cuts[j]:
                            part.write(records[order[cuts[j] : cuts[j + 1]]].tobytes())
                spill.close()
                for part in parts:
                    part.seek(0)
                    yield np.fromfile(part, _SPILL)
                    part.close()
            finally:
                for part in parts:
                    part.close()

    def write(self, directory: Path) -> dict:
        """Write the postings files into `directory` (term by term, WRITE_STEP postings at a time, each term's rows
        ascending, impacts from this version's IDF and lengths); the statistics for the manifest."""
        directory = Path(directory)
        n_terms, total = len(self.term_id), self.n_postings
        df = self._df[:n_terms].copy()
        ptr = np.zeros(n_terms + 1, dtype=np.int64)
        np.cumsum(df, out=ptr[1:])
        block = BLOCK
        bptr = block_pointers(df, block)
        norm = length_norm(self.lengths, BM25_K1, BM25_B)
        idfs = np.array([idf(int(d), self.n_rows) for d in df], np.float64)  # the scalar idf, as Bm25Scorer
        np.save(directory / "bm25_ptr.npy", ptr)
        np.save(directory / "bm25_length.npy", self.lengths)
        writers = {name: _NpyWriter(directory / f"bm25_{name}.npy", dtype, n)
                   for name, dtype, n in (("rows", np.int32, total), ("impact", np.float32, total),
                                          ("tf", np.float32, total), ("bmax", np.float32, int(bptr[-1])),
                                          ("blast", np.int32, int(bptr[-1])))}
        bounds = [0]  # ranges of terms with at most WRITE_STEP postings each (or one longer term)
        while bounds[-1] < n_terms:
            t0 = bounds[-1]
            bounds.append(min(n_terms, max(t0 + 1, int(np.searchsorted(ptr, ptr[t0] + WRITE_STEP, side="right")) - 1)))
        try:
            for t0, t1, records in zip(bounds, bounds[1:], self._buckets(np.asarray(bounds, np.int64))):
                rows, imp, tf, bmax, blast = _sorted_with_impacts(records["term"], records["row"], records["tf"], ptr,
                                                                  t0, t1, idfs, norm, BM25_K1 + 1.0, block)
                for name, arr in (("rows", rows), ("impact", imp), ("tf", tf), ("bmax", bmax), ("blast", blast)):
                    writers[name].write(arr)
        finally:
            for w in writers.values():
                w.file.close()
            if self._spill is not None:
                self._spill.close()
                self._spill = None
        for w in writers.values():
            w.close()
        (directory / TERMS_FILE).write_text(json.dumps(list(self.term_id)), encoding="utf-8")
        return {"k1": BM25_K1, "b": BM25_B, "weights": list(self.weights), "n_terms": n_terms,
                "n_postings": int(total), "avgdl": float(self.lengths.mean()) if self.n_rows else 0.0,
                "impacts": IMPACTS, "block": block}


def postings_files(stats: dict | None) -> tuple[str, ...]:
    """The memory-mapped postings files of a version whose manifest has these bm25 statistics."""
    names = ARRAYS if stats and stats.get("impacts") else LEGACY_ARRAYS
    return tuple(f"bm25_{a}.npy" for a in names)


# -- querying ---------------------------------------------------------------------------------------------------
class Bm25Postings:
    """The memory-mapped postings of one index version; `top_k` is the pre-filter."""

    def __init__(self, terms: list[str], arrays: dict[str, np.ndarray], stats: dict, max_terms: int = MAX_QUERY_TERMS):
        self.terms = terms
        self.term_id = {t: i for i, t in enumerate(terms)}
        self.ptr, self.rows, self.impact, self.tf, self.length, self.bmax, self.blast = (arrays[a] for a in ARRAYS)
        self.k1, self.b = float(stats["k1"]), float(stats["b"])
        self.weights = tuple(float(w) for w in stats["weights"])
        self.max_terms = max_terms
        self.n_docs = len(self.length)
        self.df = np.diff(self.ptr)
        self.block = int(stats.get("block", BLOCK))
        self.bptr = block_pointers(self.df, self.block)
        self._df_of = {t: d for t, d in zip(terms, self.df.tolist()) if d > 0}  # stem → document frequency
        self._spare: list[tuple[np.ndarray, np.ndarray]] = []  # accumulators (all zeros) free for the next query
        self._scratch: list[tuple[np.ndarray, ...]] = []  # the same for the windows of `top_k`
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

    @contextmanager
    def _window_scratch(self) -> Iterator[tuple[np.ndarray, ...]]:
        """Scratch space of `top_k_maxscore` for WINDOW rows (zeros where it needs them; it leaves them so),
        reused across queries and threads like `_buffers`."""
        with self._spare_lock:
            scratch = self._scratch.pop() if self._scratch else None
        if scratch is None or len(scratch[0]) != WINDOW:
            scratch = (np.zeros(WINDOW, np.float64), np.zeros(WINDOW, np.float64),
                       np.zeros((WINDOW + 31) >> 5, np.int64), np.empty(WINDOW, np.int32))
        try:
            yield scratch
        except BaseException:
            for arr in scratch:
                arr.fill(0)
            raise
        finally:
            with self._spare_lock:
                self._scratch.append(scratch)

    @classmethod
    def open(cls, directory: str | Path, stats: dict | None, n_rows: int) -> "Bm25Postings":
        """Open the postings of a version directory (memory-mapped); IndexStateError when missing or corrupt. A
        version written before the impacts gets them (and its blocks) computed in memory."""
        directory = Path(directory)
        if not stats:
            raise IndexStateError(f"index {directory} has no BM25 postings (built by an older ticketrec); {_RUN_INDEX}")
        legacy = not stats.get("impacts")
        try:
            terms = json.loads((directory / TERMS_FILE).read_text(encoding="utf-8"))
            arrays = {a: np.load(directory / f"bm25_{a}.npy", mmap_mode="r") for a in (LEGACY_ARRAYS if legacy else ARRAYS)}
        except (OSError, ValueError) as exc:
            raise IndexStateError(f"the BM25 postings of index {directory} are missing or corrupt ({exc}); {_RUN_INDEX}") from exc
        ptr = arrays["ptr"]
        problems = []
        if ptr.shape != (len(terms) + 1,) or (len(ptr) and (ptr[0] != 0 or ptr[-1] != len(arrays["rows"]))):
            problems.append(f"bm25_ptr.npy has shape {ptr.shape} for {len(terms)} terms")
        for name in ("tf", "impact"):
            if name in arrays and arrays[name].shape != arrays["rows"].shape:
                problems.append(f"bm25_{name}.npy and bm25_rows.npy differ in length")
        if arrays["length"].shape != (n_rows,):
            problems.append(f"bm25_length.npy has shape {arrays['length'].shape}, not ({n_rows},)")
        if not legacy and not problems:
            blocks = int(block_pointers(np.diff(ptr), int(stats.get("block", BLOCK)))[-1])
            if arrays["bmax"].shape != (blocks,) or arrays["blast"].shape != (blocks,):
                problems.append(f"bm25_bmax.npy or bm25_blast.npy do not have {blocks} blocks")
        if problems:
            raise IndexStateError(f"the BM25 postings of index {directory} are inconsistent ({'; '.join(problems)}); {_RUN_INDEX}")
        if legacy:
            stats = {**stats, "block": BLOCK}
            arrays = _with_impacts(arrays, stats)
        return cls(terms, arrays, stats)

    def hot_arrays(self) -> tuple[np.ndarray, ...]:
        """The arrays queries read (a serving process maps their pages in at open: `TicketIndex.warm`)."""
        return self.ptr, self.rows, self.impact, self.bmax, self.blast

    def params(self) -> dict:
        return {"backend": "index", "k1": self.k1, "b": self.b, "weights": dict(zip(FIELDS, self.weights)),
                "max_terms": self.max_terms, "tokenizer": "unicode61-like + porter (stop words dropped)"}

    def query_terms(self, text: str) -> np.ndarray:
        """The term ids of the query's terms that the index holds (one per distinct query word; two words with one
        stem count twice, like two FTS5 phrases)."""
        stems = query_stems(text, lambda stem: self._df_of.get(stem, 0), self.n_docs, self.max_terms)
        term_id = self.term_id
        return np.fromiter((term_id[s] for s in stems if s in self._df_of), np.int64)

    def word_idf(self, word: str) -> float:
        """A word's IDF as BM25 weighs it over these tickets: its rarest term's (to BM25 "mozilla/5.0" is the terms
        mozilla, 5 and 0), `MIN_IDF` when every term of it is in half the tickets or more, or is a stop word."""
        return max((idf(self._df_of.get(fts5_stem(t), 0), self.n_docs) for t in text_terms(word)), default=MIN_IDF)

    def query_plan(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(term ids, IDFs) of the query's terms that the index holds, as FTS5 would weigh them."""
        ids = self.query_terms(text)
        return ids, np.asarray([idf(int(self.df[i]), self.n_docs) for i in ids], np.float64)

    def scores(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(rows, BM25 scores) of every row holding at least one query term, in no particular order."""
        term_ids = self.query_terms(text)
        if len(term_ids) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        if HAVE_NUMBA:
            with self._buffers() as (acc, touched):
                n = accumulate(self.ptr, self.rows, self.impact, term_ids, acc, touched)
                rows = touched[:n].astype(np.int64)
                scores = acc[rows]
                acc[rows] = 0.0
            return rows, scores
        acc = np.zeros(self.n_docs, dtype=np.float64)  # without numba
        for t in term_ids:
            sl = slice(int(self.ptr[t]), int(self.ptr[t + 1]))
            acc[np.asarray(self.rows[sl])] += np.asarray(self.impact[sl], np.float64)  # a term's rows are distinct
        rows = np.flatnonzero(acc)
        return rows, acc[rows]

    def top_k(self, text: str, k: int, method: str = "auto") -> tuple[np.ndarray, np.ndarray]:
        """The k best rows for `text` and their BM25 scores, best first (ties: lower row first, like FTS5's
        rowid order); empty arrays when no query word is indexed. `method`: one of METHODS; the same answer with
        each."""
        if k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        if method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
        if method == "auto":
            method = "maxscore" if self.n_docs >= SKIP_FROM_ROWS else "windowed"
        if HAVE_NUMBA:  # select in compiled code: no array of all matching rows is made
            term_ids = self.query_terms(text)
            if len(term_ids) == 0:
                return np.zeros(0, np.int64), np.zeros(0, np.float64)
            k = min(k, self.n_docs)
            if method == "exhaustive":
                heap_s, heap_r = np.empty(k, np.float64), np.empty(k, np.int32)
                with self._buffers() as (acc, touched):
                    n = accumulate(self.ptr, self.rows, self.impact, term_ids, acc, touched)
                    m = select_best(acc, touched, n, k, heap_s, heap_r)
            else:
                cap = 2 * k + BUFFER_SLACK
                heap_s, heap_r = np.empty(cap, np.float64), np.empty(cap, np.int32)
                with self._window_scratch() as scratch:
                    m = top_k_maxscore(self.ptr, self.rows, self.impact, self.bptr, self.bmax, self.blast, term_ids,
                                        self.n_docs, k, WINDOW, self.block, method == "maxscore", DENSE, RETRY, heap_s,
                                        heap_r, *scratch)
            rows, scores = heap_r[:m].astype(np.int64), heap_s[:m]
            order = np.lexsort((rows, -scores))[:k]
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


def _with_impacts(arrays: dict[str, np.ndarray], stats: dict) -> dict[str, np.ndarray]:
    """The arrays of a version written before the impacts, completed in memory: each term's postings sorted by
    row (an incremental build appended reused rows after new ones), impacts and blocks."""
    ptr = np.asarray(arrays["ptr"])
    length = np.asarray(arrays["length"])
    df = np.diff(ptr)
    n_docs = len(length)
    terms = np.repeat(np.arange(len(df), dtype=np.int32), df)
    idfs = np.array([idf(int(d), n_docs) for d in df], np.float64)
    norm = length_norm(length, float(stats["k1"]), float(stats["b"]))
    rows, imp, tf, bmax, blast = _sorted_with_impacts(terms, np.asarray(arrays["rows"]), np.asarray(arrays["tf"]), ptr,
                                                      0, len(df), idfs, norm, float(stats["k1"]) + 1.0, int(stats["block"]))
    out = {"ptr": ptr, "rows": rows, "impact": imp, "tf": tf, "length": length, "bmax": bmax, "blast": blast}
    for arr in out.values():
        arr.flags.writeable = False  # like the memory maps: the same compiled kernels serve both
    return out
