"""Word inputs of the Siamese net: word2vec (gensim or a user file) + a char-level BiLSTM (350-d), and the SumEMB channel E.

Words word2vec does not cover (not in the file, or below the vocabulary's minimum count) get a zero
word2vec part; their char-BiLSTM part still gives them a vector of their own, so no word is blank.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from ..errors import InputError
from .vocab import EOS, PAD_ID, UNK_ID, Vocabulary

#: The E normalisations: the paper's raw sum, a plain mean, and the IDF-weighted L2-normalised mean (default).
E_NORMS = ("sum", "mean", "idf_l2")
MAX_WORD_CHARS = 20


def _stable_hash(text: str) -> int:
    """A hash independent of PYTHONHASHSEED, so gensim's initial vectors are the same in every process."""
    return zlib.crc32(text.encode("utf-8"))


def word2vec_epochs(n_tokens: int, epochs: int, updates: int = 0, max_epochs: int = 400) -> int:
    """Epochs for word2vec on `n_tokens` tokens: `epochs`, or with `updates` > 0 enough epochs for about that many
    token updates, at least `epochs` and at most `max_epochs`. A knowledge base is a small corpus, and a fixed
    epoch count leaves its rarer words, the ones that tell tickets apart, barely moved from their random start."""
    if updates <= 0 or n_tokens <= 0:
        return epochs
    return int(min(max(epochs, math.ceil(updates / n_tokens)), max(epochs, max_epochs)))


def train_word2vec(token_lists: Sequence[Sequence[str]], dim: int = 300, seed: int = 0, workers: int = 1,
                   epochs: int = 5, window: int = 5, min_count: int = 1, progress: bool = False):
    """CBOW word2vec (gensim) on `token_lists`; deterministic for a seed with workers=1. Returns KeyedVectors."""
    from gensim.models import Word2Vec

    sentences = [list(t) for t in token_lists if t]
    if not sentences:
        raise InputError("no text to train word vectors on; import tickets with a subject or description first")
    model = Word2Vec(vector_size=dim, window=window, min_count=min_count, workers=workers, seed=seed,
                     hashfxn=_stable_hash, epochs=epochs, sg=0)
    model.build_vocab(sentences)
    model.train(sentences, total_examples=len(sentences), epochs=epochs)
    return model.wv


def load_word2vec(path: str | Path):
    """Read word vectors in word2vec format, text or binary (detected); a bad file raises InputError saying so."""
    from gensim.models import KeyedVectors

    path = Path(path)
    if not path.is_file():
        raise InputError(f"word vector file {path} does not exist; pass a word2vec-format file (text or binary)")
    errors = []
    for binary in (False, True):
        try:
            return KeyedVectors.load_word2vec_format(str(path), binary=binary, unicode_errors="replace")
        except Exception as exc:  # gensim raises ValueError, UnicodeDecodeError, EOFError... depending on the file
            errors.append(f"{'binary' if binary else 'text'}: {exc}")
    raise InputError(f"cannot read {path} as word2vec vectors ({'; '.join(errors)}); "
                     "give a word2vec-format file: a header line 'COUNT DIM' then one word and its numbers per line")


def align_vectors(keyed_vectors, vocab: Vocabulary, dim: int | None = None) -> np.ndarray:
    """The word vectors in vocabulary order (float32 [V, dim]); words the vectors lack, and reserved ids, get zeros."""
    dim = dim or keyed_vectors.vector_size
    if keyed_vectors.vector_size != dim:
        raise InputError(f"the word vectors have {keyed_vectors.vector_size} dimensions, the model expects {dim}; "
                         "set word_dim in the config to match the file")
    table = np.zeros((len(vocab), dim), dtype=np.float32)
    for i, token in enumerate(vocab.tokens):
        if token in keyed_vectors.key_to_index:
            table[i] = keyed_vectors[token]
    return table


class CharVocabulary:
    """Characters of the vocabulary words; id 0 pads, id 1 is any unseen character."""

    def __init__(self, chars: str):
        self.chars = chars
        self.index = {c: i + 2 for i, c in enumerate(chars)}

    @classmethod
    def build(cls, words: Iterable[str]) -> "CharVocabulary":
        seen = sorted({c for w in words for c in w})
        return cls("".join(seen))

    def __len__(self) -> int:
        return len(self.chars) + 2

    def encode(self, word: str) -> list[int]:
        """Char ids of `word`, cut to MAX_WORD_CHARS."""
        return [self.index.get(c, 1) for c in word[:MAX_WORD_CHARS]]


@dataclass
class WordBatch:
    """The distinct words of a batch: row 0 is padding; `vocab_ids` is `<unk>` for a word outside the vocabulary."""

    words: list[str]
    vocab_ids: torch.Tensor  # long [U]
    char_ids: torch.Tensor  # long [U, L]
    char_lengths: torch.Tensor  # long [U]
    idf: torch.Tensor  # float [U]

    @classmethod
    def build(cls, words: Sequence[str], vocab: Vocabulary, chars: CharVocabulary) -> "WordBatch":
        """`words` must be distinct and start with the padding word ''."""
        encoded = [chars.encode(w) for w in words]
        lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
        width = max(1, int(lengths.max(initial=1)))
        char_ids = np.zeros((len(words), width), dtype=np.int64)
        char_ids[np.arange(width) < lengths[:, None]] = [c for e in encoded for c in e]
        vocab_ids = torch.tensor([PAD_ID if i == 0 else vocab.id(w) for i, w in enumerate(words)], dtype=torch.long)
        idf = torch.tensor([0.0 if i == 0 else vocab.idf_of(w) for i, w in enumerate(words)], dtype=torch.float32)
        return cls(list(words), vocab_ids, torch.from_numpy(char_ids), torch.from_numpy(lengths), idf)


