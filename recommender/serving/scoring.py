"""The multi-channel Manhattan metric over precomputed ticket matrices, vectorised over candidate rows.

    d(q, t) = Σ_(a,b,V) V · Σ_c W_c · ‖q[a.c] − t[b.c]‖₁  +  W_bm25 · (1 − lexical(q, t))
    g(q, t) = exp(−d(q, t))

lexical(q, t) = bm25(q, t) / max over the knowledge base of bm25(q, ·) is the one lexical feature of
`recommender.lexical.bm25`; the BM25 pre-filter's top K holds that maximum, so it is the candidates' maximum
(or `bm25_max`, given by a caller that scores one shard of the candidates).

Exhaustive scoring is memory-bandwidth bound: every ticket matrix is read once, and each row is compared with
all the query vectors it pairs with while it is in cache. With numba (a fused, SIMD-compiled loop) that runs
close to the speed of a plain `numpy.sum` over the same matrices; without numba a chunked numpy path gives the
same numbers, more slowly.

float16 index versions are read as they are stored: the compiled kernel widens each half-precision value to
float32 in registers (LLVM's `fpext`, F16C/AVX-512 instructions where the CPU has them), so a float16 record costs
half the bytes and no copy; the sums are float32 either way, so a float16 version's d equals float32 scoring of
the float16-rounded vectors. Candidate rows are visited in ascending order (one sort of K row numbers), walking
the memory map forwards (no measurable gain over the BM25 order when the pages are in memory; a paged-out index's
candidates are prefetched together, `prefetch_rows`).
"""
from __future__ import annotations

import ctypes
import functools
import logging
import mmap
import os
import time
from collections.abc import Mapping

import numpy as np

from ..lexical.bm25 import lexical_feature

log = logging.getLogger(__name__)

EncodedBatch = Mapping[str, np.ndarray]

#: Rows per block on the numpy path (bounds the temporary buffers to a few MB).
CHUNK_ROWS = 2048
#: Candidate rows of a memory-mapped index whose pages are checked (mincore) at most every RESIDENCY_INTERVAL
#: seconds; while one is not in memory, the pages of every query's candidates are requested at once (madvise
#: WILLNEED), so their reads overlap instead of faulting one by one (`prefetch_rows`).
RESIDENCY_SAMPLE = 8
RESIDENCY_INTERVAL = 1.0
MADV_WILLNEED = 3

try:  # the fast path; numba is optional, the numpy path below is the reference (TICKETREC_NO_NUMBA=1 forces it)
    if os.environ.get("TICKETREC_NO_NUMBA", "0") not in ("", "0"):
        raise ImportError("TICKETREC_NO_NUMBA is set")
    import numba
    from llvmlite import ir
    from numba.core import types
    from numba.extending import intrinsic

    @intrinsic
    def _widen(typingctx, value):  # pragma: no cover - compiled
        """A stored value as float32: float32 as is; uint16 holding IEEE half-precision bits (a float16 index read
        through a uint16 view: numba has no float16 type) widened exactly by LLVM's fpext."""
        if value == types.float32:
            return types.float32(value), lambda context, builder, sig, args: args[0]
        if value == types.uint16:
            def codegen(context, builder, sig, args):
                return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
            return types.float32(value), codegen
        return None

    @numba.njit(fastmath=True, nogil=True, cache=True)
    def _l1_packed(mat, rows, term_off, term_dim, q_off, q_flat, term_w, out):  # pragma: no cover - compiled
        # every term (a ticket segment × one query vector) of row rows[i] while its one record is in cache;
        # 1-d slices keep the inner loop contiguous, so LLVM vectorises it (float32 or float16 bits, see _widen)
        for i in range(rows.shape[0]):
            record = mat[rows[i]]
            total = np.float32(0.0)
            for t in range(term_off.shape[0]):
                segment = record[term_off[t] : term_off[t] + term_dim[t]]
                query = q_flat[q_off[t] : q_off[t] + term_dim[t]]
                acc = np.float32(0.0)
                for j in range(segment.shape[0]):
                    acc += abs(_widen(segment[j]) - query[j])
                total += term_w[t] * acc
            out[i] += total

    HAVE_NUMBA = True
