"""Learning from feedback: support engineers' YES/REL/NO judgements become labelled pairs that fine-tune a model.

This is the "corrigibility" the source papers ask for: annotated mistakes are fed back into training.
"""
from __future__ import annotations

import functools
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm import tqdm

from ..errors import InputError
from .bundle import TicketModel
from ..data.records import LABEL_SCORES, YES, LabeledPair, Query, Ticket
from ..data.store import Dataset, Store, query_key
from .calibration import Calibrator
from .encoder_base import encode_threads, memoised_sentence_vectors
from .training import (PairSet, PreparedPairs, dataset_fingerprint, evaluate, fit, lexical_features, mean_distance,
                       pair_scores, random_negatives, split_queries)
from .feedback_encoder import adapt_on_feedback
from .judged import JudgedQueries, judged_queries, paired_gain
from .adaptation import keep_saved_encoder, torch_threads
from .mined_calibration import (BAND_NO, CALIBRATION_BAND, MINED_BAND, BandSamples, band_negatives,
                                feedback_band_decision, mined_calibration)
from .weight_selection import RankedSlice, select_by_rank, set_weights_on_filled_fields
from ..lexical.bm25 import Bm25Scorer

#: The fewest relevant judgements (YES/REL pairs) that may re-select the channel and pair weights.
MIN_SELECTION_JUDGEMENTS = 10
#: Folds of the cross-validation that decides whether re-selecting the weights on the judgements pays.
SELECTION_FOLDS = 5


def feedback_dataset(store: Store) -> Dataset:
    """The stored feedback as a Dataset: one query per distinct query text, the judged tickets, one pair each.

    When the same query and ticket were judged several times, the latest judgement counts.
    """
    queries: dict[str, Query] = {}
    labels: dict[tuple[str, str], float] = {}
    for fb in store.feedback():  # oldest first, so later judgements overwrite earlier ones
        qid = "feedback-" + query_key(fb.query_subject, fb.query_description)[:16]
        queries.setdefault(qid, Query(fb.query_subject, fb.query_description, qid))
        labels[(qid, fb.ticket_id)] = LABEL_SCORES[fb.label]
    tickets = store.get_tickets(sorted({tid for _, tid in labels}))
    known = {t.id for t in tickets}
    pairs = [LabeledPair(q, t, s) for (q, t), s in labels.items() if t in known]
    return Dataset(tickets, list(queries.values()), pairs, source="feedback")


def merge(*datasets: Dataset) -> Dataset:
    """One Dataset from several (later tickets and queries with the same id win; pairs are all kept)."""
    tickets: dict[str, object] = {}
    queries: dict[str, object] = {}
    pairs = []
    for d in datasets:
        tickets.update({t.id: t for t in d.tickets})
        queries.update({q.id: q for q in d.queries})
        pairs.extend(d.pairs)
    return Dataset(list(tickets.values()), list(queries.values()), pairs, source="+".join(d.source for d in datasets))


def _knowledge_base(*datasets: Dataset) -> Bm25Scorer:
    """The one BM25 over the tickets of these data sets: the knowledge base of the lexical feature."""
    return Bm25Scorer(list({t.id: t for d in datasets for t in d.tickets}.values()))


