"""Learning from feedback: support engineers' YES/REL/NO judgements become labelled pairs that fine-tune a model.

This is the "corrigibility" the source papers ask for: annotated mistakes are fed back into training.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm import tqdm

from ..errors import InputError
from .bundle import TicketModel
from ..data.records import LABEL_SCORES, NO, LabeledPair, Query, Ticket
from ..data.store import Dataset, Store, query_key
from .calibration import Calibrator
from .training import (PairSet, PreparedPairs, dataset_fingerprint, evaluate, fit, lexical_features, mean_distance,
                       pair_scores, query_text, split_queries)
from .unsupervised import CALIBRATION_NEGATIVES, RankedSlice, rank_distances, ranked_rows, select_by_rank
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


def fine_tune(model: TicketModel, train: Dataset, held_out: Dataset | None, out_dir: str | Path | None,
              seed: int = 0, epochs: int | None = None, progress: bool = True,
              knowledge_base: Sequence[Ticket] = ()) -> tuple[TicketModel, dict]:
    """A new model: `model` trained further on `train`'s pairs (vocabulary, word vectors, Punkt and DocNADE stay
    frozen), recalibrated; `model` itself is left untouched.

    Returns the tuned model and a report of the model before and after on the same held-out pairs
    (`held_out`, or a seeded share of `train`'s queries when None). `knowledge_base`: the tickets the queries are
    served against (the store's); the lexical feature takes its IDF and maximum over them and the judged tickets.
    """
    started = time.time()
    base_version = model.version
    if not train.pairs:
        raise InputError("there are no labelled pairs to learn from; give feedback in the UI or pass --train FILE")
    if held_out is None:
        train, held_out = split_queries(train, model.siamese_config.dev_share, seed)
    fit_pairs = PairSet.from_dataset(train, "training")
    dev_pairs = PairSet.from_dataset(held_out, "held-out") if held_out.pairs else None
    kb = _knowledge_base(train, held_out, Dataset(list(knowledge_base), [], [])) if model.siamese_config.bm25 > 0 else None

    config = model.siamese_config
    tq, tt = model.prepare(fit_pairs.queries, "query", progress), model.prepare(fit_pairs.tickets, "ticket", progress)
    dq = dt = dev_ratio = ratio = None
    if dev_pairs is not None:
        dq, dt = model.prepare(dev_pairs.queries, "query", progress), model.prepare(dev_pairs.tickets, "ticket", progress)
    if config.bm25 > 0:  # the lexical feature, IDF over the tickets of the feedback data (its knowledge base)
        ratio = lexical_features(fit_pairs, kb)
        if dev_pairs is not None:
            dev_ratio = lexical_features(dev_pairs, kb)
    fit_set = PreparedPairs(fit_pairs, tq, tt, ratio)
    dev_set = PreparedPairs(dev_pairs, dq, dt, dev_ratio) if dev_pairs is not None else None
    before = evaluate(model, dev_set) if dev_set is not None else None
    if progress:
        tqdm.write(f"fine-tuning on {len(fit_pairs)} pairs ({len(train.queries)} queries)")
    history: list[dict] = []
    tuned = fit(model, fit_set, dev_set, epochs=epochs, seed=seed, calibrate=False, progress=progress, history=history)
    selection = None
    if config.weights == "grid" and knowledge_base:
        scale = mean_distance(tuned, fit_set)
        selection = reselect_weights(tuned, train, knowledge_base, seed, progress)
        if selection is not None and selection["changed"]:  # same mean distance as before: the scale stays
            tuned.net.rescale(scale / mean_distance(tuned, fit_set))
            tuned.invalidate()
            selection["spec"] = tuned.metric_spec()
        if selection is not None and progress:
            tqdm.write(f"weights on {selection['queries']} judged queries: MRR@10 {selection['current']:.3f} with the "
                       f"model's, {selection['cross_validated']:.3f} re-selected (cross-validated; standard error of "
                       f"the difference {selection['stderr']:.3f}): {'re-selected' if selection['changed'] else 'kept'}")
    tuned.calibrator = _recalibrate(tuned, fit_set, list(knowledge_base), kb, seed, progress) or model.calibrator
    after = evaluate(tuned, dev_set) if dev_set is not None else None
    report = {"base_version": base_version, "train_pairs": len(fit_pairs),
              "held_out_pairs": len(dev_pairs) if dev_pairs else 0,
              "epochs": config.epochs if epochs is None else epochs, "before": before, "after": after,
              "history": history, "weight_selection": selection, "wall_seconds": round(time.time() - started, 1)}
    tuned.meta.setdefault("fine_tuning", []).append(
        {**report, "data_fingerprint": dataset_fingerprint(train, held_out)})
    tuned.invalidate()
    if out_dir is not None:
        tuned.save(out_dir)
    return tuned, report


def _recalibrate(model: TicketModel, data: PreparedPairs, tickets: Sequence[Ticket], kb: Bm25Scorer | None,
                 seed: int, progress: bool) -> Calibrator | None:
    """The calibrator refitted (centred isotonic, ties broken by raw score) on the judged pairs and, for each judged
    query, `CALIBRATION_NEGATIVES` random tickets of the knowledge base as NO: feedback is mostly YES, and a
    calibrator fitted on one label maps every score to it. None when there is nothing to fit on."""
    pairs = data.pairs
    g, y = pair_scores(model, data), pairs.y
    if tickets:
        rng = np.random.default_rng(seed + 5)
        judged = {(int(qi), pairs.tickets[int(ti)].id) for qi, ti in zip(pairs.q, pairs.t)}
        q, t = [], []
        for qi in range(len(pairs.queries)):
            for r in rng.choice(len(tickets), min(CALIBRATION_NEGATIVES, len(tickets)), replace=False):
                if (qi, tickets[int(r)].id) not in judged:
                    q.append(qi)
                    t.append(int(r))
        if q:
            used = sorted(set(t))
            at = {r: i for i, r in enumerate(used)}
            negatives = PairSet(pairs.queries, [tickets[r] for r in used], np.array(q, np.int64),
                                np.array([at[r] for r in t], np.int64), np.full(len(q), float(NO)))
            lex = lexical_features(negatives, kb) if data.lexical is not None else None
            g = np.concatenate([g, pair_scores(model, PreparedPairs(negatives, data.queries,
                                                                    model.prepare(negatives.tickets, "ticket", progress),
                                                                    lex))])
            y = np.concatenate([y, negatives.y])
    if len(np.unique(y)) < 2:
        return None
    return Calibrator.fit_centered(g, y)


def reselect_weights(model: TicketModel, train: Dataset, knowledge_base: Sequence[Ticket], seed: int = 0,
                     progress: bool = False) -> dict | None:
    """Re-select `model`'s channel and pair weights (its grid) on the engineers' judgements, in place.

    Each relevant judgement (score ≥ the config's relevant_min) is a query that must find its ticket among the
    knowledge base (at most `MAX_RANKED_VIEWS` tickets: every judged one and a seeded sample of the rest), as
    serving ranks it. Feedback is few queries, and the best of a grid on few queries flatters itself, so whether to
    re-select is decided by cross-validation over the judged queries (`SELECTION_FOLDS` folds: select on the
    others, rank the fold): the weights change only when the cross-validated MRR@10 beats the model's by more than
    one standard error of the paired difference; then the simplest grid point within one standard error of the
    best on all judged queries wins (`unsupervised.select_by_rank`). A stored ticket with the query's own text is
    the query itself, not a competitor, and is left out of its ranking. Returns the figures and the decision, or
    None with fewer than `MIN_SELECTION_JUDGEMENTS` relevant judgements.
    """
    config = model.siamese_config
    queries = {q.id: q for q in train.queries}
    relevant = [(queries[p.query_id], p.ticket_id) for p in train.pairs
                if p.score >= config.relevant_min and p.query_id in queries]
    kb = list({t.id: t for t in (*knowledge_base, *train.tickets)}.values())
    row = {t.id: i for i, t in enumerate(kb)}
    relevant = [(q, row[t]) for q, t in relevant if t in row]
    if len(relevant) < MIN_SELECTION_JUDGEMENTS:
        return None
    rng = np.random.default_rng(seed + 4)
    ranked = ranked_rows(len(kb), np.unique([r for _, r in relevant]), rng)
    truth = np.searchsorted(ranked, [r for _, r in relevant])
    query_list = [q for q, _ in relevant]
    dist = rank_distances(model, model.prepare(query_list, "query", progress),
                          model.prepare([kb[int(r)] for r in ranked], "ticket", progress)).astype(np.float64)
    spec = model.metric_spec()
    lex = None
    if spec["bm25"] > 0 or config.grid.get("bm25"):
        scorer = Bm25Scorer(kb)
        lex = np.stack([scorer.lexical(query_text(q), ranked) for q in query_list])
    own_text = {(t.subject.strip(), t.description.strip()): i for i, t in enumerate(kb[int(r)] for r in ranked)}
    for qi, q in enumerate(query_list):  # the query's own stored copy ranks first on any weights: leave it out
        same = own_text.get((q.subject.strip(), q.description.strip()))
        if same is not None and same != truth[qi]:
            dist[:, :, qi, same] = 1e6
            if lex is not None:
                lex[qi, same] = -1e6
    observable = [bool((dist[p].max(axis=2) - dist[p].min(axis=2) > 1e-6).any()) for p in range(len(dist))]
    judged = RankedSlice(dist, lex, truth, observable)
    current = judged.reciprocal_ranks(spec)
    # The best of thousands of grid points on a few dozen queries looks better than it is: estimate what selecting
    # gains by cross-validation over the judged queries (select on the other folds, rank this one).
    fold = rng.permutation(len(truth)) % SELECTION_FOLDS
    selected = np.zeros(len(truth))
    for f in range(SELECTION_FOLDS):
        train_q, test_q = fold != f, fold == f
        chosen_f, _, _ = select_by_rank([judged.queries(train_q)], spec, config.grid)
        selected[test_q] = judged.queries(test_q).reciprocal_ranks(chosen_f)
    diff = selected - current
    gain, stderr = float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(len(diff)))
    changed = gain > stderr
    chosen, value, _ = select_by_rank([judged], spec, config.grid)
    if changed:
        model.net.set_weights([v for *_, v in chosen["pairs"]], chosen["channels"], chosen["bm25"])
        model.invalidate()
    return {"queries": len(query_list), "ranked": int(len(ranked)), "current": float(current.mean()),
            "cross_validated": float(selected.mean()), "stderr": stderr, "selected_in_sample": value,
            "changed": bool(changed), "spec": model.metric_spec()}
