"""Text augmentations that teach a Siamese network invariances without labels (Neculoiu et al. 2016, section 4):
typos (about 20 % of a word's characters substituted, 5 % deleted), synonyms, extra words and dropped words.

Synonyms are induced from the knowledge base itself: a word's nearest word2vec neighbours (cosine above a
threshold) stand in for it. Every augmentation is deterministic for a seed: `Augmenter.augment(text, key)`
draws from a generator seeded by (seed, key, text), so the same call gives the same text in every process.
Shared by the label-free training of the Replicated Siamese LSTM (`mining.py`) and the character-level Siamese
BLSTM (`char_siamese.py`, through the same mined pairs). `Augmenter.perturb` makes one kind of noise at a time
(every word typo'd, extra words, two words swapped): the queries of the invariance tests (`benchmarks/invariance.py`).
"""
from __future__ import annotations

import hashlib
import random
import re
import string
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..lexical.analyzer import NUMBER_TOKEN, STOP_WORDS

#: What a typo may put in place of a character.
TYPO_ALPHABET = string.ascii_lowercase
#: A text's words: runs of anything but white space (punctuation stays on its word, as people type it).
_WORD = re.compile(r"\S+")


def typo(word: str, rng: random.Random, substitute: float = 0.20, delete: float = 0.05) -> str:
    """`word` with each character independently substituted (probability `substitute`, by another letter) or
    deleted (`delete`); a word never loses all its characters."""
    out = []
    for ch in word:
        u = rng.random()
        if u < delete:
            continue
        if u < delete + substitute and ch.isalpha():
            choices = [c for c in TYPO_ALPHABET if c != ch.lower()]
            new = rng.choice(choices)
            out.append(new.upper() if ch.isupper() else new)
        else:
            out.append(ch)
    return "".join(out) or word[:1]


def induce_synonyms(vocab_tokens: Sequence[str], vectors: np.ndarray, counts: Sequence[int] | None = None,
                    top_n: int = 3, min_similarity: float = 0.6, min_count: int = 3, max_words: int = 20000,
                    min_length: int = 3) -> dict[str, list[str]]:
    """word → its `top_n` nearest neighbours by cosine of `vectors` (one row per token of `vocab_tokens`), kept
    when the cosine is ≥ `min_similarity`. Only content words (no stop words, masks, reserved `<...>` tokens,
    words shorter than `min_length` or seen fewer than `min_count` times) take part; the `max_words` most frequent
    of them at most."""
    vectors = np.asarray(vectors, dtype=np.float32)
    rows = [i for i, w in enumerate(vocab_tokens)
            if len(w) >= min_length and w not in STOP_WORDS and w != NUMBER_TOKEN and not w.startswith("<")
            and w.isalpha() and (counts is None or counts[i] >= min_count)]
    if counts is not None:
        rows.sort(key=lambda i: (-counts[i], i))
    rows = rows[:max_words]
    if len(rows) < 2:
        return {}
    mat = vectors[rows]
    norms = np.linalg.norm(mat, axis=1, keepdims=True)
    ok = norms[:, 0] > 0
    mat = mat / np.maximum(norms, 1e-12)
    out: dict[str, list[str]] = {}
    k = min(top_n, len(rows) - 1)
    for start in range(0, len(rows), 1024):
        sims = mat[start:start + 1024] @ mat.T  # [b, n]
        for j in range(sims.shape[0]):
            sims[j, start + j] = -np.inf  # not itself
        best = np.argsort(-sims, axis=1, kind="stable")[:, :k]
        for j, cand in enumerate(best):
            i = start + j
            if not ok[i]:
                continue
            chosen = [vocab_tokens[rows[c]] for c in cand if ok[c] and sims[j, c] >= min_similarity]
            if chosen:
                out[vocab_tokens[rows[i]]] = chosen
    return out


