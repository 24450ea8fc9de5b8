"""The pretrained channel S adapted on engineers' judgements (`ticketrec train --with-feedback`).

A model that serves S (the label-free default weighs S and BM25, the LSTM h at 0) ranks with its sentence encoder,
so feedback can move its ranking only by moving that encoder. Each relevant judgement is a (query, judged ticket)
pair for sentence-transformers' MultipleNegativesRankingLoss, the loss label-free training adapts S with
(`adaptation.adapt`), starting from the model's own S; `FEEDBACK_MINED_PAIRS` pairs mined from the knowledge base
(a ticket's subject and first sentences against the rest of it, `mining.split_ticket`) go with them, so that a few
dozen judgements do not pull the encoder away from the rest of the knowledge base. One epoch at `LEARNING_RATE`.

Kept only when it pays on queries it was not trained on: cross-validation over the judged queries
(`ADAPT_FOLDS` folds of whole groups, `judged.JudgedQueries.folds`): adapt on the other folds' judgements, rank the
fold's queries with the model's weights; the encoder adapted on all judgements replaces the model's when the
cross-validated MRR@10 beats the model's own on the same queries. In every adaptation the pairs of one group (and the
mined pairs of its tickets) never share a batch, where each would be another's in-batch negative (`adaptation.apart`):
a query judged relevant to several tickets, or two duplicates judged both ways, would be taught to push apart what
the engineers joined.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Sequence

import numpy as np

from ..data.records import Query, Ticket, query_text, ticket_text
from .bundle import TicketModel
from .judged import JudgedQueries, paired_gain
from .mining import MiningConfig, split_ticket
from .static_fit import fit_static_encoder

#: Pairs mined from the knowledge base that go with the judgements (fewer when it has fewer tickets).
FEEDBACK_MINED_PAIRS = 100
#: Folds of the cross-validation that decides whether the adapted encoder is kept.
ADAPT_FOLDS = 3
#: The fewest judged queries the adaptation needs (each fold needs some to train on and some to rank).
MIN_ADAPT_QUERIES = 10
#: The learning rate and epochs of the adaptation. With label-free training's 2e-5 the encoder barely moved; the four
#: recipes tried were compared by this module's own cross-validation on the judged half of the SeaMonkey simulation
#: (benchmarks/feedback_seamonkey.py, never its evaluated half): 2e-5 with 400 mined pairs −0.001 MRR@10, 1e-4 with
#: 400 +0.013, 5e-5 with 100 +0.015, the same over 3 epochs +0.016 (standard errors 0.014),
#: docs/results/seamonkey/feedback.md.
LEARNING_RATE = 5e-5
EPOCHS = 1
#: The adapted encoder is kept when its cross-validated MRR@10 on the judged queries beats the model's by more.
MIN_GAIN = 0.0


def serves_s(model: TicketModel) -> bool:
    """Whether `model` ranks with its S channel (S weighed on at least one pair)."""
    spec = model.metric_spec()
    return spec["channels"].get("S", 0.0) > 0 and any(v > 0 for *_, v in spec["pairs"])


def adapt_on_feedback(model: TicketModel, judged: JudgedQueries, knowledge_base: Sequence[Ticket], seed: int = 0,
                      progress: bool = False, threads: int = 1) -> tuple[TicketModel, dict | None]:
    """(model, report): a copy of `model` with its S encoder adapted on the judgements when the cross-validated
    MRR@10 gain over its own encoder exceeds `MIN_GAIN`, else `model` itself; the report is None when the model
    does not serve S or there are fewer than `MIN_ADAPT_QUERIES` judged queries. A kept encoder waits in a
    `adaptation.scratch_directory` until the model is saved. Every adaptation runs on `threads` torch threads."""
    from .adaptation import adapt, discard, scratch_directory

    if not serves_s(model) or len(judged) < MIN_ADAPT_QUERIES:
        return model, None
    base = model.sentence_encoder().model  # the model's own S, on torch: fine-tuning starts here
    read = model.model_input  # the texts as the model reads them (without template lines)
    judgements = [(query_text(read(q)), ticket_text(read(judged.kb[int(judged.ranked[t])])))
                  for q, t in zip(judged.queries, judged.truth)]
    splits = _mined_splits(knowledge_base, seed)
    mined = [(query_text(read(q)), ticket_text(read(v))) for q, v in splits]
    groups = np.r_[judged.groups, _mined_groups(judged, [v.id for _, v in splits])]
    spec = model.metric_spec()
    current = judged.ranked_slice(model, progress).reciprocal_ranks(spec)
    fold = judged.folds(ADAPT_FOLDS, np.random.default_rng(seed + 6))
    cross_validated = np.zeros(len(judged))
    for f in range(ADAPT_FOLDS):
        test = fold == f
        if not test.any():
            continue
        directory = scratch_directory()
        try:
            train = np.r_[~test, np.ones(len(mined), bool)]
            pairs = [p for p, used in zip(judgements + mined, train) if used]
            files = adapt(*zip(*pairs), directory, groups=groups[train], base=base, seed=seed, lr=LEARNING_RATE,
                          epochs=EPOCHS, progress=progress, threads=threads)
            candidate = _with_encoder(model, directory, files, {}, knowledge_base, seed)
            cross_validated[test] = judged.subset(test).ranked_slice(candidate, progress).reciprocal_ranks(spec)
        finally:
            discard(directory)
    gain, stderr = paired_gain(cross_validated, current)
    report = {"queries": len(judged), "feedback_pairs": len(judgements), "mined_pairs": len(mined),
              "folds": ADAPT_FOLDS, "current": float(current.mean()), "cross_validated": float(cross_validated.mean()),
              "stderr": stderr, "kept": gain > MIN_GAIN}
    if not report["kept"]:
        return model, report
    directory = scratch_directory()
    files = adapt(*zip(*(judgements + mined)), directory, groups=groups, base=base, seed=seed, lr=LEARNING_RATE,
                  epochs=EPOCHS, progress=progress, threads=threads)
    record = {"feedback": {k: report[k] for k in ("feedback_pairs", "mined_pairs", "cross_validated", "current")}}
    return _with_encoder(model, directory, files, record, knowledge_base, seed), report


def _with_encoder(model: TicketModel, directory: Path, files: dict[str, str], extra: dict,
                  knowledge_base: Sequence[Ticket], seed: int) -> TicketModel:
    """A copy of `model` whose S encoder is the adapted one in `directory` (its files' SHA-256 `files`); on the
    static backend, its vectors fitted to `knowledge_base` again from the adapted encoder (`static_fit.py`)."""
    tuned = copy.deepcopy(model)
    own = dict(model.meta.get("sentence_encoder") or {"base": (model.s_channel or {}).get("encoder")})
    own.pop("static_fit", None)
    tuned.meta["sentence_encoder"] = {**own, "loss": "MultipleNegativesRankingLoss", "files": files, **extra}
    tuned.sentence_encoder_dir = Path(directory)
    fit_static_encoder(tuned, knowledge_base, seed)  # nothing unless S runs on the static backend
    tuned.invalidate()
    return tuned


def _mined_groups(judged: JudgedQueries, ticket_ids: Sequence[str]) -> np.ndarray:
    """The adaptation's group of each mined pair of the tickets `ticket_ids`: the judged group of a ticket that a
    judgement holds (as its judged ticket or its query's own copy), else a group of its own, so that no batch pits a
    judged query against a view of its own ticket or of the ticket it must find."""
    of_ticket = {}
    for columns in (judged.truth, judged.own):
        for column, group in zip(columns, judged.groups):
            if column >= 0:
                of_ticket[judged.kb[int(judged.ranked[column])].id] = int(group)
    alone = len(judged.ranked)  # above every group label (a ticket column)
    return np.array([of_ticket.get(t, alone + i) for i, t in enumerate(ticket_ids)], np.int64)


def _mined_splits(tickets: Sequence[Ticket], seed: int) -> list[tuple[Query, Ticket]]:
    """Up to `FEEDBACK_MINED_PAIRS` (query, rest of the ticket) splits of a seeded sample of `tickets`."""
    prefix_words = MiningConfig().prefix_words
    rng = np.random.default_rng(seed + 7)
    pairs = []
    for i in rng.permutation(len(tickets)):
        split = split_ticket(tickets[int(i)], prefix_words)
        if split is not None:
            pairs.append(split)
            if len(pairs) == FEEDBACK_MINED_PAIRS:
                break
    return pairs

