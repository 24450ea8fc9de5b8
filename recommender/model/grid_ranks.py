"""Per-query reciprocal ranks of many channel weightings at once: the inner loop of the label-free weight selection.

For one pair weighting the selection ranks the same query-view distances under every channel weighting and BM25
weight of its grid (`weight_selection.grid_results`, 959 of them for the default's grid), each time summing the
channels, adding BM25 and counting, per query, the views at or below the own view's distance. numpy does that with
a pass over every [queries × views] array per weighting and is bound by memory bandwidth (33 of the 65 minutes of
label-free training at 4,000 tickets, docs/results/training-scaling.md). The compiled kernel takes one query's
views at a time, a block of them in cache for every weighting, and stops counting once more than k views rank at
or above the own one (the reciprocal rank is then 0 whatever follows).

Both paths add the same float64 terms in the same order (the channels from the first, then the BM25 term), so they
give bit-for-bit the same ranks, ties included (`tests/test_grid_ranks.py`); `TICKETREC_NO_NUMBA=1` forces the
numpy path, the reference.
"""
from __future__ import annotations

import os

import numpy as np

#: The ranks that count: 1/rank within the top MRR_K, else 0 (MRR@10).
MRR_K = 10
#: Views per block of the compiled kernel: one block of channel sums (float64) stays in the first-level cache.
BLOCK = 512

try:  # the fast path; numba is optional (TICKETREC_NO_NUMBA=1 forces the numpy reference below)
    if os.environ.get("TICKETREC_NO_NUMBA", "0") not in ("", "0"):
        raise ImportError("TICKETREC_NO_NUMBA is set")
    import numba

    @numba.njit(nogil=True, cache=True)
    def _ranks_compiled(per_channel, lexical, truth, weights, active, k, out):  # pragma: no cover - compiled
        # per_channel [C, Q, N] f8, lexical [B, Q, N], weights [J, C] f8, active [J, B];
        # out [active combinations, Q], rows in order (j, b)
        n_channels, n_queries, n_views = per_channel.shape
        n_bm25 = lexical.shape[0]
        base = np.empty(BLOCK)
        own = np.empty(n_bm25)
        count = np.empty(n_bm25, np.int64)
        for q in range(n_queries):
            t = truth[q]
            row = 0
            for j in range(weights.shape[0]):
                own_base = 0.0
                for c in range(n_channels):
                    own_base += per_channel[c, q, t] * weights[j, c]
                left = 0
                for b in range(n_bm25):
                    own[b] = own_base + lexical[b, q, t]
                    count[b] = 0
                    left += active[j, b]
                for start in range(0, n_views, BLOCK):
                    stop = min(start + BLOCK, n_views)
                    for n in range(stop - start):
                        base[n] = 0.0
                    for c in range(n_channels):
                        w = weights[j, c]
                        channel = per_channel[c, q, start:stop]
                        for n in range(stop - start):
                            base[n] += channel[n] * w
                    for b in range(n_bm25):
                        if not active[j, b] or count[b] > k:
                            continue
                        terms = lexical[b, q, start:stop]
                        above = own[b]
                        found = 0
                        for n in range(stop - start):  # a local sum: LLVM vectorises the comparison
                            found += base[n] + terms[n] <= above
                        count[b] += found
                        if count[b] > k:
                            left -= 1
                    if left == 0:
                        break
                for b in range(n_bm25):
                    if active[j, b]:
                        out[row, q] = 1.0 / count[b] if count[b] <= k else 0.0
                        row += 1

    HAVE_NUMBA = True
except ImportError:  # numba missing, or TICKETREC_NO_NUMBA=1
    HAVE_NUMBA = False


def reciprocal_ranks(d: np.ndarray, truth: np.ndarray, k: int = MRR_K) -> np.ndarray:
    """1/rank of column truth[i] in row i of distances d [Q, N] when within the top k, else 0 (smaller distance
    is better; ties count against it)."""
    own = d[np.arange(len(truth)), truth]
    rank = (d <= own[:, None]).sum(1)  # the own view counts itself: rank ≥ 1
    return np.where(rank <= k, 1.0 / rank, 0.0)


def weighting_ranks(per_channel: np.ndarray, lexical: np.ndarray, truth: np.ndarray, weights: np.ndarray,
                    active: np.ndarray, k: int, use_numba: bool | None = None) -> np.ndarray:
    """[R, Q] per-query 1/rank (within the top k, else 0) of the own view `truth` [Q] under each active weighting.

    `per_channel` [C, Q, N] float64: each channel's distance (pair weights applied); `weights` [J, C] float64: the
    channel weightings; `lexical` [B, Q, N]: the BM25 term each of B BM25 weights adds (zeros for weight 0: adding
    0.0 changes no sum); `active` [J, B] bool: the combinations ranked, rows of the result in order (j, then b).
    Compiled when numba is there (`use_numba=None`), else numpy: the same values either way."""
    per_channel = np.ascontiguousarray(per_channel, np.float64)
    weights = np.ascontiguousarray(weights, np.float64)
    active = np.ascontiguousarray(active, np.bool_)
    truth = np.ascontiguousarray(truth, np.int64)
    out = np.empty((int(active.sum()), per_channel.shape[1]))
    if HAVE_NUMBA if use_numba is None else (use_numba and HAVE_NUMBA):
        # float64 lexical terms: one compiled signature; widening a float32 term is exact, as numpy's add does it
        # (a no-op for the float64 terms `grid_results` passes)
        _ranks_compiled(per_channel, np.ascontiguousarray(lexical, np.float64), truth, weights, active, k, out)
        return out
    summed = np.empty(per_channel.shape[1:])
    with_bm25 = np.empty_like(summed)
    row = 0
    for j, w in enumerate(weights):
        np.einsum("cqn,c->qn", per_channel, w, out=summed)
        for b in np.flatnonzero(active[j]):
            out[row] = reciprocal_ranks(np.add(summed, lexical[b], out=with_bm25), truth, k)
            row += 1
    return out