@dataclass
class Augmenter:
    """Makes noisy variants of a short text (a ticket subject): each word independently gets a typo (share
    `typo_words`), is replaced by a synonym (`synonym_words`, when it has one) or dropped (`drop_words`); and
    after each word an extra word from `extra_vocabulary` is inserted with probability `extra_words`.
    A text of one word never loses it."""

    synonyms: Mapping[str, Sequence[str]] = field(default_factory=dict)
    extra_vocabulary: Sequence[str] = ()
    seed: int = 0
    typo_words: float = 0.15
    synonym_words: float = 0.25
    drop_words: float = 0.10
    extra_words: float = 0.10
    substitute_chars: float = 0.20
    delete_chars: float = 0.05

    def rng(self, text: str, key: str | int = "") -> random.Random:
        """The generator of one augmentation: seeded by (seed, key, text), independent of call order."""
        digest = hashlib.sha256(f"{self.seed}\x00{key}\x00{text}".encode("utf-8")).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))

    def augment(self, text: str, key: str | int = "") -> str:
        """A noisy variant of `text` (deterministic for (seed, key, text))."""
        rng = self.rng(text, key)
        words = _WORD.findall(text)
        out: list[str] = []
        for word in words:
            u = rng.random()
            bare = word.strip(string.punctuation).lower()
            if u < self.drop_words:
                if len(words) == 1:
                    out.append(word)  # the only word stays
            elif u < self.drop_words + self.synonym_words and self.synonyms.get(bare):
                out.append(rng.choice(list(self.synonyms[bare])))
            elif u < self.drop_words + self.synonym_words + self.typo_words and len(word) > 1:
                out.append(typo(word, rng, self.substitute_chars, self.delete_chars))
            else:
                out.append(word)
            if self.extra_vocabulary and rng.random() < self.extra_words:
                out.append(rng.choice(list(self.extra_vocabulary)))
        if not out and words:
            out = [words[0]]
        return " ".join(out)

    def perturb(self, text: str, kind: str, key: str | int = "", extra: int = 2) -> str:
        """One kind of noise (`PERTURBATIONS`), deterministic for (seed, kind, key, text): "typos" (every word, at
        `substitute_chars` / `delete_chars` per character), "extra_words" (`extra` words of `extra_vocabulary` at
        random positions) or "word_order" (two words swapped)."""
        rng = self.rng(text, f"{kind}\x00{key}")
        if kind == "typos":
            return with_typos(text, rng, self.substitute_chars, self.delete_chars)
        if kind == "extra_words":
            return with_extra_words(text, self.extra_vocabulary, rng, extra)
        if kind == "word_order":
            return swap_words(text, rng)
        raise ValueError(f"unknown perturbation {kind!r}; use one of {', '.join(PERTURBATIONS)}")


# -- the perturbations of the invariance tests (Neculoiu et al. 2016, section 5): one kind of noise at a time ----------
#: The kinds `Augmenter.perturb` makes.
PERTURBATIONS = ("typos", "extra_words", "word_order")


def with_typos(text: str, rng: random.Random, substitute: float = 0.20, delete: float = 0.05) -> str:
    """`text` with a typo chance on every character of every word (`typo`: 20 % substituted, 5 % deleted)."""
    return " ".join(typo(word, rng, substitute, delete) for word in _WORD.findall(text))


def with_extra_words(text: str, vocabulary: Sequence[str], rng: random.Random, n: int = 1) -> str:
    """`text` with `n` words of `vocabulary` inserted at random positions (`text` itself when it is empty)."""
    words = _WORD.findall(text)
    if not vocabulary or not words:
        return text
    for _ in range(n):
        words.insert(rng.randrange(len(words) + 1), rng.choice(list(vocabulary)))
    return " ".join(words)


def swap_words(text: str, rng: random.Random) -> str:
    """`text` with two of its words, at two random positions holding different words, swapped (`text` itself when
    it has fewer than two different words)."""
    words = _WORD.findall(text)
    if len(set(words)) < 2:
        return text
    i = rng.randrange(len(words))
    j = rng.choice([k for k, word in enumerate(words) if word != words[i]])
    words[i], words[j] = words[j], words[i]
    return " ".join(words)


def vocabulary_augmenter(vocab, vectors: np.ndarray, seed: int) -> Augmenter:
    """The augmenter of label-free mining: synonyms induced from the model's word vectors (one row per token of
    `vocab`, a `Vocabulary`), extra words from its frequent words."""
    synonyms = induce_synonyms(vocab.tokens, vectors, vocab.counts)
    extra = [w for w, c in zip(vocab.tokens, vocab.counts) if c >= 3 and w.isalpha() and len(w) > 2][:5000]
    return Augmenter(synonyms, extra, seed=seed)
