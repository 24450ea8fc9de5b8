"""Learning from feedback: support engineers' YES/REL/NO judgements become labelled pairs that fine-tune a model.

This is the "corrigibility" the source papers ask for: annotated mistakes are fed back into training.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from tqdm import tqdm

from ..errors import InputError
from .bundle import TicketModel
from ..data.records import LABEL_SCORES, LabeledPair, Query, Ticket
from ..data.store import Dataset, Store, query_key
from .training import (PairSet, PreparedPairs, dataset_fingerprint, evaluate, fit, lexical_features,
                       split_queries)
from ..lexical.bm25 import Bm25Scorer


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
    tuned = fit(model, fit_set, dev_set, epochs=epochs, seed=seed, progress=progress, history=history)
    after = evaluate(tuned, dev_set) if dev_set is not None else None
    report = {"base_version": base_version, "train_pairs": len(fit_pairs),
              "held_out_pairs": len(dev_pairs) if dev_pairs else 0,
              "epochs": config.epochs if epochs is None else epochs, "before": before, "after": after,
              "history": history, "wall_seconds": round(time.time() - started, 1)}
    tuned.meta.setdefault("fine_tuning", []).append(
        {**report, "data_fingerprint": dataset_fingerprint(train, held_out)})
    tuned.invalidate()
    if out_dir is not None:
        tuned.save(out_dir)
    return tuned, report