@torch_threads(1)  # as training: the network's sums in one order, so the same feedback gives the same model again
@encode_threads()
@memoised_sentence_vectors()
def fine_tune(model: TicketModel, train: Dataset, held_out: Dataset | None, out_dir: str | Path | None,
              seed: int = 0, epochs: int | None = None, progress: bool = True,
              knowledge_base: Sequence[Ticket] = (), threads: int = 1) -> tuple[TicketModel, dict]:
    """A new model: `model` trained further on `train`'s pairs (vocabulary, word vectors, Punkt and DocNADE stay
    frozen), recalibrated; `model` itself is left untouched.

    With a `knowledge_base` (the tickets the queries are served against, the store's; the lexical feature takes its
    IDF and maximum over them and the judged tickets), the relevant judgements also rank it: a model that serves S
    gets its encoder adapted on them (`feedback_encoder.adapt_on_feedback`), and the channel weights are
    re-selected (`reselect_weights`), each only when it pays in cross-validation over the judged queries.
    Runs torch on one thread (its count before is restored), so the same feedback gives the same model again; S's
    adaptation runs on `threads` (another encoder for another count, the same again for the same count).
    Returns the tuned model and a report of the model before and after on the same held-out pairs
    (`held_out`, or a seeded share of `train`'s queries when None).
    """
    started = time.time()
    base_version = model.version
    if not train.pairs:
        raise InputError("there are no labelled pairs to learn from; give feedback in the UI or pass --train FILE")
    if held_out is None:
        train, held_out = split_queries(train, model.siamese_config.dev_share, seed)
    fit_pairs = PairSet.from_dataset(train, "training")
    dev_pairs = PairSet.from_dataset(held_out, "held-out") if held_out.pairs else None
    # the knowledge base's tickets first: their rows in `kb` are their places in `knowledge_base` (the calibration's
    # ranking of it reads them)
    kb = _knowledge_base(Dataset(list(knowledge_base), [], []), train, held_out) if model.siamese_config.bm25 > 0 else None
    config = model.siamese_config
    judged = None
    if knowledge_base:
        judged = judged_queries(train.queries, [(p.query_id, p.ticket_id, p.score) for p in train.pairs],
                                knowledge_base, train.tickets, config.relevant_min, seed)
    adapted, adaptation = model, None
    if judged is not None:  # a model that ranks with S learns from feedback through its encoder
        adapted, adaptation = adapt_on_feedback(model, judged, knowledge_base, seed, progress, threads)
        if adaptation is not None and progress:
            _say(f"S adapted on {adaptation['feedback_pairs']} judgements: MRR@10 on the judged queries "
                 f"{adaptation['current']:.3f} with the model's encoder, {adaptation['cross_validated']:.3f} "
                 f"adapted (cross-validated; standard error of the difference {adaptation['stderr']:.3f}): "
                 f"{'kept' if adaptation['kept'] else 'not kept'}")

    def prepared(m: TicketModel) -> tuple[PreparedPairs, PreparedPairs | None]:
        """The judged and held-out pairs prepared by `m` (its S vectors, tokens, topics), with the lexical feature
        over the feedback data's knowledge base."""
        fit_set = PreparedPairs(fit_pairs, m.prepare(fit_pairs.queries, "query", progress),
                                m.prepare(fit_pairs.tickets, "ticket", progress),
                                lexical_features(fit_pairs, kb) if config.bm25 > 0 else None)
        dev_set = None
        if dev_pairs is not None:
            dev_set = PreparedPairs(dev_pairs, m.prepare(dev_pairs.queries, "query", progress),
                                    m.prepare(dev_pairs.tickets, "ticket", progress),
                                    lexical_features(dev_pairs, kb) if config.bm25 > 0 else None)
        return fit_set, dev_set

    fit_set, dev_set = prepared(model)
    before = evaluate(model, dev_set) if dev_set is not None else None
    if adapted is not model:
        fit_set, dev_set = prepared(adapted)
    if progress:
        _say(f"fine-tuning on {len(fit_pairs)} pairs ({len(train.queries)} queries)")
    history: list[dict] = []
    tuned = fit(adapted, fit_set, dev_set, epochs=epochs, seed=seed, calibrate=False, progress=progress,
                history=history)
    selection = None
    if config.weights == "grid" and judged is not None and len(judged) >= MIN_SELECTION_JUDGEMENTS:
        scale = mean_distance(tuned, fit_set)
        selection = reselect_weights(tuned, judged, seed, progress)
        if selection["changed"]:  # same mean distance as before: the scale stays
            tuned.net.rescale(scale / mean_distance(tuned, fit_set))
            tuned.invalidate()
            selection["spec"] = tuned.metric_spec()
        if progress:
            _say(f"weights on {selection['queries']} judged queries: MRR@10 {selection['current']:.3f} with the "
                 f"model's, {selection['cross_validated']:.3f} re-selected (cross-validated; standard error of "
                 f"the difference {selection['stderr']:.3f}): {'re-selected' if selection['changed'] else 'kept'}")
    calibrator, calibration, band = _recalibrate(tuned, fit_set, list(knowledge_base), kb, seed, progress)
    tuned.calibrator = calibrator or model.calibrator
    if calibration and progress:
        _say("recalibrated on " + ", ".join(f"{c['pairs']} {name} pairs (median score {c['median_score']})"
                                            for name, c in calibration.items() if c["pairs"])
             + band_decision_words(band))
    after = evaluate(tuned, dev_set) if dev_set is not None else None
    report = {"base_version": base_version, "train_pairs": len(fit_pairs),
              "held_out_pairs": len(dev_pairs) if dev_pairs else 0,
              "epochs": config.epochs if epochs is None else epochs, "before": before, "after": after,
              "history": history, "sentence_encoder": adaptation, "weight_selection": selection,
              "calibration": calibration, "calibration_band": band,
              "wall_seconds": round(time.time() - started, 1)}
    tuned.meta.setdefault("fine_tuning", []).append(
        {**report, "data_fingerprint": dataset_fingerprint(train, held_out)})
    tuned.invalidate()
    if out_dir is not None:
        tuned.save(out_dir)
        if adapted is not model:  # serve the saved copy of the adapted encoder; its scratch directory goes
            keep_saved_encoder(tuned, out_dir)
    return tuned, report


