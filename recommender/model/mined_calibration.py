"""The calibration pairs of label-free training, mined from the knowledge base and scored as serving scores them.

Each held-out ticket's subject query (and variants of it) against its own full ticket is YES, against random
tickets NO (`calibration_pairs`), and against one ticket it ranks 5th to 20th NO as well (`band_negatives`): what an
unrelated best match scores. Where the band's tickets score like the queries' own (`band_position`), as in a help
desk whose tickets recur in large clusters, they are mostly the same problem and a model that ranks with S leaves
them out (`band_is_no`). `mined_calibration` mines the same pairs again for a saved model, for `train
--with-feedback`'s refit, which decides the band against the tickets engineers judged YES where it has enough of them
(`feedback_band_decision`); training with enough labelled YES pairs beside the mined ones decides it the same way
(`yes_band_decision`).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..data.records import NO, YES, Query, Ticket, query_text
from ..errors import InputError
from ..lexical.bm25 import Bm25Scorer
from .augment import Augmenter, vocabulary_augmenter
from .bundle import TicketModel
from .mining import MinedPairs, MiningConfig, mine_pairs
from .training import CALIBRATION_NEGATIVES, PairSet, PreparedPairs, cross_scores, lexical_features, pair_scores

#: Ranks (among the other tickets, by the model's score) from which each calibration query takes one more NO ticket
#: (`band_negatives`), and how many tickets it ranks (a random sample when the knowledge base is larger).
CALIBRATION_BAND = (5, 20)
BAND_TICKETS = 1000
#: The band's tickets are not NO pairs when their median raw score lies at least this far from the random tickets'
#: toward the queries' own tickets' (`band_position`; 0.5: nearer the own tickets than the random ones): there they
#: are mostly the query's own problem, a help desk whose tickets recur in large clusters (a synthetic one of 30
#: problems: 0.67; SeaMonkey 0.16, SemEval-2016 0.19-0.29; docs/internals.md, "Kept: the band left out where it
#: scores like the own tickets"), for models that rank with S (`band_is_no`). A hard switch: with 100 problems of
#: 7-24 tickets the band lies at 0.48, stays NO and undersells true matches (1.22 at the median, 2.14 without it)
#: until feedback or labelled pairs decide it (`yes_band_decision`).
BAND_AS_OWN = 0.5
#: The fewest YES judgements (or labelled YES pairs) from which `train --with-feedback` (label-free training) places
#: the band between their queries' random tickets and their YES tickets (`yes_band_decision`) rather than following
#: training's decision (the mined band's position).
JUDGED_YES_MIN = 10
#: The names of the calibration parts: the judged queries' band (`train --with-feedback`), and `mined_calibration`'s
#: three kinds.
BAND_NO = f"ranked {CALIBRATION_BAND[0]}th-{CALIBRATION_BAND[1]}th NO"
MINED_OWN, MINED_RANDOM, MINED_BAND = "mined own-ticket YES", "mined random NO", f"mined {BAND_NO}"


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


class BandSamples:
    """The knowledge-base tickets whose ranks give the band (`band_rows`), prepared by one model once per seed:
    training with labelled pairs, and `train --with-feedback`'s refit, rank two sets of queries against the same
    sample (preparing it runs the S and T encoders over every ticket of it)."""

    def __init__(self, model: TicketModel, kb: Sequence[Ticket], progress: bool = False):
        self.model, self.kb, self.progress = model, kb, progress
        self._prepared: dict[int, object] = {}

    def prepared(self, seed: int):
        """The tickets of `band_rows` for `seed`, prepared by the model (`TicketModel.prepare`)."""
        if seed not in self._prepared:
            rows = band_rows(len(self.kb), np.random.default_rng(seed + 3))
            self._prepared[seed] = self.model.prepare([self.kb[int(r)] for r in rows], "ticket", self.progress)
        return self._prepared[seed]


def band_rows(n: int, rng: np.random.Generator) -> np.ndarray:
    """The rows of a knowledge base of `n` tickets that the band ranks: all, or `BAND_TICKETS` drawn by `rng`."""
    rows = np.arange(n)
    return np.sort(rng.choice(rows, BAND_TICKETS, replace=False)) if n > BAND_TICKETS else rows


def band_negatives(model: TicketModel, cal: PreparedPairs, kb: Sequence[Ticket], kb_scorer: Bm25Scorer | None,
                   seed: int, progress: bool = False, samples: BandSamples | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(g, y) of one more NO pair per calibration query: a ticket it ranks at a random place between
    `CALIBRATION_BAND`'s ranks among the other tickets (its own, and any ticket `cal` labels above NO, left out;
    `BAND_TICKETS` of them, sampled from a larger knowledge base), scored as serving scores it. `samples`: `kb`'s
    band samples prepared by `model` to reuse (None: prepared here).

    A query has few related tickets, so its 5th to 20th are mostly not what it needs, yet they are its closest
    unrelated ones. An off-topic query's best result is such a ticket: its best match in a knowledge base that does
    not hold its topic. Random tickets alone leave the calibrator no NO examples where those fall, and it climbed
    from 1.1 to 4.5 between them and the own tickets wherever its knots happened to lie (docs/internals.md, "The
    score promises")."""
    rng = np.random.default_rng(seed + 3)
    rows = band_rows(len(kb), rng)  # the sample's rows, and the draws the ranks below follow
    sample = [kb[int(r)] for r in rows]
    if samples is None:
        samples = BandSamples(model, kb, progress)
    elif samples.model is not model or samples.kb is not kb:
        raise ValueError("band samples prepared by another model or of another knowledge base")
    prepared = samples.prepared(seed)
    pairs = cal.pairs
    lexical = None if kb_scorer is None else np.stack([kb_scorer.lexical(query_text(q), rows) for q in pairs.queries])
    g = cross_scores(model, cal.queries, prepared, lexical)
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