except ImportError:  # numba missing, or TICKETREC_NO_NUMBA=1 (tests/test_no_numba.py runs this path)
    HAVE_NUMBA = False


class PackedVectors(Mapping):
    """All of a ticket's vectors in one row of one matrix ([n, Σ dims], usually memory-mapped), read like a dict
    of column views ("SUB.h" → [n, 50]).

    A candidate's vectors are one contiguous record, so scoring K scattered candidates touches about two pages
    each instead of one page per key: fewer page faults and TLB misses at a million tickets.
    """

    def __init__(self, matrix: np.ndarray, dims: Mapping[str, int]):
        self.matrix = matrix
        #: When the candidates' pages were last checked (`_prefetch_if_paged_out`), and whether some were not in
        #: memory then (the candidates are prefetched until the next check).
        self.residency_checked = float("-inf")
        self.paged_out = False
        self.dims = {key: int(d) for key, d in dims.items()}
        self.offsets: dict[str, int] = {}
        offset = 0
        for key, dim in self.dims.items():
            self.offsets[key] = offset
            offset += dim
        if matrix.ndim != 2 or matrix.shape[1] != offset:
            raise ValueError(f"a packed matrix for {self.dims} needs {offset} columns, not shape {matrix.shape}")

    def __getitem__(self, key: str) -> np.ndarray:
        start = self.offsets[key]
        return self.matrix[:, start : start + self.dims[key]]

    def __iter__(self):
        return iter(self.dims)

    def __len__(self) -> int:
        return len(self.dims)

    @classmethod
    def pack(cls, vectors: Mapping[str, np.ndarray]) -> "PackedVectors":
        """A packed copy of separate matrices (score many queries against the copy, not the dict)."""
        return cls(np.concatenate([np.asarray(m) for m in vectors.values()], axis=1), {k: m.shape[1] for k, m in vectors.items()})

    def row_slice(self, start: int, stop: int) -> "PackedVectors":
        """The same columns for rows [start, stop) only (a view)."""
        return PackedVectors(self.matrix[start:stop], self.dims)