def band_decision_words(band: dict | None) -> str:
    """The band decision of `_recalibrate` (`fine_tune`'s report, "calibration_band") in words, as the end of its
    progress line ("" for None)."""
    if band is None:
        return ""
    verdict = "taken as NO pairs" if band["as_no"] else "left out of the NO pairs"
    name = f"the {CALIBRATION_BAND[0]}th-{CALIBRATION_BAND[1]}th band"
    if band["by"] == "training":
        return f"; {name} {verdict}, as training decided"
    if band["position"] is None:
        return f"; the tickets judged YES score no higher than random ones: {name} {verdict}"
    return f"; {name} lies {band['position']:.2f} of the way from random tickets to the ones judged YES: {verdict}"


def _say(line: str) -> None:
    """A progress line on standard error, between progress bars (standard output carries the CLI's JSON)."""
    tqdm.write(line, file=sys.stderr)


def _recalibrate(model: TicketModel, data: PreparedPairs, tickets: Sequence[Ticket], kb: Bm25Scorer | None,
                 seed: int, progress: bool) -> tuple[Calibrator | None, dict, dict | None]:
    """The calibrator refitted (centred isotonic, ties broken by raw score) on the judged pairs and, for each judged
    query, random tickets of the knowledge base (`training.random_negatives`) and one it ranks 5th–20th
    (`mined_calibration.band_negatives`) as NO, as label-free training calibrates: feedback is mostly YES, and a
    calibrator fitted on one label maps every score to it. A label-free model's own calibration pairs, mined again
    from the knowledge base (`mined_calibration.mined_calibration`), join them: a few dozen judgements adjust the
    scale rather than define it. Neither band is NO where `mined_calibration.feedback_band_decision` says so: the
    judged queries' band lies nearer the tickets engineers judged YES than random ones (with enough YES judgements),
    or training left the mined band out (a knowledge base of large clusters, or the mining option band_as_no).
    Returns the calibrator (None when there is nothing to fit on), the pairs it was fitted on (how many of each kind
    and their median calibrated score) and the band decision (None without a knowledge base)."""
    pairs = data.pairs
    parts = {"judged": (pair_scores(model, data), pairs.y)}
    band_decision = None
    if tickets:
        kb_scorer = kb if data.lexical is not None else None  # its first rows are `tickets`
        random_g, random_y = random_negatives(model, data, tickets, kb_scorer, seed, progress)
        if len(random_g):
            parts["random NO"] = (random_g, random_y)
        # one preparation of the band's sample per seed: the mined band (the model's seed) and the judged one share it
        samples = BandSamples(model, tickets, progress)
        mined = mined_calibration(model, tickets, kb_scorer, progress, samples)
        # the judged queries' band ranks up to BAND_TICKETS tickets: only when the decision or the fit needs it
        band = functools.cache(lambda: band_negatives(model, data, tickets, kb_scorer, seed, progress, samples))
        judged_g, judged_y = parts["judged"]
        band_decision = feedback_band_decision(model, mined, judged_g[judged_y == YES], random_g, lambda: band()[0])
        if band_decision["as_no"]:
            parts[BAND_NO] = band()
        else:
            mined = {name: part for name, part in mined.items() if name != MINED_BAND}
        parts.update(mined)
    g = np.concatenate([part[0] for part in parts.values()])
    y = np.concatenate([part[1] for part in parts.values()])
    if len(np.unique(y)) < 2:
        return None, {}, band_decision
    calibrator = Calibrator.fit_centered(g, y)
    return calibrator, {name: {"pairs": int(len(part[0])),
                               "median_score": round(float(np.median(calibrator(part[0]))), 2) if len(part[0]) else None}
                        for name, part in parts.items()}, band_decision


