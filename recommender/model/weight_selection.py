"""Channel and pair weights selected by rank: held-out queries rank their knowledge base's tickets, and among the
combinations of a weight grid the simplest one within one standard error of the best MRR@10 wins.

Label-free training selects on the mined held-out slice (`select_on_held_out`: held-out subject queries against
every ticket's view, paraphrase queries against the full views, and the held-out tickets pasted whole as a
condition), and with the mining option `select_on_labelled` re-selects the channel weights on labelled queries
(`select_on_labelled`: each query's labelled tickets reranked); `train --with-feedback` re-selects on the engineers'
judged queries (`select_by_rank`, `judged.py`);
`benchmarks/selection_agreement.py` reads the whole ranking (`GridRanking`). A pair whose distance no slice can
show keeps a weight of its kind (`restored_pairs`), and a pair against a field no ticket fills weighs 0
(`set_weights_on_filled_fields`).
"""
from __future__ import annotations

import itertools
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from tqdm import tqdm

from ..config import usable_cpus
from ..data.records import Query, Ticket, query_text
from ..errors import InputError
from ..lexical.bm25 import Bm25Scorer
from . import grid_ranks
from .bundle import Prepared, TicketModel
from .grid_ranks import MRR_K, reciprocal_ranks, weighting_ranks
from .mining import MinedPairs
from .siamese import MERGED, SiameseConfig
from .training import GroupTable, PreparedPairs, _scores, combination_scores, grid_combinations, pair_distances

#: Held-out rankings score at most this many views per query (the own view always among them).
MAX_RANKED_VIEWS = 3000
#: Query-view cells (over all slices) from which the grid's pair weightings are ranked on several threads when numba
#: is missing: below it numpy's small operations hold the GIL, and two threads took twice one thread's time (3 slices
#: of 40 queries × 200 views: 24,000 cells; SeaMonkey's 3 × 161 × 1,074 = 519,000 ran 1.35 times faster on two). The
#: compiled ranking (`grid_ranks`) runs without the GIL: two threads 2.2–2.5 times faster than one at either size.
THREADED_RANKING_CELLS = 200_000
#: Most threads the grid's ranking takes by default (numpy's is memory-bandwidth bound: two gave 1.35–1.5 times one).
MAX_RANKING_THREADS = 8
#: The selection slice of held-out tickets pasted whole (`selection_slices`): a condition, not pooled.
PASTED = "pasted"
#: The fewest labelled queries, each with a relevant and a non-relevant labelled ticket, that re-select the channel
#: weights (`select_on_labelled`): below it one standard error is wide enough to let a single channel win by chance.
MIN_LABELLED_QUERIES = 30


