"""The one BM25 of ticketrec, and the lexical feature of the metric.

Every lexical score is this function: the postings of an index version (`postings.py`: the serving pre-filter)
and the in-memory `Bm25Scorer` below (training, feedback fine-tuning, `ticketrec evaluate`) compute it with the
same code. It is SQLite FTS5's `bm25()` (fts5_aux.c), whose formula and defaults it copies:

    bm25(q, d) = Σ_t IDF(t) · f(t,d)·(k1 + 1) / (f(t,d) + k1·(1 − b + b·|d| / avgdl))
    f(t,d)     = Σ_fields weight · count of t in the field      (subject 2, description 1, solution 1)
    |d|        = tokens of all three fields, stop words included; avgdl = mean |d| over the knowledge base
    IDF(t)     = ln((N − n(t) + 0.5) / (n(t) + 0.5)), or 1e-6 where that is ≤ 0
                 (N tickets in the knowledge base, n(t) of them holding t)
    k1 = 1.2, b = 0.75

Each term's share IDF(t)·f·(k1 + 1)/(f + …) is used as the float32 *impact* every path stores or adds (`impacts`):
the float64 value rounded to float32 (relative error ≤ 2⁻²⁴ ≈ 6e-8), and a share below 2⁻¹⁸ (only terms at the
IDF floor reach that) to a multiple of 2⁻⁴¹ (absolute error ≤ 2⁻⁴² ≈ 2.3e-13; at least one step, so a shared term
always counts). Every impact is then a multiple of 2⁻⁴¹ below 2⁶, so a sum of up to 64 of them (MAX_QUERY_TERMS)
is exact in float64: a ticket's score does not depend on the order its terms are added, equal scores are equal
bits, and the postings (which store the impacts at build time and may add them in any order while skipping) score
bit for bit like `Bm25Scorer`.

The terms t are the query's distinct words (`analyzer.query_terms`: FTS5's unicode61 split, stop words dropped;
at most `MAX_QUERY_TERMS` of them, chosen by `select_terms`), each reduced to its Porter stem
(`analyzer.fts5_stem`); two words with one stem count twice, like two FTS5 phrases.

The lexical feature the metric weighs by W_bm25 (d += W_bm25 · (1 − lexical)) is

    lexical(q, t) = bm25(q, t) / max_{t' ∈ KB} bm25(q, t')      (0 for every t when no ticket shares a term)

with N, n(t) and avgdl taken over the knowledge base KB the query is scored against: the index version's tickets
when serving, the training knowledge base (training and dev tickets) when training, the evaluated split's
tickets in `ticketrec evaluate`. The pre-filter's top K (K ≥ 1) always holds that maximum, so serving divides by
its best candidate; with K = 0 it scores the whole index. FTS5 itself (`Fts5Searcher`) and Elasticsearch stem
and count on their own, so their scores differ from these (`benchmarks/lexical_agreement.py` measures by how much).
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Callable, Mapping, Sequence

import numpy as np

from .analyzer import MAX_QUERY_TERMS, STOP_WORDS, fts5_stem, query_terms, term_tokens

#: BM25 parameters. FTS5's bm25() hard-codes these; the Elasticsearch backend sets them explicitly to match.
BM25_K1, BM25_B = 1.2, 0.75
#: The three ticket fields, in the order of their weights.
FIELDS = ("subject", "description", "solution")
#: Field weights (subject, description, solution). The subject is short and says what the ticket is about, so a
#: match there counts double; description and solution count once (both carry the problem's words).
DEFAULT_WEIGHTS: tuple[float, float, float] = (2.0, 1.0, 1.0)
#: The IDF of a term in half the tickets or more (FTS5's floor: such a term still counts, barely).
MIN_IDF = 1e-6


def idf(df: int, n_docs: int) -> float:
    """IDF(t) = ln((N − n + 0.5) / (n + 0.5)), floored at `MIN_IDF`."""
    x = math.log((n_docs - df + 0.5) / (df + 0.5))
    return x if x > 0 else MIN_IDF


def length_norm(lengths, k1: float = BM25_K1, b: float = BM25_B) -> np.ndarray:
    """k1·(1 − b + b·|d| / avgdl) of every document (float64), avgdl over these documents."""
    avgdl = float(np.mean(lengths, dtype=np.float64)) if len(lengths) else 1.0
    return k1 * (1.0 - b + b * np.asarray(lengths, np.float64) / max(avgdl, 1e-9))


def term_score(idf_t, f, norm, k1p1):
    """One term's share of bm25: IDF · f·(k1 + 1) / (f + norm). Plain arithmetic, so the postings compile this
    very function into their numba kernel and numpy applies it to arrays."""
    return idf_t * f * k1p1 / (f + norm)


#: Impacts below IMPACT_SMALL are rounded to multiples of IMPACT_GRID (the rest are float32, already on that grid).
IMPACT_SMALL, IMPACT_GRID = 2.0 ** -18, 2.0 ** -41


def impacts(idf_t, f, norm, k1p1) -> np.ndarray:
    """Each posting's stored share of bm25 (float32): `term_score` rounded to float32, and below IMPACT_SMALL to a
    multiple of IMPACT_GRID (at least one), so that sums of up to 64 impacts are exact in float64."""
    x = np.asarray(term_score(idf_t, np.asarray(f, np.float64), norm, k1p1), np.float64)
    out = x.astype(np.float32)
    small = x < IMPACT_SMALL
    if small.any():
        out[small] = (np.maximum(np.rint(x[small] / IMPACT_GRID), 1.0) * IMPACT_GRID).astype(np.float32)
    return out


def document_terms(subject: str, description: str, solution: str,
                   weights: Sequence[float] = DEFAULT_WEIGHTS) -> tuple[Counter, int]:
    """(stem → weighted term frequency f(t,d), length |d| in tokens) of one ticket; stop words count in |d|
    but get no frequency (no query holds them)."""
    freq: Counter = Counter()
    length = 0
    for text, weight in zip((subject, description, solution), weights):
        tokens = term_tokens(text)
        length += len(tokens)
        if weight:
            for token, count in Counter(tokens).items():  # each distinct word once
                if token not in STOP_WORDS:
                    freq[fts5_stem(token)] += weight * count
    return freq, length


def select_terms(counts: Counter, df: Mapping[str, int] | None, n_docs: int, limit: int = MAX_QUERY_TERMS) -> list[str]:
    """The `limit` words worth searching: all of them when few; otherwise those with the highest
    query-count × IDF (document frequencies `df` by word; words the index does not hold are dropped first).

    Without `df` (a backend that cannot tell) the most frequent words of the query win. Ties keep query order.
    """
    terms = list(counts)
    if len(terms) <= limit:
        return terms
    if df is None:
        weight = {t: float(counts[t]) for t in terms}
    else:
        weight = {t: counts[t] * idf(df.get(t, 0), n_docs) if df.get(t, 0) > 0 else -1.0 for t in terms}
    order = sorted(range(len(terms)), key=lambda i: (-weight[terms[i]], i))
    return [terms[i] for i in order[:limit] if weight[terms[i]] > 0] or [terms[i] for i in order[:limit]]


def query_stems(text: str, document_frequency: Callable[[str], int], n_docs: int,
                max_terms: int = MAX_QUERY_TERMS) -> list[str]:
    """The stems a query searches, one per kept distinct word, in query order (`document_frequency(stem)` is
    asked only when the query has more than `max_terms` words)."""
    counts = query_terms(text)
    if len(counts) > max_terms:
        df = {t: document_frequency(fts5_stem(t)) for t in counts}
        words = select_terms(counts, df, n_docs, max_terms)
    else:
        words = list(counts)
    return [fts5_stem(w) for w in words]


def lexical_feature(bm25, kb_max: float, dtype=np.float64) -> np.ndarray:
    """lexical = bm25 / (the query's maximum bm25 over the knowledge base); all 0 when that maximum is not > 0."""
    scores = np.asarray(bm25, dtype=dtype)
    if not kb_max > 0:
        return np.zeros_like(scores)
    return scores / dtype(kb_max)


class Bm25Scorer:
    """The one BM25 over a list of tickets held in memory (IDF and avgdl over exactly these tickets): what
    training and evaluation score with, bit for bit equal to an index version's postings of the same tickets."""

    def __init__(self, tickets: Sequence, weights: Sequence[float] = DEFAULT_WEIGHTS, k1: float = BM25_K1,
                 b: float = BM25_B, max_terms: int = MAX_QUERY_TERMS):
        self.ids = [t.id for t in tickets]
        self.row_of = {tid: i for i, tid in enumerate(self.ids)}
        if len(self.row_of) != len(self.ids):
            raise ValueError("Bm25Scorer needs distinct ticket ids")
        self.weights = tuple(float(w) for w in weights)
        self.k1, self.b, self.max_terms = float(k1), float(b), int(max_terms)
        rows: dict[str, list[int]] = {}
        tfs: dict[str, list[float]] = {}
        lengths = np.zeros(len(self.ids), dtype=np.float32)  # float32, like the postings' bm25_length.npy
        for i, t in enumerate(tickets):
            freq, lengths[i] = document_terms(t.subject, t.description, t.solution, self.weights)
            for term, f in freq.items():
                rows.setdefault(term, []).append(i)
                tfs.setdefault(term, []).append(f)
        self._rows = {t: np.asarray(r, np.int64) for t, r in rows.items()}
        self._tf = {t: np.asarray(tfs[t], np.float32).astype(np.float64) for t in rows}  # as stored in the postings
        self.norm = length_norm(lengths, self.k1, self.b)

    def __len__(self) -> int:
        return len(self.ids)

    def params(self) -> dict:
        return {"backend": "memory", "k1": self.k1, "b": self.b, "weights": dict(zip(FIELDS, self.weights)),
                "max_terms": self.max_terms, "tokenizer": "unicode61-like + porter (stop words dropped)"}

    def document_frequency(self, stem: str) -> int:
        """How many of the tickets hold `stem` (a Porter stem, as `query_stems` gives them)."""
        rows = self._rows.get(stem)
        return 0 if rows is None else len(rows)

    def scores(self, query_text: str) -> np.ndarray:
        """bm25 of `query_text` against every ticket, float64 [n] (0 where no term is shared)."""
        n = len(self.ids)
        acc = np.zeros(n, dtype=np.float64)
        k1p1 = self.k1 + 1.0
        for stem in query_stems(query_text, self.document_frequency, n, self.max_terms):
            rows = self._rows.get(stem)
            if rows is None:
                continue
            acc[rows] += impacts(idf(len(rows), n), self._tf[stem], self.norm[rows], k1p1)
        return acc

    def score(self, query_text: str, rows: Sequence[int] | None = None) -> np.ndarray:
        """bm25 of `query_text` against the tickets at `rows` (all when None)."""
        all_scores = self.scores(query_text)
        return all_scores if rows is None else all_scores[np.asarray(rows, dtype=np.int64)]

    def top_k(self, query_text: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best rows sharing a term with the query and their bm25, best first (ties: lower row first)."""
        if k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        all_scores = self.scores(query_text)
        rows = np.flatnonzero(all_scores > 0)
        order = np.lexsort((rows, -all_scores[rows]))[:k]
        return rows[order], all_scores[rows[order]]

    def lexical(self, query_text: str, rows: Sequence[int] | None = None) -> np.ndarray:
        """lexical(q, t) of the tickets at `rows` (all when None): bm25 / the query's maximum over these tickets."""
        all_scores = self.scores(query_text)
        picked = all_scores if rows is None else all_scores[np.asarray(rows, dtype=np.int64)]
        return lexical_feature(picked, float(all_scores.max(initial=0.0)))

    def lexical_pairs(self, query_texts: Sequence[str], q: np.ndarray, ticket_ids: Sequence[str]) -> np.ndarray:
        """lexical of aligned pairs: pair i is (query_texts[q[i]], ticket_ids[i]); each query is scored once."""
        q = np.asarray(q, dtype=np.int64)
        missing = [tid for tid in ticket_ids if tid not in self.row_of]
        if missing:
            raise KeyError(f"ticket {missing[0]!r} is not in the knowledge base the BM25 scorer holds")
        rows = np.array([self.row_of[tid] for tid in ticket_ids], dtype=np.int64)
        out = np.zeros(len(rows), dtype=np.float64)
        for qi in np.unique(q):
            at = np.flatnonzero(q == qi)
            out[at] = self.lexical(query_texts[int(qi)], rows[at])
        return out