def band_is_no(position: float, model: TicketModel, setting: str = "auto") -> bool:
    """Whether the band's tickets calibrate as NO pairs for `model`: as the mining option `band_as_no` (`setting`) says
    when it is "always" or "never"; with "auto", unless they lie `BAND_AS_OWN` of the way to the own tickets or
    further (`band_position`), where they are mostly the queries' own problem and NO would undersell true matches,
    and `model` ranks with the pretrained S, under which an off-topic query's best result lies far below them.
    Without S it scores like them (E reaches unknown words through the character BiLSTM): the paper's channels on
    the cluster benchmark, band at 0.58, would score off-topic queries 2.29-3.41 without the band's NO pairs,
    1.70-1.83 with them (docs/internals.md), so there the band stays NO."""
    if setting != "auto":
        return setting == "always"
    return not (position >= BAND_AS_OWN and model.metric_spec()["channels"].get("S", 0) > 0)


def mined_band_position(parts: dict[str, tuple[np.ndarray, np.ndarray]]) -> float:
    """`band_position` of `mined_calibration`'s parts (NaN when there are none)."""
    def raw(name: str) -> np.ndarray:
        return parts[name][0] if name in parts else np.empty(0)

    return band_position(raw(MINED_OWN), raw(MINED_RANDOM), raw(MINED_BAND))


def trained_band_is_no(model: TicketModel, parts: dict[str, tuple[np.ndarray, np.ndarray]]) -> bool:
    """Whether `model`'s training took the band as NO pairs: the decision it recorded (`band_is_no` with its
    mining option `band_as_no`), else, for a model trained before decisions were recorded, `band_is_no` of
    `mined_band_position(parts)`."""
    recorded = ((model.meta.get("training") or {}).get("calibration_band") or {}).get("as_no")
    return bool(recorded) if recorded is not None else band_is_no(mined_band_position(parts), model)


