"""Token <-> id mapping with counts, document frequencies and IDF, saved as JSON."""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..errors import ModelError
from ..lexical.analyzer import NUMBER_TOKEN, STOP_WORDS

PAD, UNK, EOS = "<pad>", "<unk>", "<eos>"
PAD_ID, UNK_ID, EOS_ID = 0, 1, 2
#: Reserved tokens, always the first ids. `<eos>` marks a sentence boundary inside DESC and SOL.
RESERVED = (PAD, UNK, EOS)


class Vocabulary:
    """Words seen at least `min_count` times, with `<pad>`=0, `<unk>`=1, `<eos>`=2 and per-word document frequency."""

    def __init__(self, tokens: Sequence[str], counts: Sequence[int], doc_freq: Sequence[int], n_docs: int):
        if tuple(tokens[: len(RESERVED)]) != RESERVED:
            raise ValueError("a vocabulary must start with the reserved tokens <pad>, <unk>, <eos>")
        self.tokens = list(tokens)
        self.counts = [int(c) for c in counts]
        self.doc_freq = [int(d) for d in doc_freq]
        self.n_docs = int(n_docs)
        self.index = {t: i for i, t in enumerate(self.tokens)}

    @classmethod
    def build(cls, documents: Iterable[Sequence[str]], min_count: int = 1, max_size: int | None = None) -> "Vocabulary":
        """Count tokens over `documents` (one token list each); keep words seen `min_count`+ times, most frequent first."""
        counts: Counter[str] = Counter()
        dfs: Counter[str] = Counter()
        n_docs = 0
        for doc in documents:
            n_docs += 1
            counts.update(doc)
            dfs.update(set(doc))
        words = [w for w, c in counts.items() if c >= min_count and w not in RESERVED]
        words.sort(key=lambda w: (-counts[w], w))
        if max_size is not None:
            words = words[: max(0, max_size - len(RESERVED))]
        tokens = list(RESERVED) + words
        return cls(tokens, [0] * len(RESERVED) + [counts[w] for w in words],
                   [0] * len(RESERVED) + [dfs[w] for w in words], n_docs)

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: str) -> bool:
        return token in self.index

    def id(self, token: str) -> int:
        """The id of `token`, `<unk>`'s id when unknown."""
        return self.index.get(token, UNK_ID)

    def ids(self, tokens: Iterable[str]) -> list[int]:
        return [self.index.get(t, UNK_ID) for t in tokens]

    def idf_of(self, token: str) -> float:
        """Smoothed IDF, log((1+N)/(1+df)) + 1; an unseen word gets the largest value, a stop word, mask or reserved token 0."""
        if token in STOP_WORDS or token == NUMBER_TOKEN or token in RESERVED:
            return 0.0
        i = self.index.get(token)
        df = self.doc_freq[i] if i is not None else 0
        return math.log((1 + self.n_docs) / (1 + df)) + 1.0

    def idf(self) -> np.ndarray:
        """IDF of every id (float32 [V]); stop words, `##` and reserved tokens weigh 0."""
        return np.array([self.idf_of(t) for t in self.tokens], dtype=np.float32)

    # -- persistence ----------------------------------------------------------
    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "counts": self.counts, "doc_freq": self.doc_freq, "n_docs": self.n_docs}

    @classmethod
    def from_dict(cls, data: dict) -> "Vocabulary":
        return cls(data["tokens"], data["counts"], data["doc_freq"], data["n_docs"])

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "Vocabulary":
        """Read a vocabulary written by `save`; a missing or corrupt file raises ModelError naming it."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelError(f"cannot read the vocabulary {path}: {exc}; retrain the model") from exc
