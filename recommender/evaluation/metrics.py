"""Evaluation metrics with their exact definitions: similarity (r, ρ, MSE), ranking (MAP@k, MRR@k, P@k, Acc@k),
the SemEval-2016 Task 3 official scorer's conventions, and the paper's success rate (Figure 4).

Vocabulary used throughout:

- a *run* maps a query id to its ranked list of ticket ids, best first (`Run = dict[str, list[str]]`);
- *qrels* map a query id to its graded labels on the 1–5 scale (`Qrels = dict[str, dict[str, float]]`;
  YES 5, REL 3, NO 1); a ticket without a label is not relevant;
- a ticket is *relevant* to a query when its label ≥ `threshold` (default 3: YES and REL, as SemEval's
  binary gold; `threshold=5` is YES only);
- every mean is over **all** queries of the run (a query with no relevant ticket scores 0).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
from scipy import stats

from ..errors import InputError

Run = dict[str, list[str]]
Qrels = dict[str, dict[str, float]]

#: The cut-offs every report shows.
DEFAULT_KS = (1, 5, 10)
#: YES and REL are relevant (SemEval's binary gold); use YES_ONLY for the strict reading.
YES_AND_REL = 3.0
YES_ONLY = 5.0


# -- similarity task -------------------------------------------------------------------------------------------
def similarity_metrics(predicted: Sequence[float], gold: Sequence[float]) -> dict[str, float]:
    """Pearson r, Spearman ρ and MSE of predicted against gold scores, both on the 1–5 scale.

    r = cov(p, g) / (σ_p σ_g);  ρ = Pearson r of the ranks (average ranks for ties);  MSE = mean((p − g)²).
    r and ρ are NaN when either side is constant (undefined), never silently 0.
    """
    p = np.asarray(predicted, dtype=np.float64)
    g = np.asarray(gold, dtype=np.float64)
    if p.shape != g.shape or p.ndim != 1 or len(p) == 0:
        raise InputError(f"similarity metrics need two equally long, non-empty score lists (got {p.shape} and {g.shape})")
    constant = np.ptp(p) == 0 or np.ptp(g) == 0
    r = float("nan") if constant else float(stats.pearsonr(p, g)[0])
    rho = float("nan") if constant else float(stats.spearmanr(p, g)[0])
    return {"pearson": r, "spearman": rho, "mse": float(np.mean((p - g) ** 2))}


# -- per-query ranking measures ----------------------------------------------------------------------------------
def relevance_flags(ranking: Sequence[str], labels: Mapping[str, float], threshold: float = YES_AND_REL) -> np.ndarray:
    """1/0 per ranked ticket: is its label ≥ threshold (unlabelled = 0)."""
    return np.array([1 if labels.get(t, 0.0) >= threshold else 0 for t in ranking], dtype=np.int64)


def n_relevant(labels: Mapping[str, float], threshold: float = YES_AND_REL) -> int:
    """R: how many tickets of the query are relevant among all its labels (retrieved or not)."""
    return sum(1 for v in labels.values() if v >= threshold)


def average_precision_at_k(flags: Sequence[int], k: int, total_relevant: int) -> float:
    """AP@k = (1/R) Σ_{i≤k, rel_i} P@i, with R = all relevant tickets of the query (TREC / ranx `map@k`); 0 when R = 0."""
    if total_relevant <= 0:
        return 0.0
    top = np.asarray(flags[:k], dtype=np.float64)
    if not top.any():
        return 0.0
    precision_at_i = np.cumsum(top) / np.arange(1, len(top) + 1)
    return float((precision_at_i * top).sum() / total_relevant)


def reciprocal_rank_at_k(flags: Sequence[int], k: int) -> float:
    """RR@k = 1 / rank of the first relevant ticket within the top k, 0 when none is."""
    for i, f in enumerate(flags[:k]):
        if f:
            return 1.0 / (i + 1)
    return 0.0


def precision_at_k(flags: Sequence[int], k: int) -> float:
    """P@k = (relevant tickets in the top k) / k (a list shorter than k still divides by k)."""
    return float(np.sum(flags[:k])) / k


def accuracy_at_k(flags: Sequence[int], k: int) -> float:
    """Acc@k (the paper's): 1 when at least one relevant ticket is in the top k, else 0."""
    return 1.0 if np.sum(flags[:k]) > 0 else 0.0


def official_average_precision(flags: Sequence[int], cutoff: int = 10) -> float:
    """SemEval-2016 scorer's AP: the mean of P@i over the relevant ranks i ≤ cutoff.

    It divides by the number of relevant tickets *retrieved in the top cutoff* (not by R), and is 0 when none is.
    """
    top = np.asarray(flags[:cutoff], dtype=np.float64)
    if not top.any():
        return 0.0
    precision_at_i = np.cumsum(top) / np.arange(1, len(top) + 1)
    return float(precision_at_i[top > 0].mean())


# -- run-level aggregates ------------------------------------------------------------------------------------------
def _check(run: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, float]]) -> None:
    if not run:
        raise InputError("the run is empty: no query was ranked; check that the data set has queries with labelled pairs")
    for qid, ranking in run.items():
        if len(set(ranking)) != len(ranking):
            raise InputError(f"query {qid!r}: the ranking lists a ticket twice")