def metric_plan(spec: dict, query_vecs: EncodedBatch, ticket_keys) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Group the metric by ticket matrix: ticket key → (query vectors [m, d] float32, weights V·W_c [m]).

    Raises ValueError when the spec names a channel the query or the tickets lack.
    """
    ticket_keys = set(ticket_keys)
    grouped: dict[str, list[tuple[np.ndarray, float]]] = {}
    for a, b, v in spec["pairs"]:
        for channel, w in spec["channels"].items():
            weight = float(v) * float(w)
            if weight == 0.0:
                continue
            qkey, tkey = f"{a}.{channel}", f"{b}.{channel}"
            if qkey not in query_vecs:
                raise ValueError(f"the query vectors lack {qkey!r}, which the metric uses")
            if tkey not in ticket_keys:
                raise ValueError(f"the ticket vectors lack {tkey!r}, which the metric uses")
            q = np.asarray(query_vecs[qkey], dtype=np.float32)
            if q.ndim == 2:
                if q.shape[0] != 1:
                    raise ValueError(f"score_candidates scores one query; {qkey!r} has {q.shape[0]} rows")
                q = q[0]
            grouped.setdefault(tkey, []).append((q, weight))
    return {
        key: (np.ascontiguousarray(np.stack([q for q, _ in items])), np.array([w for _, w in items], np.float32))
        for key, items in grouped.items()
    }


def _distances_numpy(mat: np.ndarray, rows: np.ndarray | None, queries: np.ndarray, weights: np.ndarray,
                     out: np.ndarray) -> None:
    m = out.shape[0]
    buf = np.empty((min(CHUNK_ROWS, max(m, 1)), mat.shape[1]), np.float32)
    for start in range(0, m, CHUNK_ROWS):
        stop = min(m, start + CHUNK_ROWS)
        block = mat[start:stop] if rows is None else mat[rows[start:stop]]
        b = buf[: stop - start]
        for q, w in zip(queries, weights):
            np.subtract(block, q, out=b, dtype=np.float32, casting="unsafe")
            np.abs(b, out=b)
            out[start:stop] += w * b.sum(axis=1, dtype=np.float32)


def kernel_terms(packed: PackedVectors, plan: dict) -> tuple:
    """The compiled kernel's term arguments for a plan: each term's offset and width in a packed record, its query
    vector's offset in the concatenated query vectors, those vectors (float32) and the terms' weights."""
    term_off, term_dim, q_off, term_w, q_parts = [], [], [], [], []
    cursor = 0
    for key, (queries, weights) in plan.items():
        for q, w in zip(queries, weights):
            term_off.append(packed.offsets[key])
            term_dim.append(packed.dims[key])
            q_off.append(cursor)
            term_w.append(w)
            q_parts.append(q)
            cursor += q.shape[0]
    return (np.asarray(term_off, np.int64), np.asarray(term_dim, np.int64), np.asarray(q_off, np.int64),
            np.concatenate(q_parts).astype(np.float32), np.asarray(term_w, np.float32))


def _distances_packed(packed: PackedVectors, plan: dict, rows: np.ndarray | None, out: np.ndarray) -> None:
    """All of the metric's terms row by row over a packed matrix (numba), one record per candidate."""
    args = kernel_terms(packed, plan)
    if rows is not None:
        _prefetch_if_paged_out(packed, rows)
    mat = np.asarray(packed.matrix)  # a memmap becomes a plain ndarray view (no copy)
    if mat.dtype == np.float16:
        mat = mat.view(np.uint16)  # read as stored: the kernel widens the half-precision bits (_widen)
    elif mat.dtype != np.float32:
        mat = np.ascontiguousarray(mat, dtype=np.float32)
    if rows is None:
        _l1_packed(mat, np.arange(out.shape[0], dtype=np.int64), *args, out)
        return
    order = np.argsort(rows, kind="stable")  # ascending rows: the map walked forwards (see the module docstring)
    part = np.zeros(out.shape[0], np.float32)
    _l1_packed(mat, rows[order], *args, part)
    out[order] += part


