"""Label-free training: a knowledge base of tickets and no labelled pairs in, a calibrated TicketModel out.

    1. the unsupervised parts, from the knowledge-base text: Punkt, vocabulary, word2vec, char vocabulary,
       DocNADE (`training._unsupervised_parts`, as labelled training builds them);
    2. pairs mined from the tickets (`mining.py`): a ticket's subject → its other fields, 4 negatives each (half
       hard), augmented variants (`augment.py`, synonyms from the word2vec neighbours), a held-out slice by ticket;
       labelled pairs and engineers' feedback, when there are some, are added to them (weighted);
    3. the Siamese LSTM trained on the mined pairs (`training.fit`: MSE plus an in-batch ranking loss, Adadelta,
       early stopping on the slice);
    4. channel and pair weights selected by rank on the held-out slice: each held-out query ranks every ticket's
       view, and each paraphrase query (its subject reworded) every full view (the view with its subject), and the
       weights with the best MRR@10 of the own ticket over both win;
    5. calibration (`Calibrator.fit_centered`) on pairs scored as serving scores them: a held-out ticket's own
       subject query against the full ticket (YES 5), against random tickets (NO 1) and against a ticket it ranks
       between 5th and 20th (NO 1: what an unrelated best match scores, `band_negatives`; left out where those score
       more like the own tickets than like random ones, a knowledge base of large clusters, when S ranks:
       `band_is_no`), plus
       any labels.

Pairs whose ticket side the mined training pairs never show (the view has no subject, so SUB1–SUB2; DESC1–…
without a description prefix) are left out of training (weight 0 meanwhile); SUB1–SUB2 is selected on the
paraphrase queries, and a pair no slice shows keeps the configuration's weight (`_restored_pairs`).
"""
from __future__ import annotations

import itertools
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from tqdm import tqdm

from ..config import usable_cpus
from ..data.records import NO, YES, Query, Ticket, component_text, query_text
from ..data.store import Dataset
from ..errors import InputError
from ..lexical.bm25 import Bm25Scorer
from .augment import Augmenter, induce_synonyms
from .bundle import Prepared, TicketModel, _package_versions
from .calibration import Calibrator
from . import grid_ranks
from .grid_ranks import MRR_K, reciprocal_ranks, weighting_ranks
from .mining import MinedPairs, MiningConfig, mine_pairs, require_minable
from .template_lines import TemplateLines
from .adaptation import keep_saved_encoder
from .static_fit import fit_static_encoder, runs_static
from .siamese import MERGED, TABLE2_PAIRS, ReplicatedSiameseLSTM, SiameseConfig
from .training import (PairSet, PreparedPairs, _seed_everything, _unit_scale, _unsupervised_parts, cross_scores,
                       dataset_fingerprint, fit, lexical_features, pair_scores)
from .vocab import EOS, UNK_ID

