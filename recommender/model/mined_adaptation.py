"""The sentence encoder S adapted to a knowledge base on its mined pairs, and judged on the held-out slice.

Label-free training fine-tunes a copy of S (`adaptation.adapt`: MultipleNegativesRankingLoss) on each training
ticket's own subject query against the rest of the ticket, optionally with its hardest mined negative
(`adaptation_negatives`), and keeps it only when it ranks the held-out tickets better than the packaged encoder.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..data.records import YES, component_text, query_text
from ..errors import InputError
from .bundle import TicketModel
from .mining import MinedPairs, MiningConfig
from .weight_selection import mrr_at_k, ranked_rows


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
                           progress: bool, threads: int = 1) -> dict:
    """Fine-tune S on the training tickets' (query, own view) pairs (`adaptation.adapt`); keep it in `model` (meta
    "sentence_encoder" and `sentence_encoder_dir`) only when its held-out MRR@10 (query text against every view's
    text, cosine) beats the packaged encoder's, both on the model's backend (on ONNX int8 for the static backend,
    whose vectors are then fitted to the encoder kept). With `mining.adapt_hard_negatives` each pair also has a
    negative (`adaptation_negatives`). The fine-tuning runs on `threads` torch threads. Returns both figures, the
    decision and the threads."""
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
                  max_seq_length=mining.adapt_max_tokens, progress=progress, threads=threads)

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
    return {**figures, "kept": kept, "pairs": len(anchors), "threads": threads,
            **({"hard_negatives": hard} if negatives else {})}
