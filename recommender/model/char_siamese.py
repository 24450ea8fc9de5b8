"""The character-level Siamese BLSTM of Neculoiu, Versteegh and Rotaru (2016), as a standalone text encoder.

    text → its characters (lower-cased, cut to `max_chars` = 100) → a learned 32-d embedding per character
         → 4 stacked bidirectional LSTM layers, 64 units each way (dropout 0.4 between layers, recurrent dropout 0.2)
         → the outputs averaged over the text's characters → one dense projection (128-d)
    energy E(a, b) = cosine of the two projections
    loss   similar pairs (1 − E)² / 4;   dissimilar pairs E² when E > m (the margin), else 0

Trained with Adam on pairs with 4 dissimilar pairs per similar one: labelled pairs when a help desk has them
(similar = label ≥ REL, each query's labelled negatives first, random tickets fill up to 4), otherwise the mined
pairs of label-free training (`mining.mine_pairs` with the shared `augment.Augmenter`: a ticket's noisy subject —
typos of 20 % substituted / 5 % deleted characters, synonyms induced from word2vec on the knowledge base, extra
and dropped words — against its own ticket, 4 negatives of which half are BM25-hard). The text of a query or a
ticket is one configurable component (`CharSiameseConfig.component`: SUB by default, or e.g. SUB+DESC).

Where this deviates from the paper's notes (paper-notes.md §2), and why:

- Dissimilar loss. The notes write E² *when E < m*. Taken literally every pair's loss is 0 when the network maps
  every text to one vector (E = 1: (1 − 1)²/4 = 0, and E = 1 ≥ m), so training collapses. We charge a dissimilar
  pair only when it is *more* similar than the margin (the contrastive loss of Hadsell et al. 2006 in energy form).
- Recurrent dropout. nn.LSTM (one fused kernel) cannot drop the state between time steps per sequence. We drop
  the hidden-to-hidden weights instead (DropConnect, Wan et al. 2013, as in AWD-LSTM): one mask per batch, the
  same recurrent connections dropped at every step, like variational recurrent dropout (Gal & Ghahramani 2016).
  Dropout 0.4 between the layers is nn.LSTM's own.
- Padding. Texts are cut to 100 characters, but the average runs over a text's own characters, and no LSTM
  direction reads padding (`CharBLSTM`), so a text's vector does not depend on the batch it is encoded in.
- Negatives of mined pairs. With the mined pairs, the 4 dissimilar texts of each similar pair come from the other
  tickets of its batch (in-batch), not from the mined negatives: an epoch then encodes 2 texts per similar pair
  instead of 6. They are the batch's most similar ones (`in_batch_negatives="hardest"`); random ones, as the paper
  sampled, trained slower on SeaMonkey's mined held-out slice (MRR@10 0.15 against 0.29 after 3 epochs). Labelled
  pairs keep their own negatives (random tickets fill up to 4).
- The notes give no margin, learning rate or epoch count: m = 0.5, Adam's default 1e-3, 8 epochs (m = 0 and
  m = 0.8, lr 3e-4 and 3e-3, and no dropout at all did not train better in short trials on that slice).
- The notes do not give the input encoding or the projection size: a 32-d character embedding and 128 outputs.

At query time only the query is encoded (torch); `similarity` is numpy. Vectors are L2-normalised, so cosine is a
dot product and an index stores one [n, 128] float32 matrix per knowledge base (`encode_tickets`).
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call
from tqdm import tqdm

from ..data.records import REL, YES, Query, Ticket, component_text, ticket_text
from ..data.store import Dataset
from ..errors import InputError, ModelError
from ..files import atomic_directory
from ..lexical.analyzer import tokenize
from .augment import Augmenter, induce_synonyms
from .mining import MiningConfig, mine_pairs
from .saved_config import SavedConfig

FORMAT_VERSION = 1
ARCH = "char-siamese"
#: Text fields a component may join ("SUB", "DESC", "SOL", or several joined by "+", e.g. "SUB+DESC").
FIELDS = ("SUB", "DESC", "SOL")
PAD, UNKNOWN = 0, 1
#: Held-out queries are ranked against at most this many tickets (their own always among them).
MAX_RANKED = 3000
_WEIGHTS = "weights.pt"


@dataclass
class CharSiameseConfig(SavedConfig):
    """The hyperparameters of the network and its training (stored in the model's config.json)."""

    component: str = "SUB"
    max_chars: int = 100
    lowercase: bool = True
    min_char_count: int = 2
    char_dim: int = 32
    hidden: int = 64
    layers: int = 4
    output_dim: int = 128
    recurrent_dropout: float = 0.2
    dropout: float = 0.4
    margin: float = 0.5
    negatives: int = 4
    relevant_min: float = REL
    lr: float = 1e-3
    batch_size: int = 64
    epochs: int = 8
    clip: float = 5.0
    augmented: int = 2  # noisy copies of each training subject among the mined pairs
    held_out: float = 0.15  # the mined slice kept out of training: the trained epoch with its best MRR@10 is kept
    in_batch_negatives: str = "hardest"  # mined pairs: the batch's most similar other texts, or "random" ones

    def __post_init__(self):
        parts = self.component.split("+")
        if not parts or any(p not in FIELDS for p in parts) or len(set(parts)) != len(parts):
            raise InputError(f"component {self.component!r} is not SUB, DESC, SOL or several of them joined by '+' "
                             "(e.g. SUB+DESC)")
        if min(self.max_chars, self.char_dim, self.hidden, self.layers, self.output_dim, self.negatives,
               self.batch_size, self.min_char_count) < 1 or self.epochs < 0 or self.augmented < 0:
            raise InputError("max_chars, char_dim, hidden, layers, output_dim, negatives, batch_size and "
                             "min_char_count must be ≥ 1; epochs and augmented ≥ 0")
        if not (0.0 <= self.recurrent_dropout < 1.0 and 0.0 <= self.dropout < 1.0):
            raise InputError("recurrent_dropout and dropout must be within [0, 1)")
        if self.in_batch_negatives not in ("hardest", "random"):
            raise InputError(f"in_batch_negatives is 'hardest' or 'random', not {self.in_batch_negatives!r}")
        if not -1.0 <= self.margin <= 1.0:
            raise InputError(f"margin is a cosine: give a value within [-1, 1], not {self.margin}")

    @classmethod
    def from_dict(cls, data: dict | None) -> "CharSiameseConfig":
        """Build from JSON; an unknown key raises InputError naming it."""
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"unknown char-siamese option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        try:
            return cls(**data)
        except TypeError as exc:  # a value of the wrong type, e.g. "epochs": "five"
            raise InputError(f"a char-siamese option has a value of the wrong type ({exc}); give numbers for the "
                             "sizes and rates, a string for component and in_batch_negatives") from exc

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def contrastive_loss(energy: torch.Tensor, similar: torch.Tensor, margin: float) -> torch.Tensor:
    """Per-pair loss: (1 − E)²/4 for similar pairs, E² for dissimilar pairs more similar than `margin`, else 0."""
    positive = (1.0 - energy) ** 2 / 4.0
    negative = torch.where(energy > margin, energy ** 2, torch.zeros_like(energy))
    return torch.where(similar, positive, negative)


class CharBLSTM(nn.Module):
    """Characters → stacked BLSTM → mean over each text's characters → dense projection (not normalised).

    Each layer is two one-directional nn.LSTMs over padded batches, the backward one reading every text reversed in
    place (its padding left where it is), so no direction ever reads padding before a character: exactly what packed
    sequences give, at the speed of padded ones (on CPU, backpropagating through a packed 4-layer BLSTM took 3× as
    long)."""

    def __init__(self, n_chars: int, config: CharSiameseConfig):
        super().__init__()
        self.embed = nn.Embedding(n_chars, config.char_dim, padding_idx=PAD)
        self.cells = nn.ModuleList(nn.LSTM(config.char_dim if layer == 0 else 2 * config.hidden, config.hidden,
                                           batch_first=True)
                                   for layer in range(config.layers) for _ in ("forward", "backward"))
        self.project = nn.Linear(2 * config.hidden, config.output_dim)
        self.recurrent_dropout, self.dropout = config.recurrent_dropout, config.dropout

    def _run(self, cell: nn.LSTM, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.recurrent_dropout > 0:  # DropConnect on the recurrent weights: see the module doc
            params = {name: nn.functional.dropout(p, self.recurrent_dropout, True) if name.startswith("weight_hh")
                      else p for name, p in cell.named_parameters()}
            return functional_call(cell, params, (x,))[0]
        return cell(x)[0]

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """[B, T] character ids (PAD after each text's `lengths[i]` ≥ 1 characters) → [B, output_dim]."""
        steps = torch.arange(ids.shape[1])[None, :]
        valid = steps < lengths[:, None]
        backwards = torch.where(valid, lengths[:, None] - 1 - steps, steps)[:, :, None]

        def flip(h: torch.Tensor) -> torch.Tensor:  # each text reversed, its padding in place
            return h.gather(1, backwards.expand(-1, -1, h.shape[2]))

        h = self.embed(ids)
        for layer in range(len(self.cells) // 2):
            if layer:
                h = nn.functional.dropout(h, self.dropout, self.training)
            forward = self._run(self.cells[2 * layer], h)
            backward = flip(self._run(self.cells[2 * layer + 1], flip(h)))
            h = torch.cat([forward, backward], dim=2)
        mean = (h * valid[:, :, None].to(h.dtype)).sum(1) / lengths.to(h.dtype)[:, None]
        return self.project(mean)


@dataclass
class _Pairs:
    """Training pairs as texts: pair k is (left[k], right[k]), similar or not. With `in_batch`, every pair is
    similar and each batch adds `negatives` dissimilar pairs per similar one: its left text against right texts of
    other pairs of the batch that differ from its own (`CharSiamese._with_in_batch_negatives`)."""

    left: list[str]
    right: list[str]
    similar: np.ndarray
    in_batch: bool = False


@dataclass
class _HeldOut:
    """Held-out queries and the texts they rank: query i must find text `truth[i]`."""

    queries: list[str]
    texts: list[str]
    truth: np.ndarray


class CharSiamese:
    """The character-level Siamese BLSTM: `fit`, `encode`, `similarity`, `save` / `load`.

    As a channel of the multi-channel Manhattan metric, use `channel_vectors(texts)`: the L2-normalised outputs,
    so that L1 between them tracks the cosine energy (for unit vectors ‖a − b‖² = 2 − 2·cos, and L1 grows with L2).
    """

    def __init__(self, config: CharSiameseConfig | None = None, chars: str = "", net: CharBLSTM | None = None,
                 meta: dict | None = None):
        self.config = config or CharSiameseConfig()
        self.chars = chars
        self.index = {c: i + 2 for i, c in enumerate(chars)}
        self.net = net
        self.meta = dict(meta or {})
        self._version: str | None = None

    @property
    def dim(self) -> int:
        """Width of an encoded row (the projection's output)."""
        return self.config.output_dim

    # -- texts ---------------------------------------------------------------------------------------------------
    def text_of(self, item: Query | Ticket) -> str:
        """The text this network reads of a query or ticket (its configured component)."""
        return component_text(item, self.config.component)

    def _ids(self, text: str) -> list[int]:
        text = text.lower() if self.config.lowercase else text
        return [self.index.get(c, UNKNOWN) for c in text[: self.config.max_chars]]

    def _tensors(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = [self._ids(t) or [UNKNOWN] for t in texts]
        lengths = torch.tensor([len(x) for x in ids], dtype=torch.int64)
        batch = torch.full((len(ids), int(lengths.max())), PAD, dtype=torch.int64)
        for i, x in enumerate(ids):
            batch[i, : len(x)] = torch.tensor(x, dtype=torch.int64)
        return batch, lengths

    def _require_net(self) -> CharBLSTM:
        if self.net is None:
            raise ModelError("this char-siamese model is not trained; fit it, or load one with CharSiamese.load")
        return self.net

    # -- the interface --------------------------------------------------------------------------------------------
    def encode(self, texts: Sequence[str], batch_size: int = 256, progress: bool = False) -> np.ndarray:
        """[n, output_dim] float32 unit vectors of `texts` (a zero row for an empty text): what an index stores per
        ticket, computed once. Batches of similar lengths, no gradients."""
        net = self._require_net()
        texts = list(texts)
        out = np.zeros((len(texts), self.config.output_dim), dtype=np.float32)
        rows = [i for i, t in enumerate(texts) if t.strip()]
        rows.sort(key=lambda i: min(len(texts[i]), self.config.max_chars))
        was_training = net.training
        net.eval()
        try:
            with torch.no_grad():
                for start in tqdm(range(0, len(rows), batch_size), desc="encoding characters", disable=not progress,
                                  leave=False):
                    chunk = rows[start : start + batch_size]
                    vectors = net(*self._tensors([texts[i] for i in chunk]))
                    out[chunk] = nn.functional.normalize(vectors, dim=1).numpy()
        finally:
            net.train(was_training)
        return out

    def channel_vectors(self, texts: Sequence[str]) -> np.ndarray:
        """The vectors a Manhattan-metric channel should use: the L2-normalised outputs (`encode`). L1 between unit
        vectors tracks the cosine energy the network was trained on."""
        return self.encode(texts)

    def encode_queries(self, queries: Sequence[Query | Ticket], progress: bool = False) -> np.ndarray:
        """`encode` of the queries' component text (a ticket asking as a query: its subject and description)."""
        return self.encode([component_text(q, self.config.component, solution=False) for q in queries],
                           progress=progress)

    def encode_tickets(self, tickets: Sequence[Ticket], progress: bool = False) -> np.ndarray:
        """`encode` of the tickets' component text."""
        return self.encode([self.text_of(t) for t in tickets], progress=progress)

    @staticmethod
    def similarity(query_vecs: np.ndarray, ticket_vecs: np.ndarray) -> np.ndarray:
        """The energy (cosine of unit vectors): one query [d] or [1, d] against every row of `ticket_vecs` [n, d]
        → [n]; or aligned rows [n, d] × [n, d] → [n]."""
        q = np.asarray(query_vecs, dtype=np.float32)
        t = np.asarray(ticket_vecs, dtype=np.float32)
        if q.ndim == 1 or q.shape[0] == 1 and t.shape[0] != 1:
            return t @ q.reshape(-1)
        if q.shape != t.shape:
            raise ValueError(f"similarity takes one query against many tickets or aligned rows, not {q.shape} "
                             f"against {t.shape}")
        return np.einsum("ij,ij->i", q, t)

    def score_pairs(self, queries: Sequence[Query], tickets: Sequence[Ticket]) -> np.ndarray:
        """The energy of aligned (query, ticket) pairs."""
        if len(queries) != len(tickets):
            raise ValueError("score_pairs needs as many queries as tickets (aligned pairs)")
        return self.similarity(self.encode_queries(queries), self.encode_tickets(tickets)).astype(np.float64)

    def ranker(self, tickets: Sequence[Ticket], progress: bool = False) -> Callable[[Ticket, int], list[str]]:
        """A ranker of the duplicates protocol (`evaluation.duplicates.Ranker`): the tickets encoded once, each
        query ticket's component against all of them, best first (ties by position)."""
        return _ranker(self, tickets, progress)

    # -- training -------------------------------------------------------------------------------------------------
    def fit(self, tickets: Sequence[Ticket], labelled: Dataset | None = None, *, seed: int = 0, progress: bool = True,
            echo: Callable[[str], None] | None = None) -> "CharSiamese":
        """Train on `labelled` pairs when given (their tickets join the knowledge base), else on pairs mined from
        the knowledge base `tickets`; deterministic for a seed (one torch thread). One line per stage to `echo`,
        a progress bar per epoch. Returns self."""
        started = time.time()
        echo = echo or (lambda line: tqdm.write(line) if progress else None)
        cfg = self.config
        torch.set_num_threads(1)
        _seed(seed)
        kb = list({t.id: t for t in list(tickets) + list(labelled.tickets if labelled else [])}.values())
        if not kb:
            raise InputError("no tickets to train the char-siamese network on; import them first (ticketrec import FILE)")
        stage = time.time()
        if labelled is not None and labelled.pairs:
            sampler = _LabelledPairs(labelled, kb, cfg)
            held, source, stats = None, "labelled", {"labelled_pairs": len(labelled.pairs),
                                                     "positives": sampler.n_positives}
            echo(f"[{time.time() - stage:7.1f} s] {len(labelled.pairs):,} labelled pairs, {sampler.n_positives:,} of "
                 f"them similar (label ≥ {cfg.relevant_min:g}); {cfg.negatives} negatives each per epoch "
                 f"(the query's labelled ones first, random tickets fill up)")
        else:
            augmenter = knowledge_base_augmenter(kb, seed)
            fixed, held, stats = _mined(kb, cfg, augmenter, seed)
            sampler, source = (lambda rng: fixed), "mined"
            echo(f"[{time.time() - stage:7.1f} s] mined {len(fixed.left):,} similar pairs ({stats['augmented_queries']:,} "
                 f"noisy subjects, {len(augmenter.synonyms):,} words with synonyms), {cfg.negatives} in-batch negatives "
                 f"each; {len(held.queries):,} held-out noisy subjects")
        texts = [self.text_of(t) for t in kb] + (sampler.query_texts if source == "labelled" else [])
        self.chars = char_alphabet(texts, cfg.min_char_count, cfg.lowercase)
        self.index = {c: i + 2 for i, c in enumerate(self.chars)}
        _seed(seed)
        self.net = CharBLSTM(len(self.chars) + 2, cfg)
        self._version = None
        history = self._train(sampler, held, seed, progress, echo)
        self.meta = {"arch": ARCH, "seed": seed, "pairs": source, "tickets": len(kb), **stats, "history": history,
                     "packages": {"torch": torch.__version__, "numpy": np.__version__},
                     "wall_seconds": round(time.time() - started, 1)}
        return self

    def _train(self, sampler, held: _HeldOut | None, seed: int, progress: bool, echo) -> list[dict]:
        cfg, net = self.config, self.net
        rng = np.random.default_rng(seed)
        optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr)
        history: list[dict] = []
        best, best_state = -1.0, None
        if held is not None and cfg.epochs:  # the untrained network's figure: a reference, never kept
            untrained = round(self.held_out_mrr(held), 4)
            history.append({"epoch": 0, "held_out_mrr@10": untrained})
            echo(f"untrained network: held-out MRR@10 {untrained:.3f}")
        for epoch in range(1, cfg.epochs + 1):
            started = time.time()
            pairs = sampler(rng)
            batches = self._batches(pairs, rng)
            net.train()
            total, seen = 0.0, 0
            for rows in tqdm(batches, desc=f"char-siamese epoch {epoch}/{cfg.epochs}", unit="batch",
                             disable=not progress, leave=False):
                left, right = [pairs.left[i] for i in rows], [pairs.right[i] for i in rows]
                texts = list(dict.fromkeys(left + right))  # each distinct text encoded once
                at = {t: i for i, t in enumerate(texts)}
                vectors = nn.functional.normalize(net(*self._tensors(texts)), dim=1, eps=1e-8)
                a = vectors[[at[t] for t in left]]
                b = vectors[[at[t] for t in right]]
                if pairs.in_batch:
                    energy, similar = self._with_in_batch_negatives(a @ b.T, right, rng)
                else:
                    energy, similar = (a * b).sum(1), torch.from_numpy(pairs.similar[rows])
                loss = contrastive_loss(energy, similar, cfg.margin).mean()
                optimizer.zero_grad()
                loss.backward()
                if cfg.clip > 0:
                    nn.utils.clip_grad_norm_(net.parameters(), cfg.clip)
                optimizer.step()
                total += loss.item() * len(energy)
                seen += len(energy)
            row = {"epoch": epoch, "loss": round(total / max(seen, 1), 5), "seconds": round(time.time() - started, 1)}
            line = f"[{row['seconds']:7.1f} s] epoch {epoch}/{cfg.epochs}: loss {row['loss']:.4f} on {seen:,} pairs"
            if held is not None:
                row["held_out_mrr@10"] = round(self.held_out_mrr(held), 4)
                line += f"; held-out MRR@10 {row['held_out_mrr@10']:.3f}"
                if row["held_out_mrr@10"] > best:
                    best, best_state = row["held_out_mrr@10"], copy.deepcopy(net.state_dict())
            history.append(row)
            echo(line)
        if best_state is not None:
            net.load_state_dict(best_state)
            kept = max(history[1:], key=lambda r: (r["held_out_mrr@10"], -r["epoch"]))
            echo(f"kept epoch {kept['epoch']} (held-out MRR@10 {kept['held_out_mrr@10']:.3f})")
        net.eval()
        return history

    def _batches(self, pairs: _Pairs, rng: np.random.Generator, pool: int = 20) -> list[np.ndarray]:
        """The pairs in random batches of similar lengths: shuffled, then sorted by text length within pools of
        `pool` batches (less padding to compute), cut into batches, and the batches shuffled."""
        size = self.config.batch_size
        order = rng.permutation(len(pairs.left))
        length = np.array([min(len(pairs.left[i]), self.config.max_chars) for i in order])
        batches = []
        for start in range(0, len(order), size * pool):
            chunk = order[start : start + size * pool]
            chunk = chunk[np.argsort(length[start : start + size * pool], kind="stable")]
            batches += [chunk[i : i + size] for i in range(0, len(chunk), size)]
        return [batches[i] for i in rng.permutation(len(batches))]

    def _with_in_batch_negatives(self, energies: torch.Tensor, right: Sequence[str],
                                 rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """The energies of a batch's similar pairs (the diagonal of `energies`, left i × right j) and of
        `negatives` dissimilar pairs per similar one: left i against right texts j of the batch that differ from
        its own, the most similar ones (`in_batch_negatives="hardest"`) or random ones."""
        cfg = self.config
        n = len(right)
        codes = np.unique(np.asarray(right, dtype=object), return_inverse=True)[1].reshape(-1)
        same = torch.from_numpy(codes[:, None] == codes[None, :])
        k = min(cfg.negatives, n - 1)
        if cfg.in_batch_negatives == "hardest":
            masked = energies.detach().masked_fill(same, -np.inf)
            picked = masked.topk(k, dim=1).indices
        else:
            noise = torch.from_numpy(rng.random((n, n))).masked_fill(same, -1.0)
            picked = noise.topk(k, dim=1).indices
        usable = ~same.gather(1, picked)  # a batch of few distinct texts may leave too few others
        negative = energies.gather(1, picked)[usable]
        energy = torch.cat([energies.diagonal(), negative])
        similar = torch.cat([torch.ones(n, dtype=torch.bool), torch.zeros(len(negative), dtype=torch.bool)])
        return energy, similar

    def held_out_mrr(self, held: _HeldOut, k: int = 10) -> float:
        """MRR@k of the held-out queries finding their own text."""
        q = self.encode(held.queries)
        t = self.encode(held.texts)
        scores = q @ t.T
        own = scores[np.arange(len(held.truth)), held.truth]
        rank = 1 + (scores > own[:, None]).sum(1)
        return float(np.where(rank <= k, 1.0 / rank, 0.0).mean()) if len(rank) else 0.0

    # -- persistence ----------------------------------------------------------------------------------------------
    def _state(self) -> dict[str, torch.Tensor]:
        return self._require_net().state_dict()

    @property
    def version(self) -> str:
        """Fingerprint of the hyperparameters, the alphabet and every weight."""
        if self._version is None:
            h = hashlib.sha256(json.dumps({"arch": ARCH, "hyperparameters": self.config.fingerprint_dict(),
                                           "chars": self.chars}, sort_keys=True).encode())
            for name, tensor in sorted(self._state().items()):
                h.update(name.encode())
                h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
            self._version = h.hexdigest()[:16]
        return self._version

    def save(self, path: str | Path) -> None:
        """Write the model directory atomically (config.json: format version, hyperparameters, alphabet, the
        SHA-256 of every other file, the training report; weights.pt: the state dict)."""
        from .pretrained import file_checksums

        with atomic_directory(path, marker="config.json") as tmp:
            torch.save(self._state(), tmp / _WEIGHTS)
            config = {"format_version": FORMAT_VERSION, "arch": ARCH, "version": self.version,
                      "hyperparameters": self.config.to_dict(), "chars": self.chars, "files": file_checksums(tmp),
                      **{k: v for k, v in self.meta.items() if k not in ("arch", "version")}}
            (tmp / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "CharSiamese":
        """Read a model directory; a missing, changed or foreign file raises ModelError saying what to do."""
        from .pretrained import file_checksums

        path = Path(path)
        retrain = f"retrain it: ticketrec train --arch {ARCH} --out {path}"
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise ModelError(f"no char-siamese model at {path} (no config.json); train one: "
                             f"ticketrec train --arch {ARCH} --out {path}")
        try:
            config = json.loads(cfg_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelError(f"cannot read {cfg_file}: {exc}; {retrain}") from exc
        if not isinstance(config, dict) or config.get("arch") != ARCH:
            got = config.get("arch") if isinstance(config, dict) else None
            raise ModelError(f"{path} holds a {got or 'Replicated Siamese LSTM'} model, not a {ARCH} one; give the "
                             f"directory of a model trained with --arch {ARCH}")
        if config.get("format_version") != FORMAT_VERSION:
            raise ModelError(f"{cfg_file} has format version {config.get('format_version')!r}, this ticketrec reads "
                             f"{FORMAT_VERSION}; {retrain}")
        files = config.get("files")
        found = {k: v for k, v in file_checksums(path).items() if k != "config.json"}
        if not isinstance(files, dict) or found != files:
            differ = sorted(set(found) ^ set(files or {}) | {k for k in (files or {}) if found.get(k) != files[k]})
            raise ModelError(f"the files of {path} do not match the SHA-256 recorded in its config.json "
                             f"({', '.join(differ) or 'no record'}); the model directory is damaged, {retrain}")
        try:
            hyper = CharSiameseConfig.from_saved(config["hyperparameters"])
            chars = str(config["chars"])
            state = torch.load(path / _WEIGHTS, map_location="cpu", weights_only=True)
            net = CharBLSTM(len(chars) + 2, hyper)
            net.load_state_dict(state, strict=True)
        except (InputError, KeyError, TypeError, RuntimeError, OSError, ValueError) as exc:
            raise ModelError(f"cannot read the char-siamese model in {path}: {exc}; {retrain}") from exc
        net.eval()
        meta = {k: v for k, v in config.items()
                if k not in ("format_version", "version", "hyperparameters", "chars", "files")}
        model = cls(hyper, chars, net, meta)
        if model.version != config.get("version"):
            raise ModelError(f"the weights of {path} do not match the version in its config.json "
                             f"({model.version} != {config.get('version')}); {retrain}")
        return model

    @staticmethod
    def is_saved_at(path: str | Path) -> bool:
        """Whether `path` holds a char-siamese model directory (by its config.json's arch; not verified)."""
        try:
            return json.loads((Path(path) / "config.json").read_text(encoding="utf-8")).get("arch") == ARCH
        except (OSError, ValueError, AttributeError):
            return False


# -- data ---------------------------------------------------------------------------------------------------------
def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def char_alphabet(texts: Sequence[str], min_count: int = 2, lowercase: bool = True) -> str:
    """The characters seen at least `min_count` times in `texts`, sorted (the others read as one unknown id)."""
    counts = Counter(c for t in texts for c in (t.lower() if lowercase else t))
    return "".join(sorted(c for c, n in counts.items() if n >= min_count))


def knowledge_base_augmenter(tickets: Sequence[Ticket], seed: int = 0) -> Augmenter:
    """The shared `Augmenter` of label-free training, from the knowledge base alone: synonyms induced from word2vec
    trained on the tickets' text (`augment.induce_synonyms`), extra words from its frequent words."""
    from .embeddings import train_word2vec

    sentences = [tokenize(ticket_text(t)) for t in tickets]
    synonyms: dict[str, list[str]] = {}
    if any(sentences):
        vectors = train_word2vec(sentences, dim=100, seed=seed, epochs=5, min_count=3)
        words = list(vectors.index_to_key)
        counts = [int(vectors.get_vecattr(w, "count")) for w in words]
        synonyms = induce_synonyms(words, vectors.vectors, counts)
    frequency = Counter(w for s in sentences for w in s)
    extra = [w for w, c in frequency.most_common() if c >= 3 and w.isalpha() and len(w) > 2][:5000]
    return Augmenter(synonyms, extra, seed=seed)


def _mined(kb: Sequence[Ticket], cfg: CharSiameseConfig, augmenter: Augmenter, seed: int):
    """The similar mined pairs (`mining.mine_pairs`) as texts of the configured component: a mined query (a
    subject, or a noisy copy of it) against its own ticket, negatives drawn in-batch; the held-out slice's
    subjects, made noisy, must find their own ticket among all."""
    mining = MiningConfig(negatives=cfg.negatives, augmented=cfg.augmented, held_out=cfg.held_out,
                          adapt_pretrained=False)
    mined = mine_pairs(kb, mining, seed, augmenter)
    by_id = {t.id: t for t in kb}
    full = [by_id[v.id] for v in mined.views]
    right = [component_text(t, cfg.component) for t in full]
    similar = np.flatnonzero(mined.train_y >= YES)
    fixed = _Pairs([component_text(mined.train_queries[int(mined.train_q[k])], cfg.component) for k in similar],
                   [right[int(mined.train_t[k])] for k in similar], np.ones(len(similar), dtype=bool), in_batch=True)
    rng = np.random.default_rng(seed)
    ranked = np.arange(len(full))
    if len(ranked) > MAX_RANKED:
        rest = np.setdiff1d(ranked, mined.held_out_truth)
        ranked = np.union1d(mined.held_out_truth, rng.choice(rest, MAX_RANKED - len(np.unique(mined.held_out_truth)),
                                                             replace=False))
    queries = [component_text(Query(augmenter.augment(q.subject, key="held-out"), q.description), cfg.component)
               for q in mined.held_out_queries]
    held = _HeldOut(queries, [right[int(r)] for r in ranked], np.searchsorted(ranked, mined.held_out_truth))
    stats = {k: mined.stats[k] for k in ("minable_tickets", "held_out_tickets", "train_queries", "augmented_queries",
                                         "train_pairs")}
    return fixed, held, stats


class _LabelledPairs:
    """Labelled pairs, resampled every epoch: each similar pair (label ≥ relevant_min) with `negatives` dissimilar
    ones of the same query (its labelled negatives first, in a random order; random tickets of the knowledge base
    not labelled similar to it fill up)."""

    def __init__(self, data: Dataset, kb: Sequence[Ticket], cfg: CharSiameseConfig):
        from .pairs import PairSet

        pairs = PairSet.from_dataset(data, "labelled")
        self.cfg = cfg
        self.query_texts = [component_text(q, cfg.component) for q in pairs.queries]
        self.kb_texts = [component_text(t, cfg.component) for t in kb]
        kb_row = {t.id: i for i, t in enumerate(kb)}
        self.positives: list[tuple[int, int]] = []
        self.labelled_negatives: dict[int, list[int]] = {}
        self.excluded: dict[int, set[int]] = {}
        for q, t, y in zip(pairs.q.tolist(), pairs.t.tolist(), pairs.y.tolist()):
            row = kb_row[pairs.tickets[t].id]
            if y >= cfg.relevant_min:
                self.positives.append((q, row))
                self.excluded.setdefault(q, set()).add(row)
            else:
                self.labelled_negatives.setdefault(q, []).append(row)
        self.n_positives = len(self.positives)
        if not self.positives:
            raise InputError(f"the labelled pairs hold no similar pair (label ≥ {cfg.relevant_min:g}): the network "
                             "cannot learn what is similar; add such pairs, or train without --train (mined pairs)")

    def __call__(self, rng: np.random.Generator) -> _Pairs:
        left, right, similar = [], [], []
        n = len(self.kb_texts)
        for q, row in self.positives:
            own = self.labelled_negatives.get(q, [])
            chosen = [own[i] for i in rng.permutation(len(own))[: self.cfg.negatives]]
            excluded = self.excluded.get(q, set()) | set(chosen)
            while len(chosen) < self.cfg.negatives and len(excluded) < n:
                r = int(rng.integers(n))
                if r not in excluded:
                    chosen.append(r)
                    excluded.add(r)
            for r, same in [(row, True)] + [(r, False) for r in chosen]:
                left.append(self.query_texts[q])
                right.append(self.kb_texts[r])
                similar.append(same)
        return _Pairs(left, right, np.array(similar, dtype=bool))


# -- the character-trigram baseline behind the same interface, and the `siamese` grid's rows ------------------------
class TrigramEncoder:
    """The character-trigram matcher (`lexical.trigram.TrigramMatcher`) behind the encoder interface: `fit` takes
    the IDF from the knowledge base's component texts; vectors are sparse unit TF-IDF rows (scipy CSR), so
    `similarity` is their cosine."""

    def __init__(self, component: str = "SUB"):
        CharSiameseConfig(component=component)  # the same components as the network
        self.component = component
        self.matcher = None

    def fit(self, tickets: Sequence[Ticket]) -> "TrigramEncoder":
        """IDF over the tickets' component texts. Returns self."""
        from ..lexical.trigram import TrigramMatcher

        self.matcher = TrigramMatcher([component_text(t, self.component) for t in tickets])
        return self

    @property
    def version(self) -> str:
        """Fingerprint of the component and the IDF."""
        h = hashlib.sha256(self.component.encode())
        h.update(np.ascontiguousarray(self.matcher.vectorizer.idf_, dtype=np.float64).tobytes())
        h.update(json.dumps(sorted(self.matcher.vectorizer.vocabulary_.items())).encode())
        return h.hexdigest()[:16]

    def encode_queries(self, queries: Sequence[Query | Ticket], progress: bool = False):
        """Sparse vectors of the queries' component text (a ticket asking as a query: without its solution)."""
        return self.matcher.transform([component_text(q, self.component, solution=False) for q in queries])

    def encode_tickets(self, tickets: Sequence[Ticket], progress: bool = False):
        """Sparse vectors of the tickets' component text."""
        return self.matcher.transform([component_text(t, self.component) for t in tickets])

    @staticmethod
    def similarity(query_vecs, ticket_vecs) -> np.ndarray:
        """Cosine of one query (a 1-row sparse matrix) to every row of `ticket_vecs`."""
        from ..lexical.trigram import TrigramMatcher

        return TrigramMatcher.cosine(query_vecs, ticket_vecs)

    def ranker(self, tickets: Sequence[Ticket], progress: bool = False) -> Callable[[Ticket, int], list[str]]:
        """A ranker of the duplicates protocol over `tickets` (see `CharSiamese.ranker`)."""
        return _ranker(self, tickets)


def _ranker(encoder, tickets: Sequence[Ticket], progress: bool = False) -> Callable[[Ticket, int], list[str]]:
    ids = [t.id for t in tickets]
    matrix = encoder.encode_tickets(tickets, progress=progress)
    position = np.arange(len(ids))

    def rank(query: Ticket, n: int) -> list[str]:
        scores = encoder.similarity(encoder.encode_queries([query])[0], matrix)
        return [ids[int(i)] for i in np.lexsort((position, -scores))[:n]]

    return rank


def grid_model(train: Dataset, dev: Dataset | None, overrides: dict, seed: int, out: str | Path,
               progress: bool = False):
    """The model of a `ticketrec evaluate --grid siamese` row. `overrides`: "arch" "char-siamese" (default) or
    "trigram"; "pairs" "labelled" (default: the `train` Dataset's labelled pairs) or "mined" (pairs mined from its
    tickets, no labels); the rest are CharSiameseConfig fields. `dev` is never looked at: no early stopping or
    selection on it (the trigram IDF reads its tickets' text, as the main model's unsupervised parts do). A network
    is saved to `out`, and reused from there when an interrupted run already trained it with this config and seed."""
    overrides = dict(overrides)
    arch = overrides.pop("arch", ARCH)
    pairs = overrides.pop("pairs", "labelled")
    if arch == "trigram":
        return TrigramEncoder(**overrides).fit(list(train.tickets) + list(dev.tickets if dev is not None else []))
    if arch != ARCH or pairs not in ("labelled", "mined"):
        raise InputError(f"a char-siamese grid row takes arch char-siamese or trigram and pairs labelled or mined, "
                         f"not {arch!r} / {pairs!r}")
    config = CharSiameseConfig.from_dict(overrides)
    labelled = train if pairs == "labelled" else None
    if CharSiamese.is_saved_at(out):
        try:
            done = CharSiamese.load(out)
            if (done.config == config and done.meta.get("seed") == seed and done.meta.get("pairs") == pairs
                    and done.meta.get("data_fingerprint") == _fingerprint(train)):
                return done
        except ModelError:
            pass
    model = CharSiamese(config).fit(train.tickets, labelled, seed=seed, progress=progress)
    model.meta["data_fingerprint"] = _fingerprint(train)
    model.save(out)
    return model


def _fingerprint(data: Dataset) -> str:
    from .pairs import dataset_fingerprint

    return dataset_fingerprint(data)