def standard_error(values: np.ndarray) -> float:
    """The standard error of the mean of per-query `values` (0 with fewer than two)."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.std(ddof=1) / np.sqrt(values.size)) if values.size > 1 else 0.0


def near_best(means: np.ndarray, tolerance: float, eligible: np.ndarray | None = None) -> np.ndarray:
    """The indices of the `eligible` combinations (all by default) whose mean is within `tolerance` of the best
    eligible mean: those a selection cannot tell apart."""
    means = np.asarray(means, dtype=np.float64)
    ok = np.ones(means.size, bool) if eligible is None else np.asarray(eligible, bool)
    best = int(np.argmax(np.where(ok, means, -np.inf)))
    return np.flatnonzero(ok & (means >= means[best] - tolerance - 1e-12))


def simplest_near_best(means: np.ndarray, tolerance: float, complexity: Callable[[int], object],
                       eligible: np.ndarray | None = None) -> tuple[int, np.ndarray]:
    """The rule every weight selection here applies (the one-standard-error rule, Breiman et al. 1984): among the
    combinations `near_best` gives, the least complex (`complexity(i)`, smaller is simpler), then the higher mean,
    then the first. Returns (the chosen index, the indices within `tolerance`)."""
    near = near_best(means, tolerance, eligible)
    return int(min(near, key=lambda i: (complexity(i), -means[i], i))), near


def rank_distances(model: TicketModel, queries: Prepared, views: Prepared) -> np.ndarray:
    """[P, C, Q, N] L1 distances of every metric pair and channel between Q prepared queries and N prepared views."""
    q, t = model.encode_prepared(queries), model.encode_prepared(views)
    net = model.net
    out = np.zeros((len(net.pairs), len(net.channel_names), len(queries.tokens), len(views.tokens)), np.float32)
    for p, (a, b) in enumerate(net.pairs):
        for c, ch in enumerate(net.channel_names):
            out[p, c] = torch.cdist(torch.from_numpy(q[f"{a}.{ch}"]).double(),
                                    torch.from_numpy(t[f"{b}.{ch}"]).double(), p=1).numpy()
    return out


def mrr_at_k(d: np.ndarray, truth: np.ndarray, k: int = MRR_K) -> float:
    """MRR@k of column truth[i] in row i of distances d [Q, N]."""
    return float(np.mean(reciprocal_ranks(d, truth, k)))


@dataclass
class RankedSlice:
    """Held-out queries ranked against candidate views: `dist` [P, C, Q, N] from `rank_distances`, `lexical` [Q, N]
    (BM25 share, or None without the BM25 channel), `truth` [Q] the column of each query's own view, `observable`
    [P] the metric pairs whose distance changes a ranking here (the others are left out of it)."""

    dist: np.ndarray
    lexical: np.ndarray | None
    truth: np.ndarray
    observable: Sequence[bool]

    def distances(self, spec: dict) -> np.ndarray:
        """[Q, N] each query's distance to each view under the weights `spec`."""
        pw = np.array([v for *_, v in spec["pairs"]]) * np.asarray(self.observable, bool)
        cw = np.array(list(spec["channels"].values()), np.float32)
        d = np.einsum("pcqn,p,c->qn", self.dist, pw, cw)
        if self.lexical is not None and spec["bm25"]:
            d = d + spec["bm25"] * (1.0 - self.lexical)
        return d

    def reciprocal_ranks(self, spec: dict) -> np.ndarray:
        """Per-query 1/rank (within the top 10, else 0) of the weights `spec`."""
        return reciprocal_ranks(self.distances(spec), self.truth)

    def mrr(self, spec: dict) -> float:
        """MRR@10 of the weights `spec`."""
        return float(np.mean(self.reciprocal_ranks(spec)))

    def queries(self, mask: np.ndarray) -> "RankedSlice":
        """The same slice for the queries `mask` selects only."""
        return RankedSlice(self.dist[:, :, mask], None if self.lexical is None else self.lexical[mask],
                           self.truth[mask], self.observable)


def searched_pairs(slices: Sequence[RankedSlice]) -> np.ndarray:
    """[P] bool: the metric pairs observable in some of `slices`, those a weight grid searches over them."""
    return np.any([np.asarray(s.observable, bool) for s in slices], axis=0)