class CharBiLSTM(nn.Module):
    """Char-level BiLSTM: the last forward (25) and backward (25) states concatenated give a word a 50-d vector."""

    def __init__(self, n_chars: int, char_dim: int = 16, hidden: int = 25):
        super().__init__()
        self.out_dim = 2 * hidden
        self.embed = nn.Embedding(n_chars, char_dim, padding_idx=0)
        self.lstm = nn.LSTM(char_dim, hidden, batch_first=True, bidirectional=True)

    def forward(self, char_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """[U, L] char ids and their lengths → [U, 50]; an empty word (padding) gives zeros."""
        out = torch.zeros((char_ids.shape[0], self.out_dim), dtype=torch.float32, device=char_ids.device)
        rows = torch.nonzero(lengths > 0, as_tuple=True)[0]
        if len(rows) == 0:
            return out
        packed = pack_padded_sequence(self.embed(char_ids[rows]), lengths[rows].cpu(), batch_first=True,
                                      enforce_sorted=False)
        _, (h_n, _) = self.lstm(packed)
        return out.index_put((rows,), torch.cat([h_n[0], h_n[1]], dim=1))


class WordEmbedder(nn.Module):
    """word2vec part (frozen unless fine-tuned) + char-BiLSTM part: 300 + 50 = 350-d word inputs."""

    def __init__(self, word_vectors: np.ndarray, n_chars: int, char_dim: int = 16, char_hidden: int = 25,
                 use_chars: bool = True, fine_tune: bool = False):
        super().__init__()
        self.words = nn.Embedding.from_pretrained(torch.from_numpy(np.asarray(word_vectors, dtype=np.float32)),
                                                  freeze=not fine_tune, padding_idx=PAD_ID)
        self.chars = CharBiLSTM(n_chars, char_dim, char_hidden) if use_chars else None
        self.dim = self.words.embedding_dim + (self.chars.out_dim if self.chars is not None else 0)
        self._char_cache: torch.Tensor | None = None  # [V, 50] at inference

    def cache_chars(self, vocab: Vocabulary, chars: CharVocabulary, batch: int = 4096) -> None:
        """Compute every vocabulary word's char vector once (inference); `train()` drops the cache."""
        if self.chars is None:
            return
        parts = []
        with torch.no_grad():
            for start in range(0, len(vocab), batch):
                words = [("" if i == PAD_ID else t) for i, t in enumerate(vocab.tokens[start:start + batch], start)]
                wb = WordBatch.build([""] + words, vocab, chars)
                parts.append(self.chars(wb.char_ids, wb.char_lengths)[1:])
        self._char_cache = torch.cat(parts)

    def train(self, mode: bool = True):
        if mode:
            self._char_cache = None
        return super().train(mode)

    def forward(self, batch: WordBatch) -> torch.Tensor:
        """[U, 350] vectors of the batch's distinct words."""
        w = self.words(batch.vocab_ids)
        if self.chars is None:
            return w
        if self._char_cache is not None and not self.training:
            c = self._char_cache[batch.vocab_ids]
            oov = torch.nonzero(batch.vocab_ids == UNK_ID, as_tuple=True)[0]
            if len(oov):
                c = c.index_put((oov,), self.chars(batch.char_ids[oov], batch.char_lengths[oov]))
        else:
            c = self.chars(batch.char_ids, batch.char_lengths)
        return torch.cat([w, c], dim=1)


def sum_emb(words: torch.Tensor, index: torch.Tensor, mask: torch.Tensor, idf: torch.Tensor,
            norm: str = "idf_l2") -> torch.Tensor:
    """SumEMB E of each text: [U, D] distinct word vectors, [B, T] index into them, [B, T] mask of real words,
    [U] IDF of each distinct word → [B, D].

    "sum" is the paper's raw sum; "mean" divides by the word count; "idf_l2" (default) is the
    IDF-weighted mean (stop words weigh 0) scaled to unit L2 length, which keeps exp(−‖·‖₁) away from 0.
    Computed as a [B, U] word-weight matrix times the word vectors, so no [B, T, D] copy is made.
    """
    if norm not in E_NORMS:
        raise ValueError(f"unknown E normalisation {norm!r}; use one of {', '.join(E_NORMS)}")
    weight = mask * idf[index] if norm == "idf_l2" else mask
    per_word = torch.zeros((index.shape[0], words.shape[0]), dtype=words.dtype, device=words.device)
    per_word.scatter_add_(1, index, weight)
    summed = per_word @ words
    if norm == "sum":
        return summed
    total = weight.sum(1, keepdim=True)
    if norm == "mean":
        return summed / total.clamp(min=1.0)
    mean = summed / total.clamp(min=1e-6)
    return mean / mean.norm(dim=1, keepdim=True).clamp(min=1e-6)


def is_boundary(token: str) -> bool:
    """True for the sentence-boundary marker, which counts for h but not for E."""
    return token == EOS