def yes_band_decision(model: TicketModel, setting: str, yes: np.ndarray, random: Callable[[], np.ndarray],
                      band: Callable[[], np.ndarray], by: str) -> dict | None:
    """The band decision by tickets known to match their queries: {"as_no", "by": `by`, "position"}, or None.

    With at least `JUDGED_YES_MIN` raw scores in `yes` (queries against tickets engineers judged, or labelled pairs
    marked, YES) and the mining option `setting` "auto": `band_is_no` of where those queries' band (raw g, `band()`)
    lies from their random tickets (`random()`, 0) to the YES tickets (1). Those are different tickets of the query's
    problem, the evidence that mining's own tickets cannot give: a knowledge base of ~15-ticket clusters puts its
    band short of the switch measured against the own tickets, yet where its true matches lie (docs/internals.md).
    None (decide otherwise) with fewer or with the option set; `random` and `band` are called only when they decide
    (ranking the band costs)."""
    if setting != "auto" or len(yes) < JUDGED_YES_MIN:
        return None
    position = band_position(yes, random(), band())
    return {"as_no": band_is_no(position, model), "by": by,
            "position": None if np.isnan(position) else round(position, 3)}


def feedback_band_decision(model: TicketModel, mined_parts: dict[str, tuple[np.ndarray, np.ndarray]],
                           judged_yes: np.ndarray, random: np.ndarray, band: Callable[[], np.ndarray]) -> dict:
    """Whether `train --with-feedback`'s refit takes the band as NO pairs: {"as_no", "position", "by"}.

    By "judged YES" (`yes_band_decision` of the judged queries: `judged_yes` the raw g of their YES pairs, `random`
    of their random tickets, `band()` of their band) where there are enough YES judgements and the model's mining
    option is "auto"; otherwise by "training": its decision (`trained_band_is_no` of `mined_parts`; NO for a model
    not trained label-free), position None."""
    training = model.meta.get("training") or {}
    saved = (training.get("mining") or {}).get("config")
    setting = MiningConfig.from_saved(saved).band_as_no if saved else "auto"
    decision = yes_band_decision(model, setting, judged_yes, lambda: random, band, "judged YES")
    if decision is not None:
        return decision
    return {"as_no": trained_band_is_no(model, mined_parts) if mined_parts else True, "by": "training",
            "position": None}


def mined_calibration(model: TicketModel, tickets: Sequence[Ticket], kb_scorer: Bm25Scorer | None,
                      progress: bool = False, samples: BandSamples | None = None
                      ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A label-free model's own kinds of calibration pairs, mined again from `tickets` with the mining config and seed
    its training recorded and scored by `model` as serving scores them: {`MINED_OWN`, `MINED_RANDOM`, `MINED_BAND`:
    (g, y)}. What `train --with-feedback` refits the calibrator on besides the judgements, so that a few judgements
    adjust the score scale rather than define it; the refit takes the band's pairs only where training did
    (`trained_band_is_no`). Empty for a model not trained label-free, or when `tickets` cannot be mined. `samples`:
    as `band_negatives` takes them."""
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
    cal, cal_data = prepared_calibration(model, mined, tickets, augmenter, kb_scorer, seed, progress)
    g = pair_scores(model, cal_data)
    yes = cal.y == YES
    return {MINED_OWN: (g[yes], cal.y[yes]), MINED_RANDOM: (g[~yes], cal.y[~yes]),
            MINED_BAND: band_negatives(model, cal_data, tickets, kb_scorer, seed, progress, samples)}


def prepared_calibration(model: TicketModel, mined: MinedPairs, tickets: Sequence[Ticket], augmenter: Augmenter,
                         kb_scorer: Bm25Scorer | None, seed: int, progress: bool) -> tuple[PairSet, PreparedPairs]:
    """The calibration pairs of `mined` (`calibration_pairs`) and the same prepared by `model`, with the lexical
    feature over `kb_scorer`'s knowledge base when given."""
    cal = calibration_pairs(mined, tickets, augmenter, seed)
    return cal, PreparedPairs.of(model, cal, lexical_features(cal, kb_scorer) if kb_scorer is not None else None,
                                 progress)