def grid_results(slices: Sequence[RankedSlice], spec: dict, grid: dict, progress: bool = False,
                 workers: int | None = None) -> Iterator[tuple[tuple, int, np.ndarray]]:
    """Every combination of the weight `grid` ranked over the queries of all `slices`, in grid order: (the
    combination, whose spec `combination_spec` gives; the number of channels it uses, BM25 counted as one;
    per-query 1/rank within the top 10). A generator: a caller keeps what it needs of each.

    `spec` is the current metric spec (`net.metric_spec()`); the pairs observable in some slice are searched, the
    others keep `spec`; BM25 is searched when every slice has its lexical feature. The pair weightings are ranked
    on `workers` threads (default: the CPUs this process may use, at most `MAX_RANKING_THREADS`; without numba
    one when the slices hold fewer than `THREADED_RANKING_CELLS` query-view cells), every result the same as one
    thread's, yielded in grid order. The ranking itself is `grid_ranks.weighting_ranks` (compiled, without the GIL).
    """
    searched = searched_pairs(slices)
    pair_axes = [list(grid.get(f"{a}|{b}", [v])) if obs else [v] for (a, b, v), obs in zip(spec["pairs"], searched)]
    channel_axes = [list(grid.get(c, [spec["channels"][c]])) for c in spec["channels"]]
    use_bm25 = all(s.lexical is not None for s in slices)
    bm25_axis = list(grid.get("bm25", [spec["bm25"]])) if use_bm25 else [None]
    channel_combos = list(itertools.product(*channel_axes))
    # float32 channel weights, as the model holds them; every combination but the one with no channel and no BM25
    channel_weights = np.array([np.asarray(cw, np.float32) for cw in channel_combos], np.float64)
    active = np.array([[bool(any(cw) or wb) for wb in bm25_axis] for cw in channel_combos], bool)
    # each BM25 weight times each slice's lexical distance, once (zeros where no BM25 term is added), widened to
    # float64 once: exact, as adding it to the float64 channel sums widens it
    lexical = [np.stack([wb * (1.0 - s.lexical) if wb else np.zeros_like(s.lexical) for wb in bm25_axis]).astype(
        np.float64) if use_bm25 else np.zeros((1,) + s.dist.shape[2:]) for s in slices]
    labels = [(cw, wb, sum(1 for w in cw if w) + int(bool(wb)))
              for cw, row in zip(channel_combos, active) for wb, on in zip(bm25_axis, row) if on]

    def pair_results(pw: tuple) -> list[tuple[tuple, int, np.ndarray]]:
        # unobservable pairs are constant per query: leave them out of each slice's ranking
        ranks = np.concatenate([
            weighting_ranks(np.einsum("pcqn,p->cqn", s.dist, np.asarray(pw) * np.asarray(s.observable, bool)),
                            lx, s.truth, channel_weights, active, MRR_K)
            for s, lx in zip(slices, lexical)], axis=1)
        return [((pw, cw, wb), used, rr) for (cw, wb, used), rr in zip(labels, ranks)]

    pair_combos = list(itertools.product(*pair_axes))
    if workers is None:  # numpy's small rankings hold the GIL more than they compute: threads only slow them down
        cells = sum(s.dist.shape[-2] * s.dist.shape[-1] for s in slices)
        threaded = grid_ranks.HAVE_NUMBA or cells >= THREADED_RANKING_CELLS
        workers = min(MAX_RANKING_THREADS, usable_cpus()) if threaded else 1
    workers = max(1, min(workers, len(pair_combos)))
    bar = tqdm(total=len(pair_combos), desc="ranking weight combinations", disable=not progress, leave=False)
    with bar, ThreadPoolExecutor(workers, thread_name_prefix="ticketrec-grid") as pool:
        pending: deque = deque()
        for pw in pair_combos:
            pending.append(pool.submit(pair_results, pw))
            if len(pending) >= 2 * workers:  # a bounded window keeps grid order and memory
                yield from pending.popleft().result()
                bar.update()
        while pending:
            yield from pending.popleft().result()
            bar.update()


def combination_spec(spec: dict, combination: tuple) -> dict:
    """The metric spec of one `grid_results` combination (BM25 kept from `spec` where it was not searched)."""
    pw, cw, wb = combination
    return {"pairs": [[a, b, float(v)] for (a, b, _), v in zip(spec["pairs"], pw)],
            "channels": {c: float(v) for c, v in zip(spec["channels"], cw)},
            "bm25": spec["bm25"] if wb is None else float(wb)}


def smoothed_stderr(values: np.ndarray) -> float:
    """The standard error of the mean of `values` (each in [0, 1]) with one pseudo-value added, half at 1 and half
    at 0 (Agresti & Coull 1998, z = 1): near the usual one, but not 0 when every value is 1 (161 pasted tickets
    all ranked first: 0.0044), where the usual one would make a single ticket at rank 2 a significant loss."""
    v = np.concatenate([np.asarray(values, np.float64), [1.0, 0.0]])
    w = np.concatenate([np.ones(len(values)), [0.5, 0.5]])
    mean = float((w * v).sum() / w.sum())
    return float(np.sqrt((w * (v - mean) ** 2).sum() / w.sum() / w.sum()))