#: The weight grid of label-free selection. The held-out slice holds hundreds of queries ranked against the
#: whole knowledge base (a labelled dev set has tens), so the grid can afford 0 for every channel, for the levels
#: the held-out queries show (SUB–SUB through the paraphrase queries, DESC–DESC, SUB–DESC, the merged texts) and a
#: wider BM25 range; which channels and levels serve is then the knowledge base's decision.
LABEL_FREE_GRID = {
    "h": [0.0, 0.1, 0.3, 0.7], "E": [0.0, 0.1, 0.3, 1.0], "T": [0.0, 0.1, 0.3], "S": [0.0, 0.3, 1.0, 3.0],
    "C": [0.0, 0.3, 1.0], "V": [0.0, 0.3, 1.0], "bm25": [0.0, 0.1, 0.3, 1.0, 3.0],
    "SUB|SUB": [0.0, 0.1, 0.3], "DESC|DESC": [0.0, 0.3, 0.4], "SUB|DESC": [0.0, 0.1, 0.2, 0.4], "SUB|SOL": [0.1, 0.2],
    "DESC|SOL": [0.1, 0.2], "ALL|ALL": [0.0, 0.3, 1.0],
}
#: Label-free pairs: Table 2's five, and the merged texts (query SUB+DESC against ticket SUB+DESC+SOL) as one more
#: level. A sentence encoder reads a whole ticket better than its fields apart, and a help desk's duplicates are
#: whole tickets; the held-out selection decides its weight (0 drops it).
LABEL_FREE_PAIRS = [list(p) for p in TABLE2_PAIRS] + [[MERGED, MERGED, 0.3]]
#: Weight of the in-batch ranking loss beside MSE (`training.in_batch_ranking_loss`). A mined pair says which of the
#: knowledge base's tickets a query belongs to, a ranking, not a 1–5 grade; with MSE alone on 1:4 pairs the LSTM
#: ranked the held-out slice at random (h alone: held-out MRR@10 0.004 on SeaMonkey, 0.010 on SemEval-2016).
#: Chosen on the mined held-out slices of both (see docs/internals.md), never on their labels.
RANK_LOSS = 1.0
#: Token updates of the knowledge base's word2vec in label-free training without S (`word2vec_updates`): ceil(updates /
#: tokens) epochs, 20 to 400 (`embeddings.word2vec_epochs`). A knowledge base is a corpus of 10^5 tokens: at 20 epochs
#: SumEMB of its vectors found a mined held-out query's own ticket at MRR@10 0.078 on SeaMonkey (100,000 tokens), at
#: 200 epochs 0.269 and at 400 0.300 (SemEval-2016 train-part2: 0.131 → 0.420 → 0.448;
#: `benchmarks/word2vec_epochs.py`). The default with S lost SemEval-2016 dev MAP with the budget of 20 M (79.63 →
#: 77.48), so with S word2vec keeps the config's epochs: docs/internals.md, "Learning without labels", step 1.
W2V_UPDATES = 40_000_000
#: Held-out rankings score at most this many views per query (the own view always among them).
MAX_RANKED_VIEWS = 3000
#: The Siamese LSTM trains on the pairs of at most this many mined training queries (`lstm_training_pairs`), a seeded
#: sample when there are more: about 9 pairs per ticket over 4 epochs made it the one stage that kept growing with the
#: knowledge base (947 s of 31.5 min at 4,000 tickets; 514 s of 23.9 with the cap), where S's adaptation, the weight
#: selection and the calibration band were capped. 4,000 queries are mined from 2,200 to 2,400 tickets (augmented
#: subjects included): SeaMonkey's 1,076 and SemEval-2016's train-part2 train as before. Half of SeaMonkey's queries
#: moved its held-out selection by less than one standard error (docs/internals.md, "Learning without labels", 4).
MAX_LSTM_QUERIES = 4000
#: Random NO tickets per held-out query in the calibration pairs.
CALIBRATION_NEGATIVES = 4
#: Ranks (among the other tickets, by the model's score) from which each calibration query takes one more NO ticket
#: (`band_negatives`), and how many tickets it ranks (a random sample when the knowledge base is larger).
CALIBRATION_BAND = (5, 20)
BAND_TICKETS = 1000
#: The band's tickets are not NO pairs when their median raw score lies at least this far from the random tickets'
#: toward the queries' own tickets' (`band_position`; 0.5: nearer the own tickets than the random ones): there they
#: are mostly the query's own problem, a help desk whose tickets recur in large clusters (a synthetic one of 30
#: problems: 0.67; SeaMonkey 0.16, SemEval-2016 0.19-0.29; docs/internals.md, "Kept: the band left out where it
#: scores like the own tickets"), for models that rank with S (`band_is_no`).
BAND_AS_OWN = 0.5
#: Query-view cells (over all slices) from which the grid's pair weightings are ranked on several threads when numba
#: is missing: below it numpy's small operations hold the GIL, and two threads took twice one thread's time (3 slices
#: of 40 queries × 200 views: 24,000 cells; SeaMonkey's 3 × 161 × 1,074 = 519,000 ran 1.35 times faster on two). The
#: compiled ranking (`grid_ranks`) runs without the GIL: two threads 2.2–2.5 times faster than one at either size.
THREADED_RANKING_CELLS = 200_000
#: Most threads the grid's ranking takes by default (numpy's is memory-bandwidth bound: two gave 1.35–1.5 times one).
MAX_RANKING_THREADS = 8
#: The selection slice of held-out tickets pasted whole (`selection_slices`): a condition, not pooled.
PASTED = "pasted"


def lstm_training_pairs(pairs: PairSet, seed: int, cap: int | None = None) -> PairSet:
    """`pairs` whole when at most `cap` (default `MAX_LSTM_QUERIES`) queries hold them, else the pairs of a seeded
    sample of `cap` queries (each with its positive and negatives), for the Siamese LSTM's training."""
    cap = MAX_LSTM_QUERIES if cap is None else cap
    if len(pairs.queries) <= cap:
        return pairs
    rows = np.sort(np.random.default_rng([seed, cap]).choice(len(pairs.queries), cap, replace=False))
    return pairs.of_queries(rows)


def word2vec_updates(config: SiameseConfig) -> int:
    """Token updates of the knowledge base's word2vec in label-free training: `W2V_UPDATES` for a configuration
    without the sentence encoder S, 0 (the config's `w2v_epochs`) with it."""
    return 0 if "S" in config.active_channels else W2V_UPDATES


def label_free_config(pretrained: bool = True, **overrides) -> SiameseConfig:
    """The default configuration of label-free training: h, E, T (+ S with `pretrained`) and BM25 over Table 2's
    pairs and the merged texts (`LABEL_FREE_PAIRS`), weights selected on the mined held-out slice from
    `LABEL_FREE_GRID`, 4 epochs, MSE plus the in-batch ranking loss (`RANK_LOSS`)."""
    channels = {"h": 0.7, "E": 0.1, "T": 0.2}
    if pretrained:
        channels["S"] = 0.3
    data = dict(pairs=[list(p) for p in LABEL_FREE_PAIRS], channels=channels, bm25=0.3, weights="grid",
                grid={k: list(v) for k, v in LABEL_FREE_GRID.items()}, epochs=4, patience=2, rank_loss=RANK_LOSS)
    data.update(overrides)
    return SiameseConfig().replace(**data)


