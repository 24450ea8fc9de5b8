"""The compiled loops of the postings' top k (`postings.Bm25Postings.top_k`, `scores`): numba, without the GIL.

Block-max MaxScore (`top_k_maxscore`): the rows are cut into windows of `window` rows (`postings.WINDOW`). In each
window every query term gets an upper bound, the largest block maximum of its blocks in the window; once k rows are
held, the terms whose bounds sum to less than the k-th score θ are *non-essential*: a row holding only those cannot
enter, so only the essential terms' postings are added into a window-sized accumulator (term at a time), and each row
found there looks the non-essential terms up (binary search in the window's slice) only while its score plus their
remaining bounds can still pass θ; a window whose bounds sum below θ is skipped. Ties go to the lower row; the result is
exactly the exhaustive top k (the sums are exact). `accumulate` adds every matching row into one accumulator and
`select_best` heaps the k best of it (the reference and `scores`).

Every array and parameter comes from the caller (`postings.py` holds the constants and the files); `HAVE_NUMBA` is
False when numba is missing or TICKETREC_NO_NUMBA=1, and the caller then takes its numpy path.
"""
from __future__ import annotations

import os

import numpy as np

try:  # the fast path; the caller's numpy path computes the same scores (TICKETREC_NO_NUMBA=1 forces it, for tests)
    if os.environ.get("TICKETREC_NO_NUMBA", "0") not in ("", "0"):
        raise ImportError("TICKETREC_NO_NUMBA is set")
    import numba

    @numba.njit(nogil=True, cache=True)
    def accumulate(ptr, rows, impact, term_ids, acc, touched):  # pragma: no cover - compiled
        n_touched = 0
        for q in range(term_ids.shape[0]):
            t = term_ids[q]
            for j in range(ptr[t], ptr[t + 1]):
                r = np.uint64(rows[np.uint64(j)])  # unsigned: no wraparound check (see top_k_maxscore)
                if acc[r] == 0.0:  # every impact is > 0, so 0 means "not seen yet"
                    touched[np.uint64(n_touched)] = r
                    n_touched += 1
                acc[r] += impact[np.uint64(j)]
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
    def _offer(heap_s, heap_r, m, k, s, r):  # pragma: no cover - compiled
        """Offer row r with score s to the heap of the k best (root: the worst kept); the new size."""
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

    @numba.njit(nogil=True, cache=True)
    def select_best(acc, touched, n_touched, k, heap_s, heap_r):  # pragma: no cover - compiled
        # the k best touched rows (score desc, row asc); zeroes acc again
        m = 0
        for i in range(n_touched):
            r = touched[i]
            s = acc[r]
            acc[r] = 0.0
            if m < k or _worse(heap_s[0], heap_r[0], s, r):  # most rows lose to the worst kept: no call
                m = _offer(heap_s, heap_r, m, k, s, r)
        return m

    @numba.njit(nogil=True, cache=True)
    def _first_at_least(rows, lo, hi, row):  # pragma: no cover - compiled
        """The first position in [lo, hi) whose row is ≥ `row` (hi when none): rows ascend there."""
        while lo < hi:
            mid = (lo + hi) >> 1
            if rows[mid] < row:
                lo = mid + 1
            else:
                hi = mid
        return lo

    @numba.njit(nogil=True, cache=True, fastmath=True)
    def _largest(acc, lo, hi):  # pragma: no cover - compiled
        """max(acc[lo:hi]), at least 0 (fastmath: a vectorised reduction; a maximum is exact in any order)."""
        m = 0.0
        for r in range(lo, hi):
            m = max(m, acc[r])
        return m

    @numba.njit(nogil=True, cache=True)
    def _shrink(buf_s, buf_r, n, k):  # pragma: no cover - compiled
        """Keep the k best of the n buffered rows (offered in ascending row order, so a tie keeps the earlier
        one), in order; (the new count, the k-th best score: a row must now score above it to enter)."""
        theta = np.partition(buf_s[:n].copy(), n - k)[n - k]
        above = 0
        for x in range(n):
            above += buf_s[x] > theta
        ties = k - above
        kept = 0
        for x in range(n):
            s = buf_s[x]
            if s > theta or (s == theta and ties > 0):
                ties -= s == theta
                buf_s[kept] = s
                buf_r[kept] = buf_r[x]
                kept += 1
        return kept, theta

    #: The lowest set bit of a 32-bit word x ≠ 0: _DEBRUIJN_POS[((x & -x) * _DEBRUIJN) >> 27 & 31] (no overflow)
    _DEBRUIJN = 0x077CB531
    _DEBRUIJN_POS = np.zeros(32, np.int64)
    for _i in range(32):
        _DEBRUIJN_POS[((1 << _i) * _DEBRUIJN >> 27) & 31] = _i

    # The hot loops index with unsigned integers: numba then skips its negative-index wraparound check there.
    @numba.njit(nogil=True, cache=True)
    def top_k_maxscore(ptr, rows, impact, bptr, bmax, blast, term_ids, n_docs, k, window, block, prune, dense_at,
                        retry, buf_s, buf_r, acc, mark, seen, cand):  # pragma: no cover - compiled
        """Block-max MaxScore over windows of rows (see the module's docstring; `prune` False: every matching row is
        scored, the reference). Rows are offered in ascending order into a buffer of at least 2k, shrunk to the k
        best when full; returns how many it holds (at least the k best; the caller sorts them). `acc` and `mark`
        (float64 [window], zeros), `seen` (int64 [window / 32], zeros) and `cand` (int32 [window]) are scratch space,
        handed back with the zeros restored."""
        debruijn_pos = _DEBRUIJN_POS
        n_q = term_ids.shape[0]
        cap = buf_s.shape[0]
        pos = np.empty(n_q, np.int64)  # no posting before it is in the current window or after
        end = np.empty(n_q, np.int64)
        blk = np.empty(n_q, np.int64)  # the first block whose last row is in the current window or after
        bend = np.empty(n_q, np.int64)
        first = np.empty(n_q, np.int64)  # block b of the term starts at posting first + (b - b0) * block
        b0 = np.empty(n_q, np.int64)
        for i in range(n_q):
            t = term_ids[i]
            pos[i], end[i], first[i] = ptr[t], ptr[t + 1], ptr[t]
            blk[i], bend[i], b0[i] = bptr[t], bptr[t + 1], bptr[t]
        ub = np.zeros(n_q, np.float64)
        last = np.empty(n_q, np.int64)
        seg = np.empty(n_q, np.int64)  # the term's first posting in the window
        essential = np.ones(n_q, np.bool_)
        lookup = np.empty(n_q, np.int64)  # the non-essential terms with postings in the window, largest bound first
        # acc: the window's scores; mark: 1.0 for a candidate row, else 0.0 (a multiplier: no branch); seen: bit r & 31
        # of word r >> 5 says row ws + r has a score in acc; cand: the candidate rows
        n = 0  # rows in the buffer
        theta = -1.0  # a row enters only when it scores above θ (all rows before it have lower row numbers)
        full = False  # θ is the k-th best score so far
        rest_windows = 0  # windows left before the terms are split again
        backoff = retry  # the next pause (doubled after each pause in a row)
        for ws in range(0, n_docs, window):
            we = min(ws + window, n_docs)
            total = 0.0
            for i in range(n_q):  # each term's bound in the window: the largest maximum of its blocks there
                b = blk[i]
                while b < bend[i] and blast[b] < ws:
                    b += 1
                blk[i] = b
                u = 0.0
                # block b may hold rows of the window when the block before it ends before the window's last row
                # (its first row, read only for the term's first block, is later): no read of the postings here
                while b < bend[i] and (blast[b - 1] + 1 < we if b > b0[i] else rows[first[i]] < we):
                    if not prune:
                        u = 1.0  # any posting in the window
                    elif bmax[b] > u:
                        u = bmax[b]
                    if blast[b] >= we:
                        break
                    b += 1
                last[i] = b  # the window's last posting of the term is before the end of this block
                ub[i] = u
                total += u
            if full and total <= theta:
                continue  # no row of this window can enter
            n_ne = 0
            ne_total = 0.0
            if full and rest_windows > 0:
                rest_windows -= 1
            if full and rest_windows == 0:  # non-essential: the smallest bounds, as long as their sum stays at most θ
                order = np.argsort(ub)
                for j in range(n_q):
                    i = order[j]
                    essential[i] = ub[i] > 0.0 and ne_total + ub[i] > theta
                    if ub[i] > 0.0 and not essential[i]:
                        ne_total += ub[i]
                for j in range(n_q - 1, -1, -1):
                    i = order[j]
                    if ub[i] > 0.0 and not essential[i]:
                        lookup[n_ne] = i
                        n_ne += 1
            else:
                for i in range(n_q):
                    essential[i] = ub[i] > 0.0
            n_post = 0
            for i in range(n_q):  # the essential terms' slices of the window
                p = first[i] + (blk[i] - b0[i]) * block
                if pos[i] > p:
                    p = pos[i]
                if not essential[i]:
                    pos[i] = p  # positioned at its first look-up, if any
                    seg[i] = p
                    continue
                p = _first_at_least(rows, p, min(end[i], p + block), ws)
                seg[i] = p
                pos[i] = _first_at_least(rows, p, min(end[i], first[i] + (last[i] - b0[i] + 1) * block), we)
                n_post += pos[i] - p
            dense = 2 * n_post >= we - ws  # then read the whole accumulator, else only the rows marked in `seen`
            for i in range(n_q):  # add them, term at a time
                if essential[i]:
                    if dense:
                        for q in range(seg[i], pos[i]):
                            acc[np.uint64(rows[np.uint64(q)] - ws)] += impact[np.uint64(q)]
                    else:
                        for q in range(seg[i], pos[i]):
                            r = rows[np.uint64(q)] - ws
                            acc[np.uint64(r)] += impact[np.uint64(q)]
                            seen[r >> 5] |= np.int64(1) << (r & 31)
            # the rows that may still pass θ with the non-essential terms, ascending (kept without branches);
            # θ − Σ bounds is exact (sums of impacts), and a row with a score is > 0
            low_bar = max(theta - ne_total, 0.0)
            n_c = 0
            if dense:
                for g in range(0, we - ws, 64):  # groups of 64 rows: most have no row above the bar once θ is high
                    top = min(g + 64, we - ws)
                    if _largest(acc, g, top) > low_bar:
                        for r in range(g, top):
                            ur = np.uint64(r)
                            s = acc[ur]
                            keep = s > low_bar
                            cand[np.uint64(n_c)] = r
                            n_c += keep
                            mark[ur] = keep
                            acc[ur] = s * keep
                    else:
                        acc[g:top] = 0.0
            else:
                for w in range(seen.shape[0]):
                    bits = seen[w]
                    seen[w] = 0
                    while bits != 0:
                        low = bits & -bits
                        bits ^= low
                        r = (w << 5) + debruijn_pos[((low * 0x077CB531) >> 27) & 31]
                        s = acc[r]
                        keep = s > low_bar
                        cand[n_c] = r
                        n_c += keep
                        mark[r] = keep
                        acc[r] = s * keep
            if n_ne > 0 and dense_at * n_c >= we - ws:  # dense candidates: splitting does not pay for a while
                rest_windows = backoff
                backoff *= 2
            elif n_ne > 0:
                backoff = retry
            rest = ne_total
            for j in range(n_ne):  # add the non-essential terms to the candidates, largest bound first
                if n_c == 0:
                    break
                i = lookup[j]
                q = _first_at_least(rows, seg[i], min(end[i], seg[i] + block), ws)
                e = _first_at_least(rows, q, min(end[i], first[i] + (last[i] - b0[i] + 1) * block), we)
                pos[i] = e
                if dense_at * n_c >= e - q:  # many candidates for its postings: add every posting to the marked rows
                    for p in range(q, e):
                        r = np.uint64(rows[np.uint64(p)] - ws)
                        acc[r] += impact[np.uint64(p)] * mark[r]
                else:  # few: gallop from candidate to candidate
                    for x in range(n_c):
                        row = ws + cand[x]
                        if q < e and rows[q] < row:
                            step = 1
                            while q + step < e and rows[q + step] < row:
                                q += step
                                step <<= 1
                            q = _first_at_least(rows, q + 1, min(q + step, e), row)
                        if q >= e:
                            break
                        if rows[q] == row:
                            acc[cand[x]] += impact[q]
                rest -= ub[i]
                if dense_at * n_c < we - ws:  # few candidates: drop those that can no longer pass θ
                    kept = 0
                    for x in range(n_c):
                        r = cand[x]
                        keep = acc[r] + rest > theta
                        cand[kept] = r
                        kept += keep
                        mark[r] = keep
                        acc[r] *= keep
                    n_c = kept
            for x in range(n_c):
                r = cand[x]
                s = acc[r]
                acc[r] = 0.0
                mark[r] = 0.0
                if s > theta:
                    if n == cap:
                        n, theta = _shrink(buf_s, buf_r, n, k)
                        full = prune  # the bounds are real: skip with them
                        if s <= theta:
                            continue
                    buf_s[n] = s
                    buf_r[n] = ws + r
                    n += 1
        return n

    HAVE_NUMBA = True
except ImportError:  # numba missing, or TICKETREC_NO_NUMBA=1 (tests/test_no_numba.py runs this path)
    HAVE_NUMBA = False
    accumulate = select_best = top_k_maxscore = None  # the caller takes its numpy path