@dataclass
class GridRanking:
    """Every combination of a weight grid ranked over some slices (`grid_results`), and the selection's choice
    among them (`chosen`): what `select_by_rank` and `benchmarks/selection_agreement.py` both read."""

    combinations: list[tuple]  # `combination_spec` gives each one's metric spec
    used: list[int]  # channels each uses, BM25 counted as one
    means: np.ndarray  # MRR@10 over all the slices' queries
    best: int  # the best mean among the eligible (the first of equal bests: grid order breaks ties)
    stderr: float  # the standard error of the best combination's mean
    chosen: int  # the simplest eligible combination within one standard error of the best
    eligible: np.ndarray  # [combinations] bool: passes the condition slice (all, without one)
    condition_means: np.ndarray | None = None  # MRR@10 over the condition slice's queries
    condition_best: int | None = None  # the best of those
    condition_stderr: float = 0.0  # its smoothed standard error (`smoothed_stderr`)

    @classmethod
    def of(cls, slices: Sequence[RankedSlice], spec: dict, grid: dict, progress: bool = False,
           condition: RankedSlice | None = None) -> "GridRanking":
        """Rank every combination; keep the per-query ranks of the best one only (its standard error).

        The one-standard-error rule (Breiman et al. 1984): combinations that a few hundred held-out queries cannot
        tell apart are equally good, and the one with the fewest channels (BM25 counted as one) is the least likely
        to carry noise to queries unlike the mined ones; ties go to the higher MRR, then to grid order.

        With a `condition` slice (its queries are not pooled with the others'), only the combinations whose MRR@10
        there is within one smoothed standard error of the best combination's are eligible, and the rule is
        applied among them. Its `observable` pairs must be among the other slices' (it judges the combinations
        they search, it does not add any)."""
        n_pooled = sum(len(s.truth) for s in slices)
        combinations, used, means, condition_means = [], [], [], []
        best, best_rr, condition_best, condition_rr = 0, None, 0, None
        ranked = list(slices) + ([condition] if condition is not None else [])
        for combination, n_used, rr in grid_results(ranked, spec, grid, progress):
            combinations.append(combination)
            used.append(n_used)
            means.append(float(rr[:n_pooled].mean()))
            if best_rr is None or means[-1] > means[best]:
                best, best_rr = len(means) - 1, rr[:n_pooled]
            if condition is not None:
                condition_means.append(float(rr[n_pooled:].mean()))
                if condition_rr is None or condition_means[-1] > condition_means[condition_best]:
                    condition_best, condition_rr = len(condition_means) - 1, rr[n_pooled:]
        means = np.array(means)
        eligible = np.ones(len(means), bool)
        condition_stderr = 0.0
        if condition is not None:
            condition_stderr = smoothed_stderr(condition_rr)
            condition_means = np.array(condition_means)
            eligible = condition_means >= condition_means[condition_best] - condition_stderr
            if not eligible[best]:
                best = int(np.argmax(np.where(eligible, means, -np.inf)))
                best_spec = combination_spec(spec, combinations[best])
                best_rr = np.concatenate([s.reciprocal_ranks(best_spec) for s in slices])
        stderr = standard_error(best_rr)
        chosen = simplest_near_best(means, stderr, lambda i: used[i], eligible)[0]
        return cls(combinations, used, means, best, stderr, chosen, eligible,
                   condition_means if condition is not None else None,
                   condition_best if condition is not None else None, condition_stderr)

    def near(self) -> np.ndarray:
        """The eligible combinations within one standard error of the best: those the selection cannot tell
        apart, among which it takes the simplest."""
        return near_best(self.means, self.stderr, self.eligible)


def select_by_rank(slices: Sequence[RankedSlice], spec: dict, grid: dict, progress: bool = False,
                   condition: RankedSlice | None = None) -> tuple[dict, float, dict]:
    """The simplest grid combination whose held-out MRR@10 (over the queries of all `slices`) is within one
    standard error of the best one (`GridRanking`), among those that pass the `condition` slice when one is given.
    Returns the chosen spec, its MRR@10 and {"best": the best MRR@10, "stderr": its standard error, and with a
    condition "condition": {"value", "best", "stderr", "eligible", "combinations"}}."""
    ranking = GridRanking.of(slices, spec, grid, progress, condition)
    info = {"best": float(ranking.means[ranking.best]), "stderr": ranking.stderr}
    if condition is not None:
        info["condition"] = {"value": float(ranking.condition_means[ranking.chosen]),
                             "best": float(ranking.condition_means[ranking.condition_best]),
                             "stderr": ranking.condition_stderr, "eligible": int(ranking.eligible.sum()),
                             "combinations": len(ranking.combinations)}
    return combination_spec(spec, ranking.combinations[ranking.chosen]), float(ranking.means[ranking.chosen]), info


