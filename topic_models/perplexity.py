"""Held-out perplexity comparison of DocNADE and LDA, like Table 3 of Gupta et al. (2018).

Every model is trained on one text kind (e.g. "M1" = SUB+DESC, "M2" = SUB+DESC+SOL) and evaluated on the
same held-out documents, with the same vocabulary, so all numbers in one table compare directly.
"""
from __future__ import annotations

import math
import random
from collections import Counter
import time
from typing import Mapping

from . import docnade
from .docnade import Documents, TopicModelError
from .lda import fit_lda


def build_id_documents(
    train_texts: Mapping[str, list[list[str]]],
    heldout_texts: Mapping[str, list[list[str]]],
    vocab_from: str,
    min_count: int = 2,
    max_vocab: int | None = None,
) -> tuple[list[str], dict[str, list[list[int]]], dict[str, list[list[int]]]]:
    """Map token documents to ids with one vocabulary built on `train_texts[vocab_from]`.

    Words seen fewer than `min_count` times there (or beyond the `max_vocab` most frequent) are dropped
    from every training and held-out document alike, so all models see exactly the same words.
    Returns (words by id, training id documents, held-out id documents).
    """
    counts = Counter(t for doc in train_texts[vocab_from] for t in doc)
    words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    if max_vocab is not None:
        words = words[:max_vocab]
    if len(words) < 2:
        raise TopicModelError(f"the vocabulary of {vocab_from!r} has {len(words)} words with min count {min_count}; "
                              "give more training text or a lower min count")
    index = {w: i for i, w in enumerate(words)}

    def to_ids(docs: list[list[str]]) -> list[list[int]]:
        return [[index[t] for t in doc if t in index] for doc in docs]

    return (words, {k: to_ids(v) for k, v in train_texts.items()}, {k: to_ids(v) for k, v in heldout_texts.items()})


def split_validation(docs: Documents, share: float = 0.1, seed: int = 0) -> tuple[list, list]:
    """A seeded (train, validation) split of `docs` for early stopping (validation gets `share`, at least one)."""
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    n_val = max(1, int(round(len(docs) * share))) if len(docs) > 1 else 0
    val = set(order[:n_val])
    return [d for i, d in enumerate(docs) if i not in val], [d for i, d in enumerate(docs) if i in val]


def compare(
    train_sets: Mapping[str, Documents],
    heldout_sets: Mapping[str, Documents],
    vocab_size: int,
    n_topics: int = 100,
    seed: int = 0,
    docnade_options: Mapping | None = None,
    lda_options: Mapping | None = None,
    progress: bool = True,
) -> list[dict]:
    """Train DocNADE and LDA on each training set and measure perplexity on each held-out set.

    DocNADE stops early on a seeded 10% validation share of its training documents (never on held-out
    text); LDA runs its fixed number of passes on all of them. Returns one row per (train set, model) with
    the held-out perplexities, word counts and training seconds.
    """
    docnade_options = dict(docnade_options or {})
    lda_options = dict(lda_options or {})
    rows = []
    for name, docs in train_sets.items():
        docs = [list(d) for d in docs if len(d)]
        if not docs:
            raise TopicModelError(f"training set {name!r} has no document with a known word")
        fit_docs, val_docs = split_validation(docs, seed=seed)
        start = time.perf_counter()
        dn = docnade.fit(fit_docs, vocab_size, n_topics=n_topics, seed=seed, dev_docs=val_docs,
                         progress=progress, **docnade_options)
        dn_seconds = time.perf_counter() - start
        start = time.perf_counter()
        lda = fit_lda(docs, vocab_size, n_topics=n_topics, seed=seed, **lda_options)
        lda_seconds = time.perf_counter() - start
        for label, model, seconds in (("LDA", lda, lda_seconds), ("DocNADE", dn, dn_seconds)):
            row = {"train": name, "model": label, "train_docs": len(docs), "train_seconds": round(seconds, 1)}
            for held_name, held in heldout_sets.items():
                total, words = model.total_nll(held)
                row[held_name] = round(math.exp(total / words), 1) if words else None
                row[f"{held_name} words"] = words
            rows.append(row)
    return rows


def markdown_table(rows: list[dict], heldout_names: list[str]) -> str:
    """The comparison as a markdown table: one line per (training text, model), one column per held-out text."""
    head = ["trained on", "model", "train docs", *[f"ppl on {h}" for h in heldout_names], "train s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["train"], r["model"], str(r["train_docs"]), *[f"{r[h]:.1f}" for h in heldout_names],
                 f"{r['train_seconds']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