def reselect_weights(model: TicketModel, judged: JudgedQueries, seed: int = 0, progress: bool = False) -> dict:
    """Re-select `model`'s channel and pair weights (its grid) on the engineers' judgements, in place.

    Each relevant judgement is a query that must find its ticket among the knowledge base (`judged`), as serving
    ranks it. Feedback is few queries, and the best of a grid on few queries flatters itself, so whether to
    re-select is decided by cross-validation over the judged queries (`SELECTION_FOLDS` folds of whole groups,
    `JudgedQueries.folds`: select on the others, rank the fold): the weights change only when the cross-validated
    MRR@10 beats the model's by more than one standard error of the paired difference; then the simplest grid point
    within one standard error of the best on all judged queries wins (`weight_selection.select_by_rank`). Returns the
    figures and the decision.
    """
    config = model.siamese_config
    spec = model.metric_spec()
    decision = cross_validated_selection(judged.ranked_slice(model, progress), judged, spec, config.grid, seed)
    changed = decision["gain"] > decision["stderr"]
    if changed:
        set_weights_on_filled_fields(model, decision["chosen"], judged.kb)
    return {"queries": len(judged), "ranked": int(len(judged.ranked)), "current": float(decision["current"].mean()),
            "cross_validated": float(decision["selected"].mean()), "stderr": decision["stderr"],
            "selected_in_sample": decision["value"], "changed": bool(changed), "spec": model.metric_spec()}


def cross_validated_selection(ranked: RankedSlice, judged: JudgedQueries, spec: dict, grid: dict,
                              seed: int = 0) -> dict:
    """What re-selecting the weights `spec` on the judged queries would gain: per query, the reciprocal rank of the
    weights selected on the other folds (`SELECTION_FOLDS` folds of whole groups) and of `spec` ("selected",
    "current"), their paired mean gain and its standard error, and the weights selected on all of them ("chosen",
    its in-sample MRR@10 "value"). `ranked` is `judged` ranked by the model (`JudgedQueries.ranked_slice`)."""
    current = ranked.reciprocal_ranks(spec)
    # The best of thousands of grid points on a few dozen queries looks better than it is: estimate what selecting
    # gains by cross-validation over the judged queries (select on the other folds, rank this one).
    fold = judged.folds(SELECTION_FOLDS, np.random.default_rng(seed + 4))
    selected = np.zeros(len(judged))
    for f in range(SELECTION_FOLDS):
        train_q, test_q = fold != f, fold == f
        if not test_q.any():
            continue
        chosen_f, _, _ = select_by_rank([ranked.queries(train_q)], spec, grid)
        selected[test_q] = ranked.queries(test_q).reciprocal_ranks(chosen_f)
    gain, stderr = paired_gain(selected, current)
    chosen, value, _ = select_by_rank([ranked], spec, grid)
    return {"current": current, "selected": selected, "gain": gain, "stderr": stderr, "chosen": chosen,
            "value": value}