def ranked_rows(n_views: int, truth: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The view rows a held-out ranking scores, sorted: all, or `MAX_RANKED_VIEWS` of them, every row in `truth`
    and a sample (`rng`) of the others."""
    ranked = np.arange(n_views)
    if len(ranked) > MAX_RANKED_VIEWS:
        rest = np.setdiff1d(ranked, truth)
        ranked = np.union1d(truth, rng.choice(rest, MAX_RANKED_VIEWS - len(np.unique(truth)), replace=False))
    return ranked


def _ranked_slice(model: TicketModel, queries: Prepared, query_texts: Sequence[str], views: Prepared,
                  ranked: np.ndarray, truth: np.ndarray, scorer: Bm25Scorer | None,
                  observable: Sequence[bool]) -> RankedSlice:
    """A `RankedSlice` of prepared queries against the prepared `views` (rows `ranked` of the scorer's tickets);
    a pair counts as observable when `observable` says so and its distance varies over some query's views."""
    dist = rank_distances(model, queries, views)
    lex = None if scorer is None else np.stack([scorer.lexical(text, ranked) for text in query_texts])
    varies = [bool((dist[p].max(axis=2) - dist[p].min(axis=2) > 1e-6).any()) for p in range(len(dist))]
    return RankedSlice(dist, lex, np.searchsorted(ranked, truth), [o and v for o, v in zip(observable, varies)])


def selection_slices(model: TicketModel, mined: MinedPairs, held_queries: Prepared, views: Prepared,
                     view_scorer: Bm25Scorer | None, observable: list[bool], seed: int, pasted: bool = False,
                     progress: bool = False) -> dict[str, RankedSlice]:
    """The rankings the weights are selected on: each held-out query (`held_queries`, prepared) against the views
    (all, or `MAX_RANKED_VIEWS` of them with every held-out ticket's own; `views` prepared), and each paraphrase
    query (`mining.py`) against the same tickets' full views. {"held-out": …, "paraphrase": … (when mined),
    PASTED: … (with `pasted`)}: the held-out tickets, subject and description pasted whole as queries, against the
    same tickets as they are stored. The last is a condition of the selection (`GridRanking`), not pooled with the
    others; its observable pairs are theirs."""
    ranked = ranked_rows(len(mined.views), mined.held_out_truth, np.random.default_rng(seed + 2))
    slices = {"held-out": _ranked_slice(model, held_queries, [query_text(q) for q in mined.held_out_queries],
                                        Prepared(*views.rows(ranked)), ranked, mined.held_out_truth, view_scorer,
                                        observable)}
    if mined.paraphrase_queries:
        full_scorer = None if view_scorer is None else Bm25Scorer(mined.full_views)
        slices["paraphrase"] = _ranked_slice(
            model, model.prepare(mined.paraphrase_queries, "query", progress),
            [query_text(q) for q in mined.paraphrase_queries],
            model.prepare([mined.full_views[int(r)] for r in ranked], "ticket", progress), ranked,
            mined.paraphrase_truth, full_scorer, [True] * len(observable))
    if pasted:
        searched = list(searched_pairs(list(slices.values())))
        whole = [Query(mined.originals[int(r)].subject, mined.originals[int(r)].description)
                 for r in mined.held_out_truth]
        slices[PASTED] = _ranked_slice(
            model, model.prepare(whole, "query", progress), [query_text(q) for q in whole],
            model.prepare([mined.originals[int(r)] for r in ranked], "ticket", progress), ranked,
            mined.held_out_truth, None if view_scorer is None else Bm25Scorer(mined.originals), searched)
        slices[PASTED].observable = searched  # a pair constant per query here ranks nothing either way
    return slices


def select_on_held_out(model: TicketModel, mined: MinedPairs, held: PreparedPairs, views: Prepared,
                       view_scorer: Bm25Scorer | None, observable: list[bool], seed: int, pasted: bool,
                       progress: bool) -> tuple[dict, list[bool]]:
    """Select the weights by rank over the held-out and paraphrase queries (`selection_slices`, `select_by_rank`),
    with `pasted`, among those that rank the held-out tickets pasted whole about as well as the best do, and set
    them on `model`. Returns the selection report and the pairs that were observable (a pair whose distance is the
    same for every view of a query, e.g. no ticket has a SOLUTION, cannot change a ranking and is not; the ticket's
    SUBJECT is observable through the paraphrase queries only)."""
    net = model.net
    slices = selection_slices(model, mined, held.queries, views, view_scorer, observable, seed, pasted, progress)
    condition = slices.pop(PASTED, None)
    n_views = slices["held-out"].dist.shape[-1]  # the views each held-out query ranks
    trained = net.metric_spec()
    chosen, value, best = select_by_rank(list(slices.values()), trained, model.siamese_config.grid, progress,
                                         condition)

    def mrr(spec: dict) -> float:  # over the queries of every slice, as the selection counts them
        return float(np.mean(np.concatenate([s.reciprocal_ranks(spec) for s in slices.values()])))

    use_bm25 = view_scorer is not None
    alone = {}
    for c in list(trained["channels"]) + (["bm25"] if use_bm25 else []):
        alone[c] = mrr(dict(chosen, channels={k: float(k == c) for k in chosen["channels"]}, bm25=float(c == "bm25")))
    report = {"objective": f"held-out MRR@{MRR_K} of the own ticket among {n_views} views "
                           f"({', '.join(f'{len(s.truth)} {name} queries' for name, s in slices.items())})"
                           + (f", among the weights that rank {len(condition.truth)} held-out tickets pasted whole "
                              "within one standard error of the best" if condition is not None else ""),
              "value": value, "best": best["best"], "stderr": best["stderr"], "before": mrr(trained),
              "alone": alone, "by_slice": {name: s.mrr(chosen) for name, s in slices.items()}, "spec": chosen}
    if condition is not None:
        report[PASTED] = best["condition"]
    net.set_weights([v for *_, v in chosen["pairs"]], chosen["channels"], chosen["bm25"])
    model.invalidate()
    return report, list(searched_pairs(list(slices.values())))


def selecting_queries(pairs, relevant_min: float) -> np.ndarray:
    """The query rows of the labelled `pairs` (a PairSet) with a relevant (label ≥ `relevant_min`) and a
    non-relevant labelled ticket: those a rerank of their labelled tickets can select weights on."""
    q, rel = np.asarray(pairs.q), np.asarray(pairs.y, dtype=np.float64) >= relevant_min
    return np.intersect1d(q[rel], q[~rel])


def select_on_labelled(model: TicketModel, labelled: PreparedPairs, relevant_min: float) -> dict:
    """Re-select the channel and BM25 weights of `model` on labelled queries, the pair weights kept: each query's
    labelled tickets reranked under every channel weighting of the config's grid (at least one channel weighed),
    average precision per query, and the simplest weighting (fewest channels, BM25 counted as one; then the higher
    MAP, then grid order) within one standard error of the best MAP, as the mined selection's rule. Only the queries
    with a relevant (label ≥ `relevant_min`) and a non-relevant labelled ticket count; with fewer than
    `MIN_LABELLED_QUERIES` of them the weights stay. Returns the report ("applied": whether it selected)."""
    pairs = labelled.pairs
    q, y = np.asarray(pairs.q), np.asarray(pairs.y, dtype=np.float64)
    usable_queries = selecting_queries(pairs, relevant_min)
    report = {"queries": int(len(usable_queries)), "min_queries": MIN_LABELLED_QUERIES, "applied": False}
    if len(usable_queries) < MIN_LABELLED_QUERIES:
        return report
    net = model.net
    spec = net.metric_spec()
    channels = list(net.channel_names)
    pair_keys = [f"{a}|{b}" for a, b, _ in spec["pairs"]]
    use_bm25 = labelled.lexical is not None and bool(net.use_bm25)
    grid = {k: v for k, v in model.siamese_config.grid.items() if k in channels or (use_bm25 and k == "bm25")}
    combos = grid_combinations(channels, pair_keys, grid, spec, use_bm25)
    keep = np.isin(q, usable_queries)
    dist = pair_distances(model, labelled.queries, labelled.tickets, pairs)[keep]
    ratio = np.asarray(labelled.lexical)[keep] if use_bm25 else None
    table = GroupTable(q[keep], y[keep], relevant_min)
    before = table.map(_scores(model, dist, ratio))  # the weights as they are, scored as `pair_scores` scores them
    ap = np.concatenate([table.per_query_ap(g) for g in combination_scores(
        dist, combos, channels, pair_keys, None if ratio is None else 1.0 - ratio)])
    means = ap.mean(axis=1)
    best = int(np.argmax(means))
    stderr = standard_error(ap[best])
    used = [sum(1 for c in channels if w[c] > 0) + int(bool(w.get("bm25"))) for w in combos]
    pick = simplest_near_best(means, stderr, lambda i: used[i])[0]
    chosen = combos[pick]
    report.update(objective=f"rerank MAP of {len(usable_queries)} labelled queries over their "
                            f"{int(keep.sum())} labelled tickets",
                  before=before, value=float(means[pick]),
                  best=float(means[best]), stderr=stderr, applied=True,
                  channels={c: float(chosen[c]) for c in channels},
                  bm25=float(chosen["bm25"]) if use_bm25 else float(spec["bm25"]))
    net.set_weights([v for *_, v in spec["pairs"]], report["channels"], report["bm25"])
    model.invalidate()
    return report


def observable_pairs(config: SiameseConfig, mined: MinedPairs) -> list[bool]:
    """Which metric pairs the mined pairs show: never a pair against the ticket's SUBJECT (the views have none),
    a pair from the query's DESCRIPTION only when most mined queries carry a description prefix."""
    with_prefix = mined.stats["with_prefix"] > mined.stats["minable_tickets"] / 2
    out = []
    for a, b, _ in config.metric_pairs:
        out.append(b != "SUB" and (a != "DESC" or with_prefix))
    if not any(out):
        raise InputError("no metric pair of this configuration can be learnt from mined pairs (every pair compares "
                         "against the ticket's subject, which mined targets leave out); add a pair such as "
                         "SUB→DESC to the configuration, or train with labelled pairs (--train FILE --no-mined)")
    return out


def pairs_against_empty_fields(pairs: Sequence[Sequence], tickets: Sequence[Ticket]) -> list[bool]:
    """[P] bool: the metric pairs (query side, ticket side, weight) whose ticket side is a field that no ticket fills
    (SeaMonkey's SOLUTION). Such a pair compares each query with the same empty text for every ticket: it ranks
    nothing, but its distance grows with the query's text, so it would lower the score of a long query (a ticket
    pasted whole) against a short one (a subject) for the same match, and the calibration cannot tell them apart."""
    filled = {"SUB": any(t.subject.strip() for t in tickets),
              "DESC": any((t.description or "").strip() for t in tickets),
              "SOL": any((t.solution or "").strip() for t in tickets)}
    filled[MERGED] = any(filled.values())
    return [not filled[b] for _, b, *_ in pairs]  # `SiameseConfig.validate`: a ticket side is one of these


def on_filled_fields(spec: dict, tickets: Sequence[Ticket]) -> tuple[dict, list[str]]:
    """`spec` with each pair against a field that no ticket of `tickets` fills at 0 (`pairs_against_empty_fields`),
    and those pairs ("SUB-SOL", ...)."""
    empty = pairs_against_empty_fields(spec["pairs"], tickets)
    filled = {**spec, "pairs": [(a, b, 0.0 if e else v) for (a, b, v), e in zip(spec["pairs"], empty)]}
    return filled, [f"{a}-{b}" for (a, b, _), e in zip(spec["pairs"], empty) if e]


def set_weights_on_filled_fields(model: TicketModel, spec: dict, tickets: Sequence[Ticket]) -> list[str]:
    """Set the metric weights of `spec` on `model`, each pair against a field that no ticket of `tickets` fills at
    0 (`on_filled_fields`); returns those pairs ("SUB-SOL", ...)."""
    filled, unfilled = on_filled_fields(spec, tickets)
    model.net.set_weights([v for *_, v in filled["pairs"]], filled["channels"], filled["bm25"])
    model.invalidate()
    return unfilled


def restored_pairs(spec: dict, configured: Sequence[float], observable: Sequence[bool]) -> list[float]:
    """Pair weights for serving: the selected ones, and for a pair the mined data cannot show, the weight of an
    observed pair of the same kind (same level: SUB1–SUB2 takes DESC1–DESC2's, as Table 2 weighs them alike),
    else its configured weight relative to the selected scale."""
    scale = _scale_of(spec, configured, observable)
    same_level = [v for (a, b, v), o in zip(spec["pairs"], observable) if o and a == b]
    out = []
    for (a, b, v), c, o in zip(spec["pairs"], configured, observable):
        if o:
            out.append(v)
        elif a == b and same_level:
            out.append(same_level[0])
        else:
            out.append(c * scale)
    return out


def _scale_of(spec: dict, configured: Sequence[float], observable: Sequence[bool]) -> float:
    """How much the observable pair weights grew against their configured values (unit scaling and selection)."""
    now = np.array([v for *_, v in spec["pairs"]])
    conf = np.asarray(configured, dtype=np.float64)
    obs = np.asarray(observable, bool) & (conf > 0)
    return float(now[obs].sum() / conf[obs].sum()) if obs.any() and conf[obs].sum() > 0 else 1.0