@functools.lru_cache(maxsize=1)
def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _row_pages(matrix: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(page-aligned start address of each row, bytes from there to the row's end) of a C-contiguous matrix."""
    width = matrix.shape[1] * matrix.itemsize
    starts = np.asarray(matrix).ctypes.data + rows.astype(np.int64) * width
    aligned = starts - starts % mmap.PAGESIZE
    return aligned, starts + width - aligned


def rows_resident(matrix: np.ndarray, rows: np.ndarray) -> bool | None:
    """Whether every page of these rows of a memory-mapped matrix is in memory now (mincore(2)); None where the
    system cannot say."""
    aligned, lengths = _row_pages(matrix, rows)
    pages = -(-lengths // mmap.PAGESIZE)
    vec = np.zeros(int(pages.max()) if len(rows) else 1, np.uint8)
    out = ctypes.c_void_p(vec.ctypes.data)
    try:
        mincore = _libc().mincore
        for address, length, n in zip(aligned.tolist(), lengths.tolist(), pages.tolist()):
            if mincore(ctypes.c_void_p(address), ctypes.c_size_t(length), out):
                return None
            if not (vec[:n] & 1).all():
                return False
    except (OSError, AttributeError):
        return None
    return True


def prefetch_rows(matrix: np.ndarray, rows: np.ndarray) -> None:
    """Ask the kernel to read the pages of these rows now, all at once (madvise(2) MADV_WILLNEED, asynchronous).

    For an index whose pages are not in memory, scoring 1,000 scattered candidates of 1M float16 rows took 1.4 s
    faulting them in one by one and 15 ms after this call (`benchmarks/serving.py --kernel 1000000`)."""
    aligned, lengths = _row_pages(matrix, np.unique(rows))
    try:
        madvise = _libc().madvise
        for address, length in zip(aligned.tolist(), lengths.tolist()):
            madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), MADV_WILLNEED)
    except (OSError, AttributeError):
        pass


def _prefetch_if_paged_out(packed: "PackedVectors", rows: np.ndarray) -> None:
    """`prefetch_rows` while the pages of a memory-mapped index are not all in memory (too large to be loaded at
    open, or evicted since): a sample of the candidates is checked at most every RESIDENCY_INTERVAL seconds (a check
    costs about as much as scoring 100 rows), and the answer stands until the next check."""
    matrix = packed.matrix
    if not isinstance(matrix, np.memmap) or len(rows) == 0:
        return
    now = time.monotonic()
    if now - packed.residency_checked >= RESIDENCY_INTERVAL:
        packed.residency_checked = now
        sample = rows[np.linspace(0, len(rows) - 1, min(len(rows), RESIDENCY_SAMPLE)).astype(np.int64)]
        packed.paged_out = rows_resident(matrix, sample) is False
    if packed.paged_out:
        prefetch_rows(matrix, rows)


def _checked_rows(rows, n_total: int) -> np.ndarray:
    """`rows` as contiguous int64, every one inside [0, n_total)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= n_total):
        raise IndexError(f"candidate rows must lie in [0, {n_total}); got {rows.min()}..{rows.max()}")
    return rows


def _accumulate(ticket_vecs, plan: dict, rows, out: np.ndarray, fast: bool) -> None:
    """Add the plan's weighted L1 terms to `out`: record by record with numba on packed vectors (`fast`), else
    matrix by matrix with numpy."""
    if fast:
        _distances_packed(ticket_vecs, plan, rows, out)
    else:
        for key, (queries, weights) in plan.items():
            _distances_numpy(ticket_vecs[key], rows, queries, weights, out)


def distances(spec: dict, query_vecs: EncodedBatch, ticket_vecs: Mapping[str, np.ndarray], rows=None,
              bm25=None, *, bm25_max: float | None = None, use_numba: bool | None = None) -> np.ndarray:
    """d(q, t) for one query against the ticket rows `rows` (all rows when None), float32 [len(rows)].

    `ticket_vecs` is a `PackedVectors` (scored record by record with numba) or a dict of matrices, which the numba
    path packs first: a caller that scores many queries should pack once (`PackedVectors.pack`)."""
    plan = metric_plan(spec, query_vecs, ticket_vecs.keys())
    w_bm25 = float(spec.get("bm25", 0.0) or 0.0)
    if not plan and not w_bm25:
        raise ValueError("the metric spec has no pair/channel with a non-zero weight and no BM25 weight")
    if not ticket_vecs.keys():
        raise ValueError("there are no ticket vectors to score")
    # a weight selection may keep BM25 alone (every channel at 0): then d is the lexical term only
    n_total = next(iter(ticket_vecs[k] for k in (plan or ticket_vecs.keys()))).shape[0]
    if rows is not None:
        rows = _checked_rows(rows, n_total)
    m = n_total if rows is None else rows.shape[0]
    out = np.zeros(m, np.float32)
    fast = HAVE_NUMBA if use_numba is None else (use_numba and HAVE_NUMBA)
    for key, (queries, weights) in plan.items():
        mat = ticket_vecs[key]
        if mat.shape[0] != n_total:
            raise ValueError(f"ticket matrix {key!r} has {mat.shape[0]} rows, expected {n_total}")
        if mat.shape[1] != queries.shape[1]:
            raise ValueError(f"{key!r}: ticket vectors are {mat.shape[1]}-d, query vectors {queries.shape[1]}-d")
    if plan:
        if fast and not isinstance(ticket_vecs, PackedVectors):
            ticket_vecs = PackedVectors.pack({key: ticket_vecs[key] for key in plan})
        _accumulate(ticket_vecs, plan, rows, out, fast)
    if w_bm25 and bm25 is not None:
        out += w_bm25 * bm25_penalty(bm25, m, bm25_max)
    return out


def bm25_penalty(bm25, m: int, bm25_max: float | None = None) -> np.ndarray:
    """1 − lexical: lexical = bm25 / `bm25_max` (default: the maximum of `bm25`, the candidates'), float32
    (1 for every ticket when no BM25 score is positive)."""
    scores = np.asarray(bm25, dtype=np.float32)
    if scores.shape != (m,):
        raise ValueError(f"bm25 must have one score per candidate ({m}), got shape {scores.shape}")
    top = float(scores.max(initial=0.0)) if bm25_max is None else float(bm25_max)
    return (1.0 - lexical_feature(scores, top, np.float32)).astype(np.float32)


def score_candidates(spec: dict, query_vecs: EncodedBatch, ticket_vecs: Mapping[str, np.ndarray], rows=None,
                     bm25=None, *, bm25_max: float | None = None, use_numba: bool | None = None) -> np.ndarray:
    """g(q, t) = exp(−d(q, t)) ∈ (0, 1] for one encoded query against many ticket rows (no loop over tickets).

    `rows` selects candidate rows of the ticket matrices (all when None); `bm25` gives their BM25 scores in
    the same order, normalised by their maximum (or by `bm25_max`, when a caller scores one shard of a larger
    candidate set). Without `bm25` the lexical term is left out, as in `TicketModel.score_pairs` without `lexical`.
    """
    d = distances(spec, query_vecs, ticket_vecs, rows, bm25, bm25_max=bm25_max, use_numba=use_numba)
    return np.exp(-d, out=d)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k highest scores, best first (argpartition, then a sort of only those k)."""
    scores = np.asarray(scores)
    n = scores.shape[0]
    if k <= 0 or n == 0:
        return np.empty(0, np.int64)
    if k >= n:
        return np.argsort(-scores, kind="stable")
    part = np.argpartition(-scores, k - 1)[:k]
    return part[np.argsort(-scores[part], kind="stable")]


def rank(spec: dict, query_vecs: EncodedBatch, ticket_vecs: Mapping[str, np.ndarray], k: int, rows=None, bm25=None,
         *, row_range: tuple[int, int] | None = None, bm25_max: float | None = None,
         use_numba: bool | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The k best tickets as (global rows, g, their bm25 or None), best first.

    `rows`/`bm25`: the BM25 candidates; with `rows` None every row is scored and `bm25` (when given) holds one
    score per row of the index. `row_range` = [start, stop) restricts scoring to one shard of the index; the BM25
    normalisation still uses the maximum over all candidates (or `bm25_max`).
    """
    if rows is not None:
        rows = np.asarray(rows, dtype=np.int64)
        bm25 = None if bm25 is None else np.asarray(bm25, dtype=np.float32)
        if bm25 is not None and bm25_max is None:
            bm25_max = float(bm25.max(initial=0.0))
        if row_range is not None:
            keep = (rows >= row_range[0]) & (rows < row_range[1])
            rows = rows[keep]
            bm25 = None if bm25 is None else bm25[keep]
        g = score_candidates(spec, query_vecs, ticket_vecs, rows, bm25, bm25_max=bm25_max, use_numba=use_numba)
        best = top_k(g, k)
        return rows[best], g[best], None if bm25 is None else bm25[best]
    start, stop = (0, next(iter(ticket_vecs.values())).shape[0]) if row_range is None else row_range
    view = (ticket_vecs.row_slice(start, stop) if isinstance(ticket_vecs, PackedVectors)
            else {key: mat[start:stop] for key, mat in ticket_vecs.items()})
    if bm25 is not None:  # one score per index row: the lexical feature over the whole index
        bm25 = np.asarray(bm25, dtype=np.float32)
        if bm25_max is None:
            bm25_max = float(bm25.max(initial=0.0))
        bm25 = bm25[start:stop]
    g = score_candidates(spec, query_vecs, view, bm25=bm25, bm25_max=bm25_max, use_numba=use_numba)
    best = top_k(g, k)
    return best.astype(np.int64) + start, g[best], None if bm25 is None else bm25[best]


def channel_distances(spec: dict, query_vecs: EncodedBatch, ticket_vecs: Mapping[str, np.ndarray], rows,
                      bm25=None, *, bm25_max: float | None = None,
                      use_numba: bool | None = None) -> dict[str, np.ndarray]:
    """Each channel's weighted part of d(q, t) for the ticket rows `rows`: channel → float32 [len(rows)].

    Channels are the spec's ("h", "E", "T", "S": Σ_(a,b,V) V·W_c·‖q[a.c] − t[b.c]‖₁) and "bm25" (W_bm25·(1 − lexical),
    present only when the lexical term is, i.e. W_bm25 > 0 and `bm25` given, as in `distances`); a channel whose
    weight is 0 is left out. The same kernels as `distances`, one channel at a time, so the channels sum to
    `distances(...)` for the same arguments (up to float32 rounding).
    """
    plan = metric_plan(spec, query_vecs, ticket_vecs.keys())
    n_total = (ticket_vecs.matrix if isinstance(ticket_vecs, PackedVectors) else next(iter(ticket_vecs.values()))).shape[0]
    rows = _checked_rows(rows, n_total)
    by_channel: dict[str, dict] = {}
    for key, (queries, weights) in plan.items():
        if ticket_vecs[key].shape[1] != queries.shape[1]:
            raise ValueError(f"{key!r}: ticket vectors are {ticket_vecs[key].shape[1]}-d, "
                             f"query vectors {queries.shape[1]}-d")
        by_channel.setdefault(key.split(".", 1)[1], {})[key] = (queries, weights)
    fast = isinstance(ticket_vecs, PackedVectors) and (HAVE_NUMBA if use_numba is None else (use_numba and HAVE_NUMBA))
    m = rows.shape[0]
    out: dict[str, np.ndarray] = {}
    for channel, sub_plan in by_channel.items():
        out[channel] = np.zeros(m, np.float32)
        _accumulate(ticket_vecs, sub_plan, rows, out[channel], fast)
    w_bm25 = float(spec.get("bm25", 0.0) or 0.0)
    if w_bm25 and bm25 is not None:
        out["bm25"] = (w_bm25 * bm25_penalty(bm25, m, bm25_max)).astype(np.float32)
    return out


def channel_shares(result: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> list[dict[str, float]]:
    """Why each result was chosen, as each channel's share of what sets it apart from the typical candidate.

    `result` / `reference`: `channel_distances` of the results and of a sample of the query's scored candidates.
    gain_c = median of the reference's d_c − the result's d_c (how much closer the result is than the typical
    candidate in channel c; d is a sum over channels, so the gains add up to the result's lead in −log g over a
    candidate that is typical in every channel). Share_c = max(gain_c, 0) / Σ max(gain, 0); every share is 0 when
    the result is no closer than typical in any channel. One dict (channel → share) per result row (none when
    `result` has no channel).
    """
    names = list(result)
    if not names:
        return []
    d = np.stack([np.asarray(result[c], np.float64) for c in names], axis=1)  # [k, C]
    typical = np.array([float(np.median(reference[c])) if len(reference[c]) else 0.0 for c in names])
    gain = np.maximum(typical[None, :] - d, 0.0)
    total = gain.sum(axis=1, keepdims=True)
    shares = np.divide(gain, total, out=np.zeros_like(gain), where=total > 0)
    return [{c: float(s) for c, s in zip(names, row)} for row in shares]