def ranking_metrics(
    run: Mapping[str, Sequence[str]],
    qrels: Mapping[str, Mapping[str, float]],
    ks: Iterable[int] = DEFAULT_KS,
    threshold: float = YES_AND_REL,
) -> dict[str, float]:
    """MAP@k, MRR@k, P@k and Acc@k (fractions in [0, 1]) averaged over all queries of `run`.

    Keys: `map@k`, `mrr@k`, `p@k`, `acc@k` for every k. AP@k divides by R, the query's relevant labels (see
    `average_precision_at_k`); a query with R = 0 counts 0 in every mean.
    """
    _check(run, qrels)
    ks = list(ks)
    sums = {f"{m}@{k}": 0.0 for k in ks for m in ("map", "mrr", "p", "acc")}
    for qid, ranking in run.items():
        labels = qrels.get(qid, {})
        flags = relevance_flags(ranking, labels, threshold)
        total = n_relevant(labels, threshold)
        for k in ks:
            sums[f"map@{k}"] += average_precision_at_k(flags, k, total)
            sums[f"mrr@{k}"] += reciprocal_rank_at_k(flags, k)
            sums[f"p@{k}"] += precision_at_k(flags, k)
            sums[f"acc@{k}"] += accuracy_at_k(flags, k)
    n = len(run)
    return {key: value / n for key, value in sums.items()}


def official_semeval(
    run: Mapping[str, Sequence[str]],
    qrels: Mapping[str, Mapping[str, float]],
    threshold: float = YES_AND_REL,
    cutoff: int = 10,
) -> dict[str, float]:
    """The SemEval-2016 Task 3 scorer (ev.py) conventions, ×100: `official_map`, `official_mrr`, `official_p@1`.

    MAP: `official_average_precision` over the top `cutoff`, averaged over ALL queries (none relevant → 0).
    MRR: 1/rank of the first relevant within the top `cutoff`, averaged over all queries.
    P@1: share of queries whose first ticket is relevant (the scorer's ACC@01).
    """
    _check(run, qrels)
    ap = rr = p1 = 0.0
    for qid, ranking in run.items():
        flags = relevance_flags(ranking, qrels.get(qid, {}), threshold)
        ap += official_average_precision(flags, cutoff)
        rr += reciprocal_rank_at_k(flags, cutoff)
        p1 += float(len(flags) > 0 and flags[0])
    n = len(run)
    return {"official_map": 100 * ap / n, "official_mrr": 100 * rr / n, "official_p@1": 100 * p1 / n}


def per_query_values(run: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, float]],
                     threshold: float = YES_AND_REL) -> dict[str, dict[str, float]]:
    """query id → its own values of the headline measures, whose means over the queries are the run's figures:
    `official_map`, `official_mrr`, `official_p@1` (×100, as `official_semeval`), `map@10`, `acc@10` (fractions)."""
    _check(run, qrels)
    out: dict[str, dict[str, float]] = {}
    for qid, ranking in run.items():
        labels = qrels.get(qid, {})
        flags = relevance_flags(ranking, labels, threshold)
        out[qid] = {"official_map": 100 * official_average_precision(flags, 10),
                    "official_mrr": 100 * reciprocal_rank_at_k(flags, 10),
                    "official_p@1": 100 * float(len(flags) > 0 and flags[0]),
                    "map@10": average_precision_at_k(flags, 10, n_relevant(labels, threshold)),
                    "acc@10": accuracy_at_k(flags, 10)}
    return out