# ---------------------------------------------------------------------------------------------------------------
# reporting helpers
# ---------------------------------------------------------------------------------------------------------------
class _Stages:
    """Times each stage of training and tells the user (one line per stage)."""

    def __init__(self, echo: Callable[[str], None]):
        self.echo, self.seconds = echo, {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.time()
        yield
        self.seconds[name] = round(time.time() - started, 1)
        self.echo(f"[{self.seconds[name]:7.1f} s] {name}")


def oov_rate(model: TicketModel, tickets: Sequence[Ticket]) -> dict:
    """Share of the knowledge base's word occurrences without a word vector: outside the vocabulary (seen fewer
    than min_count times) or absent from the word vectors (a user's file); such words have only their char part."""
    vectors = model.net.embedder.words.weight.detach().numpy()
    has_vector = np.abs(vectors).sum(1) > 0
    total = missing = 0
    for t in tickets:
        comps = model.featurizer.ticket_tokens(model.model_input(t))
        for name, comp in comps.items():
            if name == MERGED and len(comps) > 1:  # the merged text repeats the other components' words
                continue
            for tok in comp:
                if tok == EOS:
                    continue
                total += 1
                i = model.vocab.index.get(tok, UNK_ID)
                missing += int(i == UNK_ID or not has_vector[i])
    return {"tokens": total, "without_vector": missing, "rate": missing / total if total else 0.0}


# ---------------------------------------------------------------------------------------------------------------
# rank-based weight selection on the held-out slice
# ---------------------------------------------------------------------------------------------------------------
def rank_distances(model: TicketModel, queries: Prepared, views: Prepared) -> np.ndarray:
    """[P, C, Q, N] L1 distances of every metric pair and channel between Q prepared queries and N prepared views."""
    q, t = model.encode_prepared(queries), model.encode_prepared(views)
    net = model.net
    out = np.zeros((len(net.pairs), len(net.channel_names), len(queries.tokens), len(views.tokens)), np.float32)
    for p, (a, b) in enumerate(net.pairs):
        for c, ch in enumerate(net.channel_names):
            out[p, c] = torch.cdist(torch.from_numpy(q[f"{a}.{ch}"]).double(), torch.from_numpy(t[f"{b}.{ch}"]).double(),
                                    p=1).numpy()
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

    def reciprocal_ranks(self, spec: dict) -> np.ndarray:
        """Per-query 1/rank (within the top 10, else 0) of the weights `spec`."""
        pw = np.array([v for *_, v in spec["pairs"]]) * np.asarray(self.observable, bool)
        cw = np.array(list(spec["channels"].values()), np.float32)
        d = np.einsum("pcqn,p,c->qn", self.dist, pw, cw)
        if self.lexical is not None and spec["bm25"]:
            d = d + spec["bm25"] * (1.0 - self.lexical)
        return reciprocal_ranks(d, self.truth)

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
        stderr = float(best_rr.std(ddof=1) / np.sqrt(len(best_rr))) if len(best_rr) > 1 else 0.0
        ranking = cls(combinations, used, means, best, stderr, -1, eligible,
                      condition_means if condition is not None else None,
                      condition_best if condition is not None else None, condition_stderr)
        ranking.chosen = int(min(ranking.near(), key=lambda i: (used[i], -means[i], i)))
        return ranking

    def near(self) -> np.ndarray:
        """The eligible combinations within one standard error of the best: those the selection cannot tell
        apart, among which it takes the simplest."""
        return np.flatnonzero(self.eligible & (self.means >= self.means[self.best] - self.stderr))


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


# ---------------------------------------------------------------------------------------------------------------
# pairs
# ---------------------------------------------------------------------------------------------------------------
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


def set_weights_on_filled_fields(model: TicketModel, spec: dict, tickets: Sequence[Ticket]) -> list[str]:
    """Set the metric weights of `spec` on `model`, each pair against a field that no ticket of `tickets` fills at
    0 (`pairs_against_empty_fields`); returns those pairs ("SUB-SOL", ...)."""
    empty = pairs_against_empty_fields(spec["pairs"], tickets)
    model.net.set_weights([0.0 if e else v for (*_, v), e in zip(spec["pairs"], empty)], spec["channels"],
                          spec["bm25"])
    model.invalidate()
    return [f"{a}-{b}" for (a, b, _), e in zip(spec["pairs"], empty) if e]


def _concat(a: PairSet, b: PairSet, repeat: int = 1) -> PairSet:
    """The pairs of `a` then those of `b` (each `repeat` times), queries and tickets concatenated."""
    q = np.concatenate([a.q] + [b.q + len(a.queries)] * repeat)
    t = np.concatenate([a.t] + [b.t + len(a.tickets)] * repeat)
    y = np.concatenate([a.y] + [b.y] * repeat)
    return PairSet(a.queries + b.queries, a.tickets + b.tickets, q, t, y)


def calibration_pairs(mined: MinedPairs, kb: Sequence[Ticket], augmenter: Augmenter | None, seed: int) -> PairSet:
    """Pairs scored as serving scores them: each held-out ticket's subject query (with its description prefix,
    a noisy variant of it, and the subject alone) against the full ticket (YES 5) and against
    `CALIBRATION_NEGATIVES` random other tickets (NO 1)."""
    rng = np.random.default_rng(seed + 1)
    row = {t.id: i for i, t in enumerate(kb)}
    queries: list[Query] = []
    q, t, y = [], [], []
    for query, own_view in zip(mined.held_out_queries, mined.held_out_truth):
        own = row[mined.views[int(own_view)].id]
        variants = [query]
        if augmenter is not None:
            text = augmenter.augment(query.subject, key=f"{query.id}:calibration")
            if text and text != query.subject:
                variants.append(Query(text, query.description, id=f"{query.id}:cal"))
        if query.description:  # engineers also search with a subject alone
            variants.append(Query(query.subject, "", id=f"{query.id}:subject"))
        others = rng.choice(np.delete(np.arange(len(kb)), own), min(CALIBRATION_NEGATIVES, len(kb) - 1), replace=False)
        for variant in variants:
            qi = len(queries)
            queries.append(variant)
            for r, label in [(own, YES)] + [(int(o), NO) for o in others]:
                q.append(qi)
                t.append(r)
                y.append(label)
    used = sorted(set(t))  # only the tickets the pairs name (preparing a ticket runs the S and T encoders)
    at = {r: i for i, r in enumerate(used)}
    return PairSet(queries, [kb[r] for r in used], np.array(q, np.int64), np.array([at[r] for r in t], np.int64),
                   np.array(y, np.float64))


def band_negatives(model: TicketModel, cal: PreparedPairs, kb: Sequence[Ticket], kb_scorer: Bm25Scorer | None,
                   seed: int, progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(g, y) of one more NO pair per calibration query: a ticket it ranks at a random place between
    `CALIBRATION_BAND`'s ranks among the other tickets (its own, and any ticket `cal` labels above NO, left out;
    `BAND_TICKETS` of them, sampled from a larger knowledge base), scored as serving scores it.

    A query has few related tickets, so its 5th to 20th are mostly not what it needs, yet they are its closest
    unrelated ones. An off-topic query's best result is such a ticket: its best match in a knowledge base that does
    not hold its topic. Random tickets alone leave the calibrator no NO examples where those fall, and it climbed
    from 1.1 to 4.5 between them and the own tickets wherever its knots happened to lie (docs/internals.md, "The
    score promises")."""
    rng = np.random.default_rng(seed + 3)
    rows = np.arange(len(kb))
    if len(rows) > BAND_TICKETS:
        rows = np.sort(rng.choice(rows, BAND_TICKETS, replace=False))
    sample = [kb[int(r)] for r in rows]
    pairs = cal.pairs
    lexical = None if kb_scorer is None else np.stack([kb_scorer.lexical(query_text(q), rows) for q in pairs.queries])
    g = cross_scores(model, cal.queries, model.prepare(sample, "ticket", progress), lexical)
    n_q = len(g)
    column = {t.id: j for j, t in enumerate(sample)}
    for q, t, y in zip(pairs.q, pairs.t, pairs.y):  # a query's own or relevant tickets are never its band
        j = column.get(pairs.tickets[int(t)].id)
        if y > NO and j is not None:
            g[int(q), j] = -np.inf
    others = np.isfinite(g).sum(axis=1)
    low, high = CALIBRATION_BAND
    ranks = np.minimum(rng.integers(low, high + 1, size=n_q), others) - 1  # 0-based, the left-out tickets last
    band = np.take_along_axis(-np.sort(-g, axis=1), np.maximum(ranks, 0)[:, None], axis=1)[:, 0]
    keep = ranks >= 0
    return band[keep], np.full(int(keep.sum()), float(NO))


def band_position(own: np.ndarray, random: np.ndarray, band: np.ndarray) -> float:
    """Where the band's median raw score lies from the random tickets' (0) to the queries' own tickets' (1), from the
    raw scores of the calibration pairs of each kind; NaN when the own tickets' median is not above the random ones'
    (or a kind is missing)."""
    if not (len(own) and len(random) and len(band)):
        return float("nan")
    low, high = float(np.median(random)), float(np.median(own))
    return (float(np.median(band)) - low) / (high - low) if high > low else float("nan")


def band_is_no(position: float, model: TicketModel) -> bool:
    """Whether the band's tickets calibrate as NO pairs for `model`: unless they lie `BAND_AS_OWN` of the way to the
    own tickets or further (`band_position`), where they are mostly the queries' own problem and NO would undersell
    true matches, and `model` ranks with the pretrained S, under which an off-topic query's best result lies far
    below them. Without S it scores like them (E reaches unknown words through the character BiLSTM): the paper's
    channels on the cluster benchmark, band at 0.58, would score off-topic queries 2.29-3.41 without the band's NO
    pairs, 1.70-1.83 with them (docs/internals.md), so there the band stays NO."""
    return not (position >= BAND_AS_OWN and model.metric_spec()["channels"].get("S", 0) > 0)


def mined_band_position(parts: dict[str, tuple[np.ndarray, np.ndarray]]) -> float:
    """`band_position` of `mined_calibration`'s parts (NaN when there are none)."""
    def raw(kind: str) -> np.ndarray:
        return next((g for name, (g, _) in parts.items() if kind in name), np.empty(0))

    return band_position(raw("own-ticket"), raw("random"), raw("ranked"))


def mined_calibration(model: TicketModel, tickets: Sequence[Ticket], kb_scorer: Bm25Scorer | None,
                      progress: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A label-free model's own kinds of calibration pairs, mined again from `tickets` with the mining config and
    seed its training recorded and scored by `model` as serving scores them: {"mined own-ticket YES", "mined random
    NO", "mined ranked 5th-20th NO": (g, y)}. What `train --with-feedback` refits the calibrator on besides the
    judgements, so that a few judgements adjust the score scale rather than define it; the refit takes the band's
    pairs only where `band_is_no(mined_band_position(parts), model)`, as training decided. Empty for a model not trained
    label-free, or when `tickets` cannot be mined."""
    training = model.meta.get("training") or {}
    if training.get("mode") != "label-free" or "config" not in (training.get("mining") or {}):
        return {}
    seed = int(model.meta.get("seed", 0))
    mining = MiningConfig.from_saved(training["mining"]["config"])
    augmenter = vocabulary_augmenter(model.vocab, model.net.embedder.words.weight.detach().cpu().numpy(), seed)
    try:
        mined = mine_pairs(list(tickets), mining, seed, augmenter)
    except InputError:  # too few tickets, or two with one id
        return {}
    cal, cal_data = _prepared_calibration(model, mined, tickets, augmenter, kb_scorer, seed, progress)
    g = pair_scores(model, cal_data)
    yes = cal.y == YES
    low, high = CALIBRATION_BAND
    return {"mined own-ticket YES": (g[yes], cal.y[yes]), "mined random NO": (g[~yes], cal.y[~yes]),
            f"mined ranked {low}th-{high}th NO": band_negatives(model, cal_data, tickets, kb_scorer, seed, progress)}


def _prepared_calibration(model: TicketModel, mined: MinedPairs, tickets: Sequence[Ticket], augmenter: Augmenter,
                          kb_scorer: Bm25Scorer | None, seed: int, progress: bool) -> tuple[PairSet, PreparedPairs]:
    """The calibration pairs of `mined` (`calibration_pairs`) and the same prepared by `model`, with the lexical
    feature over `kb_scorer`'s knowledge base when given."""
    cal = calibration_pairs(mined, tickets, augmenter, seed)
    return cal, PreparedPairs.of(model, cal, lexical_features(cal, kb_scorer) if kb_scorer is not None else None,
                                 progress)


def adaptation_negatives(mined: MinedPairs, pairs: Sequence[tuple[int, int]], seed: int) -> tuple[list[int], int]:
    """A negative view row for each adaptation pair (training query index, its own view row): the query's hardest
    mined negative (`MinedPairs.train_hard`) when that is a training ticket's view, else a random training ticket's
    view (seeded); never a held-out ticket's, which judge the adapted encoder, nor its own. Returns the rows and how
    many of them are hard."""
    held = set(mined.held_out_truth.tolist())
    training_rows = [r for r in range(len(mined.views)) if r not in held]
    if len(training_rows) < 2:
        raise InputError("hard negatives for the adaptation need at least 2 training tickets")
    rng = np.random.default_rng(seed + 11)
    rows, hard = [], 0
    for qi, own in pairs:
        row = int(mined.train_hard[qi])
        if row >= 0 and row != own and row not in held:
            hard += 1
        else:
            row = own
            while row == own:
                row = training_rows[int(rng.integers(len(training_rows)))]
        rows.append(row)
    return rows, hard


def adapt_sentence_encoder(model: TicketModel, mined: MinedPairs, mining: MiningConfig, seed: int,
                           progress: bool) -> dict:
    """Fine-tune S on the training tickets' (query, own view) pairs (`adaptation.adapt`); keep it in `model` (meta
    "sentence_encoder" and `sentence_encoder_dir`) only when its held-out MRR@10 (query text against every view's
    text, cosine) beats the packaged encoder's, both on the model's backend (on ONNX int8 for the static backend,
    whose vectors are then fitted to the encoder kept). With `mining.adapt_hard_negatives` each pair also has a
    negative (`adaptation_negatives`). Returns both figures and the decision."""
    from .adaptation import adapt, discard, load_adapted, scratch_directory
    from .pretrained import get_encoder, selected

    rng = np.random.default_rng(seed + 3)
    clean_queries: dict[int, int] = {}  # view row → the index of its own (not augmented) training query
    for qi, ti, y in zip(mined.train_q, mined.train_t, mined.train_y):
        if y == YES and ":aug" not in (mined.train_queries[int(qi)].id or ""):
            clean_queries.setdefault(int(ti), int(qi))
    rows = sorted(clean_queries)
    if len(rows) > mining.adapt_pairs:
        rows = sorted(rng.choice(rows, mining.adapt_pairs, replace=False).tolist())
    read = model.model_input  # the texts as the model reads them (without template lines)
    anchors = [query_text(read(mined.train_queries[clean_queries[r]])) for r in rows]
    positives = [component_text(read(mined.views[r]), "DESC+SOL") for r in rows]
    negatives, hard = None, 0
    if mining.adapt_hard_negatives:
        negative_rows, hard = adaptation_negatives(mined, [(clean_queries[r], r) for r in rows], seed)
        negatives = [component_text(read(mined.views[r]), "DESC+SOL") for r in negative_rows]
    directory = scratch_directory()
    files = adapt(anchors, positives, directory, negatives=negatives, seed=seed, epochs=mining.adapt_epochs,
                  max_seq_length=mining.adapt_max_tokens, progress=progress)

    truth = mined.held_out_truth
    ranked = ranked_rows(len(mined.views), truth, rng)
    own = np.searchsorted(ranked, truth)
    texts = [component_text(read(mined.views[int(r)]), "DESC+SOL") for r in ranked]
    queries = [query_text(read(q)) for q in mined.held_out_queries]
    figures = {}
    backend = selected()[1]
    if backend == "static":  # static vectors are fitted to the (adapted) transformer afterwards: judge that one
        backend = "onnx-int8"
    for name, encoder in (("base", get_encoder(backend)), ("adapted", load_adapted(directory, files, backend))):
        sim = encoder.encode(queries) @ encoder.encode(texts, progress=progress).T
        figures[name] = mrr_at_k(-sim, own)
    kept = figures["adapted"] > figures["base"]
    if kept:
        model.meta["sentence_encoder"] = {"base": "all-MiniLM-L6-v2", "loss": "MultipleNegativesRankingLoss",
                                          "pairs": len(anchors), "epochs": mining.adapt_epochs, "files": files}
        model.sentence_encoder_dir = directory  # until the model is saved (`keep_saved_encoder`)
    else:
        discard(directory)
    return {**figures, "kept": kept, "pairs": len(anchors), **({"hard_negatives": hard} if negatives else {})}


# ---------------------------------------------------------------------------------------------------------------
# the recipe
# ---------------------------------------------------------------------------------------------------------------
def vocabulary_augmenter(vocab, vectors: np.ndarray, seed: int) -> Augmenter:
    """The augmenter of label-free mining: synonyms induced from the model's word vectors (one row per token of
    `vocab`, a `Vocabulary`), extra words from its frequent words."""
    synonyms = induce_synonyms(vocab.tokens, vectors, vocab.counts)
    extra = [w for w, c in zip(vocab.tokens, vocab.counts) if c >= 3 and w.isalpha() and len(w) > 2][:5000]
    return Augmenter(synonyms, extra, seed=seed)


def train_without_labels(tickets: Sequence[Ticket], config: SiameseConfig | None = None,
                         out_dir: str | Path | None = None, *, seed: int = 0, labelled: Dataset | None = None,
                         mining: MiningConfig | dict | None = None, word_vectors: str | Path | None = None,
                         progress: bool = True, echo: Callable[[str], None] | None = None,
                         channel_encoders: dict | None = None) -> TicketModel:
    """Train a calibrated TicketModel on the knowledge base `tickets` alone (plus `labelled` pairs, e.g. engineers'
    feedback, when given: added to the mined pairs `labelled_weight` times and to the calibration pairs); save it
    to `out_dir` when given. `channel_encoders` computes the extra channels C / V the config weighs
    (`extra_channels.py`). Deterministic for a seed. Raises InputError when the tickets cannot be mined."""
    started = time.time()
    echo = echo or (lambda line: tqdm.write(line) if progress else None)
    config = config or label_free_config()
    mining = mining if isinstance(mining, MiningConfig) else MiningConfig.from_dict(mining)
    torch.set_num_threads(1)
    _seed_everything(seed)
    tickets = list({t.id: t for t in tickets}.values())
    stages = _Stages(echo)
    labelled_pairs = None
    if labelled is not None and labelled.pairs:
        labelled_pairs = PairSet.from_dataset(labelled, "labelled")
        kb_ids = {t.id for t in tickets}
        tickets += [t for t in labelled.tickets if t.id not in kb_ids]
    require_minable(tickets, mining)  # fail before the slow stages

    with stages("word vectors, Punkt, vocabulary, DocNADE"):
        splitter, vocab, chars, vectors, w2v_source, topic_model, topic_vocab = _unsupervised_parts(
            config, tickets, list(labelled.queries) if labelled_pairs is not None else [], seed, word_vectors, progress,
            w2v_updates=word2vec_updates(config))
    _seed_everything(seed)
    net = ReplicatedSiameseLSTM(config, vectors, len(chars))
    meta = {"data_fingerprint": dataset_fingerprint(Dataset(tickets), labelled), "seed": seed,
            "word_vectors": w2v_source, "packages": _package_versions(), "kb_text": "the knowledge base's tickets"}
    if mining.template_share > 0:
        template = TemplateLines.learn(tickets, mining.template_share)
        if len(template):
            meta["template_lines"] = template.to_dict()
        echo(f"template lines: {len(template):,} lines recur in at least {100 * mining.template_share:g} % of the "
             "tickets that fill their field, beside other lines (" + ", ".join(
                 f"{name} {len(lines):,}" for name, lines in template.lines.items())
             + "); the learned channels leave them out, BM25 reads them")
    model = TicketModel(config, vocab, chars, splitter, net, None, topic_model, topic_vocab, meta,
                        channel_encoders=channel_encoders)
    oov = oov_rate(model, tickets)
    echo(f"out-of-vocabulary: {100 * oov['rate']:.1f} % of {oov['tokens']:,} word occurrences have no word vector "
         f"(seen < {config.min_count} times{' or not in ' + str(word_vectors) if word_vectors else ''}); "
         "their char-BiLSTM part still represents them")

    with stages("mining pairs"):
        augmenter = vocabulary_augmenter(vocab, vectors, seed)
        mined = mine_pairs(tickets, mining, seed, augmenter)
    s = mined.stats
    echo(f"mined {s['train_pairs']:,} training pairs ({s['train_queries']:,} queries from "
         f"{s['minable_tickets'] - s['held_out_tickets']:,} tickets, {s['augmented_queries']:,} of them augmented; "
         f"{len(augmenter.synonyms):,} words with induced synonyms) and {s['held_out_pairs']:,} held-out pairs "
         f"({s['held_out_tickets']:,} tickets); 1 positive : {mining.negatives} negatives "
         f"({int(round(mining.negatives * mining.hard_share))} hard)"
         + (f"; plus {len(labelled_pairs):,} labelled pairs ×{mining.labelled_weight}" if labelled_pairs else ""))

    observable = observable_pairs(config, mined)
    adapted = None
    if "S" in config.active_channels and mining.adapt_pretrained:
        with stages("adapting the sentence encoder S to the knowledge base"):
            adapted = adapt_sentence_encoder(model, mined, mining, seed, progress)
        echo(f"sentence encoder S: held-out MRR@{MRR_K} {adapted['base']:.3f} packaged, {adapted['adapted']:.3f} "
             f"adapted on {adapted['pairs']:,} mined pairs"
             + (f" ({adapted['hard_negatives']:,} with a hard negative)" if "hard_negatives" in adapted else "")
             + f": {'kept' if adapted['kept'] else 'not kept'}")
    static_fit = None
    if runs_static(model):
        with stages("fitting the static S vectors to the knowledge base"):
            static_fit = fit_static_encoder(model, tickets, seed, progress)
        if static_fit:
            echo(f"static S vectors fitted on {static_fit['texts']:,} texts of the knowledge base: held-out cosine "
                 f"distance to the transformer {static_fit['held_out_distance_mapped']:.3f} mapped, "
                 f"{static_fit['held_out_distance']:.3f} fitted ({static_fit['epochs']} epochs)")
    with stages("preparing texts (tokens, topics, sentence vectors)"):
        views = list(mined.views)
        train_pairs = lstm_training_pairs(PairSet(mined.train_queries, views, mined.train_q, mined.train_t,
                                                  mined.train_y), seed)
        lstm_queries = len(train_pairs.queries)
        held_pairs = PairSet(mined.held_out_queries, views, mined.held_out_q, mined.held_out_t, mined.held_out_y)
        view_scorer = Bm25Scorer(views)
        kb_scorer = Bm25Scorer(tickets)
        use_lexical = config.bm25 > 0
        train_lex = lexical_features(train_pairs, view_scorer) if use_lexical else None
        held_lex = lexical_features(held_pairs, view_scorer) if use_lexical else None
        if labelled_pairs is not None:
            train_pairs = _concat(train_pairs, labelled_pairs, mining.labelled_weight)
            if use_lexical:
                extra_lex = lexical_features(labelled_pairs, kb_scorer)
                train_lex = np.concatenate([train_lex] + [extra_lex] * mining.labelled_weight)
        tickets_prepared = model.prepare(train_pairs.tickets, "ticket", progress)
        train_data = PreparedPairs(train_pairs, model.prepare(train_pairs.queries, "query", progress),
                                   tickets_prepared, train_lex)
        held_data = PreparedPairs(held_pairs, model.prepare(held_pairs.queries, "query", progress),
                                  tickets_prepared, held_lex)

    spec = net.metric_spec()
    configured_pairs = [v for *_, v in spec["pairs"]]
    net.set_weights([v if obs else 0.0 for v, obs in zip(configured_pairs, observable)], spec["channels"], spec["bm25"])
    history: list[dict] = []
    sample = (f", on the pairs of a sample of {lstm_queries:,} of the {len(mined.train_queries):,} training queries"
              if lstm_queries < len(mined.train_queries) else "")
    with stages(f"training the Siamese LSTM (up to {config.epochs} epochs{sample})"):
        _unit_scale(model, train_data)
        model = fit(model, train_data, held_data, seed=seed, calibrate=False, progress=progress, history=history)
        net = model.net

    selection = None
    if config.weights == "grid":
        with stages("selecting channel and pair weights on the held-out slice"):
            selection, observable = select_on_held_out(model, mined, held_data, tickets_prepared,
                                                       view_scorer if use_lexical else None, observable, seed,
                                                       mining.held_out_pasted, progress)
        echo(f"held-out MRR@{MRR_K}: {selection['before']:.3f} with the configured weights, {selection['value']:.3f} "
             f"with the selected ones (the simplest within one standard error, {selection['stderr']:.3f}, of the best "
             f"grid point, {selection['best']:.3f}; "
             + ", ".join(f"{name} queries {v:.3f}" for name, v in selection["by_slice"].items())
             + "); each channel alone: " + ", ".join(f"{c} {v:.3f}" for c, v in selection["alone"].items()))
        if PASTED in selection:
            p = selection[PASTED]
            echo(f"held-out tickets pasted whole: MRR@{MRR_K} {p['value']:.3f} with the selected weights; "
                 f"{p['eligible']:,} of {p['combinations']:,} weightings were eligible (within one standard error, "
                 f"{p['stderr']:.3f}, of the best, {p['best']:.3f})")
    selected = net.metric_spec()
    restored = _restored_pairs(selected, configured_pairs, observable)
    unfilled = ", ".join(set_weights_on_filled_fields(
        model, dict(selected, pairs=[[a, b, v] for (a, b, _), v in zip(selected["pairs"], restored)]), tickets))
    echo(f"metric weights: {_short(net.metric_spec())}"
         + (f"; weight 0 for the pairs against a field no ticket fills: {unfilled}" if unfilled else ""))

    with stages("calibrating on serving-like pairs"):
        cal, cal_data = _prepared_calibration(model, mined, tickets, augmenter, kb_scorer if use_lexical else None,
                                              seed, progress)
        if labelled_pairs is not None:
            lab_data = PreparedPairs.of(model, labelled_pairs,
                                        lexical_features(labelled_pairs, kb_scorer) if use_lexical else None, progress)
        _unit_scale(model, cal_data)
        cal_g = pair_scores(model, cal_data)
        band_g, band_y = band_negatives(model, cal_data, tickets, kb_scorer if use_lexical else None, seed, progress)
        position = band_position(cal_g[cal.y == YES], cal_g[cal.y != YES], band_g)
        band_as_no = band_is_no(position, model)
        g, y = (np.concatenate([cal_g, band_g]), np.concatenate([cal.y, band_y])) if band_as_no else (cal_g, cal.y)
        if labelled_pairs is not None:
            g, y = np.concatenate([g, pair_scores(model, lab_data)]), np.concatenate([y, labelled_pairs.y])
        model.calibrator = Calibrator.fit_centered(g, y)
    calibrated = model.calibrate(cal_g)
    yes = cal.y == YES
    echo(f"calibrated: held-out own-subject queries score {np.median(calibrated[yes]):.2f} (median), random "
         f"tickets {np.median(calibrated[~yes]):.2f}, the tickets they rank {CALIBRATION_BAND[0]}th to "
         f"{CALIBRATION_BAND[1]}th {np.median(model.calibrate(band_g)):.2f}"
         + ("" if band_as_no else f" (not taken as NO: their raw scores lie {position:.2f} of the way from random "
                                  "tickets' to the own tickets', mostly the same problem, as where tickets recur)"))

    model.meta["training"] = {
        "mode": "label-free", "mining": mined.stats, "lstm_queries": lstm_queries, "oov": oov, "history": history,
        "weight_selection": selection,
        "observable_pairs": [f"{a}|{b}" for (a, b, _), o in zip(config.metric_pairs, observable) if o],
        "labelled_pairs": len(labelled_pairs) if labelled_pairs is not None else 0,
        "calibration_pairs": int(len(y)),
        "calibration_band": {"position": None if np.isnan(position) else round(position, 3), "as_no": band_as_no},
        "stage_seconds": stages.seconds, "sentence_encoder": adapted,
        "static_fit": static_fit,
        "wall_seconds": round(time.time() - started, 1), "trained_at": time.time()}
    model.invalidate()
    if out_dir is not None:
        model.save(out_dir)
        if (adapted and adapted["kept"]) or static_fit:
            keep_saved_encoder(model, out_dir)
    return model


def _restored_pairs(spec: dict, configured: Sequence[float], observable: Sequence[bool]) -> list[float]:
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


def _short(spec: dict) -> str:
    channels = ", ".join(f"{c} {v:g}" for c, v in spec["channels"].items())
    pairs = ", ".join(f"{a}-{b} {v:g}" for a, b, v in spec["pairs"])
    return f"(channels {channels}; BM25 {spec['bm25']:g}; pairs {pairs})"