def success_rate(run: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, float]], k: int = 10) -> dict[str, float]:
    """The paper's Figure 4: share of queries with ≥1, ≥2, ≥3 relevant tickets among the top k.

    Keys `yes>=n` (YES only, label ≥ 5) and `yes+rel>=n` (label ≥ 3) for n = 1, 2, 3.
    """
    _check(run, qrels)
    out: dict[str, float] = {}
    for name, threshold in (("yes", YES_ONLY), ("yes+rel", YES_AND_REL)):
        counts = [int(relevance_flags(ranking[:k], qrels.get(qid, {}), threshold).sum()) for qid, ranking in run.items()]
        for n in (1, 2, 3):
            out[f"{name}>={n}"] = sum(c >= n for c in counts) / len(counts)
    return out


def rank_by_score(scores: Sequence[tuple[str, float]]) -> list[str]:
    """Ticket ids by descending score; ties keep the given order (the official scorer's stable sort)."""
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i][1]))
    return [scores[i][0] for i in order]


# -- bootstrap over queries ------------------------------------------------------------------------------------------
def bootstrap_samples(n: int, n_boot: int = 2000, seed: int = 0) -> np.ndarray:
    """[n_boot, n] query indices drawn with replacement (one draw shared by every system of a run)."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def bootstrap_interval(values: np.ndarray, samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` over resampled query indices `samples` [B, n]."""
    means = np.asarray(values, dtype=np.float64)[samples].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(low), float(high)


def paired_bootstrap_difference(a: Sequence[float], b: Sequence[float], n_boot: int = 2000, seed: int = 0,
                                level: float = 0.95) -> dict[str, float]:
    """Mean of a − b over the same queries (paired: per-query values of two systems, in the same query order), its
    percentile bootstrap interval (queries resampled) and the share of resamples where the difference is ≤ 0."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or len(x) == 0:
        raise InputError(f"a paired bootstrap needs two equally long, non-empty per-query lists (got {x.shape}, {y.shape})")
    diff = x - y
    samples = bootstrap_samples(len(diff), n_boot, seed)
    low, high = bootstrap_interval(diff, samples, level)
    return {"diff": float(diff.mean()), "low": low, "high": high,
            "p_not_better": float((diff[samples].mean(axis=1) <= 0).mean())}


# -- SemEval files ---------------------------------------------------------------------------------------------------
def read_semeval_file(path: str | Path) -> tuple[Run, Qrels]:
    """Read a SemEval subtask-B gold or prediction file (`orgQ relQ rank-or-0 score true|false` per line).

    Returns the run ordered by the score column, descending, ties in file order (as the official scorer sorts),
    and binary qrels (true → 5, false → 1, so every threshold in 1 < t ≤ 5 reads them alike).
    """
    path = Path(path)
    rows: dict[str, list[tuple[str, float]]] = {}
    qrels: Qrels = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}; check the path") from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 5 or parts[4] not in ("true", "false"):
            raise InputError(f"{path}:{n}: expected 'orgQ relQ rank score true|false', got {line!r}")
        try:
            score = float(parts[3])
        except ValueError:
            raise InputError(f"{path}:{n}: the score {parts[3]!r} is not a number") from None
        rows.setdefault(parts[0], []).append((parts[1], score))
        qrels.setdefault(parts[0], {})[parts[1]] = 5.0 if parts[4] == "true" else 1.0
    return {qid: rank_by_score(pairs) for qid, pairs in rows.items()}, qrels


def score_semeval_files(gold_path: str | Path, prediction_path: str | Path) -> dict[str, float]:
    """Score a prediction file against a gold relevancy file the way the official scorer does (labels from gold)."""
    _, gold = read_semeval_file(gold_path)
    run, _ = read_semeval_file(prediction_path)
    missing = set(gold) - set(run)
    if missing:
        raise InputError(f"{prediction_path} has no predictions for {len(missing)} gold queries (e.g. {sorted(missing)[0]})")
    return official_semeval({q: run[q] for q in gold}, gold)
