"""The variational Siamese network of Deudon (2018) (`paper-notes.md` §3, issue 13): a text becomes a Gaussian
"intent", two intents are compared by their element-wise Wasserstein-2 distance and the Hadamard product of their
means, and a small MLP turns that into P(similar).

    text → word vectors (frozen) → bi-LSTM → mean of its outputs h → μ = s·BN(Linear(h)), log σ² = Linear(h)
    features(q, t) = [ (μ_q − μ_t)² + (σ_q − σ_t)²  ;  μ_q ⊙ μ_t ]                                   2 · latent
    P(similar | q, t) = sigmoid(W₂ · relu(W₁ · features + b₁) + b₂)                                  2-layer MLP

The first half of the features is the element-wise squared Wasserstein-2 distance between the diagonal Gaussians
N(μ_q, σ_q²) and N(μ_t, σ_t²) (summed over the dimensions it is W₂²); the second is the means' Hadamard product.
Both are symmetric, so is the score. μ is batch-normalised to a fixed spread s per dimension (`mu_scale`; BN-VAE,
Zhu et al. 2020): without it the VAE collapsed (μ the same for every text to ±0.02 on SemEval, the KL budget spent
shrinking σ), and the intents carried nothing to compare.

Training (`VarSiamese.fit`: seeded, deterministic on one thread, one line per stage):

1. word vectors: word2vec (`embeddings.train_word2vec`) on the knowledge base's text, a word2vec file, or a
   TicketModel's vocabulary and vectors; each scaled to length √dim (`unit_rows`);
2. VAE pretraining on the knowledge base: z = μ + σ·ε feeds a GRU decoder (its initial state and every step's
   input) that reconstructs the text ("repeat") and, where pairs exist, the paired text ("reformulate": a labelled
   pair with label ≥ 3, or a mined query and its ticket view, both ways). Loss = token cross-entropy (over the
   `decoder_vocab` most frequent words, the others `<unk>`) + `bow_weight` · a bag-of-words loss (the target's
   words predicted from z alone, Zhao et al. 2017) + β · KL(N(μ, σ²) ‖ N(0, I)), with **KL annealing**: β
   rises linearly from 0 to 1 over the first `kl_warmup` share of the pretraining steps, then stays 1 (Bowman et
   al. 2016); decoder inputs are dropped to `<unk>` with probability `word_dropout`, so the decoder must read z;
3. pair training: encoder and MLP on labelled pairs (label 1–5 → target (label − 1) / 4: YES 1, REL 0.5, NO 0) or,
   without labels, on the pairs `mining.mine_pairs` draws from the tickets (a ticket's subject + first words → its
   own view 1, four other views 0); binary cross-entropy, Adam; the epoch with the best MAP on the dev pairs
   (`dev`, else the mined held-out slice or a held-out share of the labelled queries) is kept. `head="w2"` skips
   this stage: g = exp(−mean W₂ feature), the intents alone (the ablation that says whether the MLP and pairs pay).

Serving: every ticket is encoded once into [μ ; σ] (float32 [n, 2 · latent], `encode_tickets`); a query costs one
encoding plus the MLP over its features with the K candidates' rows, vectorised numpy (`similarity`), no torch.
The decoder serves pretraining only and is not saved.

Model directory (`save` / `load`; written atomically, every file's SHA-256 recorded and checked):

    config.json        format_version, arch "var-siamese", version, hyperparameters, files {name: sha256}, training
    weights.pt         encoder + MLP state_dict without the word vectors (loaded with weights_only=True)
    vocab.json         the vocabulary (tokens, counts, document frequencies)
    word_vectors.npy   the word vectors in vocabulary order
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from tqdm import tqdm

from ..data.records import Query, Ticket, query_text
from ..errors import InputError, ModelError
from ..files import atomic_directory
from ..lexical.analyzer import tokenize
from .saved_config import SavedConfig
from .vocab import EOS_ID, PAD_ID, UNK_ID, Vocabulary

ARCH = "var-siamese"
FORMAT_VERSION = 1
CONFIG_FILE, WEIGHTS_FILE, VOCAB_FILE, VECTORS_FILE = "config.json", "weights.pt", "vocab.json", "word_vectors.npy"
#: Text fields an encoder may read, in the order they are joined.
TEXT_FIELDS = ("subject", "description", "solution")
#: Tokens of one text word2vec reads (the encoder reads `max_words`).
_W2V_MAX_TOKENS = 2000
#: Share of the labelled queries held out to pick the epoch when no dev set is given.
HELD_OUT_SHARE = 0.2
_RETRAIN = "retrain it with: ticketrec train --arch var-siamese --out DIR"


@dataclass
class VarSiameseConfig(SavedConfig):
    """Hyperparameters of the variational Siamese network (stored in the model's config.json)."""

    fields: list[str] = field(default_factory=lambda: ["subject", "description"])  # what a text is, query and ticket
    max_words: int = 60  # first tokens of a text the encoder and decoder read
    word_dim: int = 100  # word2vec dimension (a word-vector file or base model sets its own)
    w2v_epochs: int = 5
    min_count: int = 2
    max_vocab: int = 30000
    hidden: int = 64  # bi-LSTM units each way
    latent: int = 32  # dimensions of μ and of σ
    mlp_hidden: int = 64
    dropout: float = 0.1  # on the encoder's word inputs, training only
    head: str = "mlp"  # "mlp": pair training; "w2": intents only, g = exp(−mean W₂ feature)
    # VAE pretraining
    pretrain_epochs: int = 4
    decoder_hidden: int = 128
    decoder_vocab: int = 5000
    word_dropout: float = 0.25
    kl_warmup: float = 0.5  # share of pretraining steps over which β rises linearly from 0 to 1
    mu_scale: float = 1.0  # μ batch-normalised to this spread per dimension (BN-VAE, against posterior collapse)
    bow_weight: float = 1.0  # weight of the bag-of-words loss: z alone predicts the target's words (against collapse)
    reformulate: bool = True
    max_pretrain_items: int = 20000
    pretrain_lr: float = 2e-3
    # pair training
    pairs: str = "auto"  # "labelled", "mined" or "auto" (labelled when given, else mined)
    epochs: int = 6
    batch_size: int = 32
    lr: float = 1e-3

    def __post_init__(self):
        self.fields = list(self.fields)
        bad = [f for f in self.fields if f not in TEXT_FIELDS]
        if not self.fields or bad:
            raise InputError(f"var-siamese fields must be some of {', '.join(TEXT_FIELDS)}, not {self.fields!r}")
        if self.head not in ("mlp", "w2"):
            raise InputError(f"var-siamese head must be 'mlp' or 'w2', not {self.head!r}")
        if self.pairs not in ("auto", "labelled", "mined"):
            raise InputError(f"var-siamese pairs must be 'auto', 'labelled' or 'mined', not {self.pairs!r}")
        if min(self.max_words, self.word_dim, self.hidden, self.latent, self.mlp_hidden, self.decoder_hidden,
               self.batch_size, self.max_pretrain_items) < 1 or self.decoder_vocab < 4:
            raise InputError("var-siamese sizes must be positive (decoder_vocab at least 4)")
        if self.pretrain_epochs < 0 or self.epochs < 0 or not 0.0 <= self.word_dropout < 1.0 \
                or not 0.0 <= self.dropout < 1.0 or not 0.0 <= self.kl_warmup <= 1.0:
            raise InputError("var-siamese epochs must be ≥ 0, dropouts within [0, 1), kl_warmup within [0, 1]")

    @classmethod
    def from_dict(cls, data: dict | None) -> "VarSiameseConfig":
        """Build from JSON; an unknown key raises InputError naming it."""
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"unknown var-siamese option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**data)

    def to_dict(self) -> dict:
        return asdict(self)

    def replace(self, **changes) -> "VarSiameseConfig":
        return VarSiameseConfig.from_dict({**self.to_dict(), **changes})


# -- the formulas --------------------------------------------------------------------------------------------------
def wasserstein2(mu1, sigma1, mu2, sigma2):
    """Element-wise squared Wasserstein-2 distance of diagonal Gaussians: (μ1 − μ2)² + (σ1 − σ2)² (numpy or torch;
    broadcasts). Its sum over the dimensions is W₂²(N(μ1, σ1²), N(μ2, σ2²))."""
    return (mu1 - mu2) ** 2 + (sigma1 - sigma2) ** 2


def gaussian_kl(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """KL(N(μ, σ²) ‖ N(0, I)) per row: ½ Σ (σ² + μ² − 1 − log σ²)."""
    return 0.5 * (logvar.exp() + mu ** 2 - 1.0 - logvar).sum(-1)


def kl_weight(step: int, total_steps: int, warmup: float) -> float:
    """β of KL annealing: linear from 0 at step 0 to 1 after `warmup` · `total_steps` steps, then 1."""
    span = warmup * total_steps
    return 1.0 if span <= 0 else min(1.0, step / span)


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """Word vectors scaled to length √dim, one unit per component on average (zero rows stay zero): word2vec on a
    small knowledge base leaves vectors near their tiny initial scale, which an LSTM reads as one constant input."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    scale = np.sqrt(vectors.shape[1]) / np.maximum(norms, 1e-12)
    return np.where(norms > 0, vectors * scale, 0.0).astype(np.float32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -x))


# -- the network ---------------------------------------------------------------------------------------------------
class VarSiameseNet(nn.Module):
    """Encoder (bi-LSTM → μ, log σ²) and the similarity MLP; the word vectors are a frozen embedding."""

    def __init__(self, config: VarSiameseConfig, vectors: np.ndarray):
        super().__init__()
        self.config = config
        self.words = nn.Embedding.from_pretrained(torch.from_numpy(np.asarray(vectors, dtype=np.float32)),
                                                  freeze=True, padding_idx=PAD_ID)
        dim = self.words.embedding_dim
        self.dropout = nn.Dropout(config.dropout)
        self.lstm = nn.LSTM(dim, config.hidden, batch_first=True, bidirectional=True)
        self.mu = nn.Linear(2 * config.hidden, config.latent)
        self.mu_norm = nn.BatchNorm1d(config.latent, affine=False)
        self.logvar = nn.Linear(2 * config.hidden, config.latent)
        self.mlp = nn.Sequential(nn.Linear(2 * config.latent, config.mlp_hidden), nn.ReLU(),
                                 nn.Linear(config.mlp_hidden, 1))

    def encode(self, ids: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, L] word ids and their lengths (≥ 1) → μ [B, latent], log σ² [B, latent] (clamped to ±10), from the
        mean over time of the bi-LSTM's outputs (a whole text's words, where the last states favour its ends)."""
        x = self.dropout(self.words(ids))
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=ids.shape[1])
        h = out.sum(dim=1) / lengths.to(out.dtype).unsqueeze(1)
        mu = self.mu(h)
        if self.training and len(mu) < 2:  # batch statistics need two rows: use the running ones
            mu = F.batch_norm(mu, self.mu_norm.running_mean, self.mu_norm.running_var, training=False)
        else:
            mu = self.mu_norm(mu)
        return self.config.mu_scale * mu, self.logvar(h).clamp(-10.0, 10.0)

    def logits(self, mu1, logvar1, mu2, logvar2) -> torch.Tensor:
        """The MLP's logit of P(similar) for aligned rows."""
        s1, s2 = (0.5 * logvar1).exp(), (0.5 * logvar2).exp()
        return self.mlp(torch.cat([wasserstein2(mu1, s1, mu2, s2), mu1 * mu2], dim=-1)).squeeze(-1)


class _Decoder(nn.Module):
    """Pretraining only: a GRU that generates a text from z (initial state and every step's input)."""

    def __init__(self, words: nn.Embedding, latent: int, hidden: int, n_out: int):
        super().__init__()
        self._words = [words]  # shared, frozen; not a submodule (the encoder owns it)
        self.init = nn.Linear(latent, hidden)
        self.gru = nn.GRU(words.embedding_dim + latent, hidden, batch_first=True)
        self.out = nn.Linear(hidden, n_out)
        self.bow = nn.Linear(latent, n_out)  # the bag-of-words head: the target's words from z alone

    def forward(self, z: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        x = self._words[0](inputs)
        x = torch.cat([x, z.unsqueeze(1).expand(-1, x.shape[1], -1)], dim=2)
        out, _ = self.gru(x, torch.tanh(self.init(z)).unsqueeze(0))
        return self.out(out)


def _pad(seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, L] and lengths [B]; an empty text is one padding token (a zero vector)."""
    lengths = [max(1, len(s)) for s in seqs]
    ids = torch.full((len(seqs), max(lengths, default=1)), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
    return ids, torch.as_tensor(lengths, dtype=torch.long)


def _grouped_map(scores: np.ndarray, groups: np.ndarray, relevant: np.ndarray) -> float:
    """Mean average precision over the groups (queries) that have a relevant pair."""
    values = []
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        rel = relevant[idx][np.argsort(-scores[idx], kind="stable")]
        if rel.any():
            hits = np.cumsum(rel)
            values.append(float((hits[rel] / (np.flatnonzero(rel) + 1)).mean()))
    return float(np.mean(values)) if values else float("nan")


@dataclass
class _Pairs:
    """Pairs over distinct texts: pair k is (left[a[k]], right[b[k]]) with target y[k] ∈ [0, 1]."""

    left: list[list[int]]
    right: list[list[int]]
    a: np.ndarray
    b: np.ndarray
    y: np.ndarray
    source: str = ""

    def __len__(self) -> int:
        return len(self.y)


class _Stages:
    """Times each stage and tells the user, one line per stage."""

    def __init__(self, echo: Callable[[str], None] | None):
        self.echo, self.seconds = echo or (lambda line: None), {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[dict]:
        started, note = time.time(), {}
        yield note
        self.seconds[name] = round(time.time() - started, 1)
        self.echo(f"[{self.seconds[name]:7.1f} s] {name}" + (f": {note['line']}" if note.get("line") else ""))


# -- the model -----------------------------------------------------------------------------------------------------
class VarSiamese:
    """The variational Siamese encoder: `fit`, `encode`, `similarity`, `save` / `load`.

    `channel_vectors(texts)`: as a channel of the multi-channel Manhattan metric, use the [μ ; σ] rows that `encode`
    returns as they are: the L1 distance between two of them, Σ|μ_q − μ_t| + Σ|σ_q − σ_t|, is the Manhattan
    analogue of the element-wise Wasserstein-2 distance Σ(μ_q − μ_t)² + (σ_q − σ_t)².
    """

    def __init__(self, config: VarSiameseConfig | None = None, *, vocab: Vocabulary | None = None,
                 net: VarSiameseNet | None = None, meta: dict | None = None):
        self.config = config or VarSiameseConfig()
        self.vocab, self.net = vocab, net
        self.meta = dict(meta or {})
        self._head: tuple[np.ndarray, ...] | None = None
        self._version: str | None = None
        if self.net is not None:
            self.net.eval()

    # -- texts ---------------------------------------------------------------------------------------------------
    def text_of(self, item: Query | Ticket) -> str:
        """The text the encoder reads of a query or ticket: its configured fields joined (a query has no solution)."""
        return "\n".join(v for f in self.config.fields if (v := getattr(item, f, "") or ""))

    def _ids(self, text: str) -> list[int]:
        return self.vocab.ids(tokenize(text)[: self.config.max_words])

    # -- inference -----------------------------------------------------------------------------------------------
    def _require(self) -> None:
        if self.net is None or self.vocab is None:
            raise ModelError(f"this var-siamese model is not trained; call fit() or load a saved one ({_RETRAIN})")

    @property
    def dim(self) -> int:
        """Width of an encoded row: 2 · latent ([μ ; σ])."""
        return 2 * self.config.latent

    def encode(self, texts: Sequence[str], batch_size: int = 256, progress: bool = False) -> np.ndarray:
        """[μ ; σ] of each text, float32 [n, 2 · latent]: what an index stores per ticket, computed once."""
        self._require()
        self.net.eval()
        seqs = [self._ids(t) for t in texts]
        out = np.zeros((len(seqs), self.dim), dtype=np.float32)
        order = np.argsort([len(s) for s in seqs], kind="stable")  # batches of similar length: little padding
        with torch.no_grad():
            for start in tqdm(range(0, len(seqs), batch_size), desc="encoding", disable=not progress, leave=False):
                rows = order[start : start + batch_size]
                mu, logvar = self.net.encode(*_pad([seqs[i] for i in rows]))
                out[rows] = torch.cat([mu, (0.5 * logvar).exp()], dim=1).numpy()
        return out

    channel_vectors = encode

    def encode_tickets(self, tickets: Sequence[Ticket], progress: bool = False) -> np.ndarray:
        """`encode` of each ticket's text (`text_of`)."""
        return self.encode([self.text_of(t) for t in tickets], progress=progress)

    def encode_queries(self, queries: Sequence[Query], progress: bool = False) -> np.ndarray:
        """`encode` of each query's text (`text_of`)."""
        return self.encode([self.text_of(q) for q in queries], progress=progress)

    def _numpy_head(self) -> tuple[np.ndarray, ...]:
        if self._head is None:
            first, last = self.net.mlp[0], self.net.mlp[2]
            self._head = tuple(p.detach().cpu().numpy().astype(np.float32)
                               for p in (first.weight.T, first.bias, last.weight[0], last.bias))
        return self._head

    def similarity(self, query_vecs: np.ndarray, ticket_vecs: np.ndarray) -> np.ndarray:
        """P(similar) in (0, 1), float64: aligned rows ([n, 2d] and [n, 2d]) or one query against many ([2d] or
        [1, 2d] against [n, 2d]); vectorised numpy, no torch."""
        self._require()
        q = np.asarray(query_vecs, dtype=np.float32)
        t = np.asarray(ticket_vecs, dtype=np.float32)
        q = q[None] if q.ndim == 1 else q
        t = t[None] if t.ndim == 1 else t
        d = self.config.latent
        if q.shape[1] != 2 * d or t.shape[1] != 2 * d or (len(q) != len(t) and len(q) != 1):
            raise ValueError(f"similarity needs [μ ; σ] rows of width {2 * d} (one query, or as many as tickets); "
                             f"got {q.shape} and {t.shape}")
        w2 = wasserstein2(q[:, :d], q[:, d:], t[:, :d], t[:, d:])
        if self.config.head == "w2":
            return np.exp(-w2.mean(axis=1, dtype=np.float64))
        w1, b1, w_out, b_out = self._numpy_head()
        hidden = np.maximum(w2 @ w1[:d] + (q[:, :d] * t[:, :d]) @ w1[d:] + b1, 0.0)
        return _sigmoid((hidden @ w_out + b_out).astype(np.float64))

    def score(self, query: Query, tickets: Sequence[Ticket]) -> np.ndarray:
        """P(similar) of one query against tickets (encodes both; for a few pairs, tests and examples)."""
        return self.similarity(self.encode_queries([query])[0], self.encode_tickets(tickets))

    # -- training ------------------------------------------------------------------------------------------------
    def fit(self, tickets: Sequence[Ticket], labelled=None, *, dev=None, seed: int = 0,
            word_vectors: str | Path | None = None, base=None, mining=None, progress: bool = False,
            echo: Callable[[str], None] | None = None) -> "VarSiamese":
        """Train on the knowledge base `tickets` and return self (deterministic for a seed on one thread).

        `labelled` (a `Dataset` with labelled pairs) gives the pairs; without it (or with config `pairs="mined"`)
        pairs are mined from the tickets (`mining.mine_pairs`, `mining`: its `MiningConfig`). `dev` (a `Dataset`)
        picks the best pair-training epoch, else the mined held-out slice or `HELD_OUT_SHARE` of the labelled
        queries (not trained on) does. Word vectors: `base` (a TicketModel: its vocabulary and vectors), else
        `word_vectors` (a word2vec file), else word2vec on the tickets' text. `echo` gets one line per stage,
        `progress` shows bars.
        """
        torch.set_num_threads(1)
        cfg = self.config
        stage = _Stages(echo)
        tickets = list(tickets)
        if not tickets:
            raise InputError("var-siamese training needs tickets: import the knowledge base first "
                             "(ticketrec import FILE)")
        has_pairs = bool(labelled is not None and labelled.pairs)
        kinds = "mined" if cfg.pairs == "mined" or (cfg.pairs == "auto" and not has_pairs) else "labelled"
        if kinds == "labelled" and not has_pairs:
            raise InputError("var-siamese pairs='labelled' needs labelled pairs: give them with --train FILE")
        kb = tickets + ([t for t in labelled.tickets] if labelled is not None else [])
        kb = list({t.id: t for t in kb}.values())
        query_texts = [self.text_of(q) for q in (labelled.queries if labelled is not None else [])]
        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        with stage("word vectors") as note:
            self.vocab, vectors, source = self._word_vectors(kb, query_texts, seed, word_vectors, base, progress)
            vectors = unit_rows(vectors)
            note["line"] = f"{len(self.vocab):,} words, {vectors.shape[1]}-d ({source})"
        if vectors.shape[1] != cfg.word_dim:
            self.config = cfg = cfg.replace(word_dim=int(vectors.shape[1]))
        self.net = VarSiameseNet(cfg, vectors)
        self._head, self._version = None, None
        with stage("pairs") as note:
            train, held = self._pairs(kinds, kb, labelled, dev, seed, mining)
            note["line"] = (f"{len(train):,} {train.source} pairs for "
                            + ("VAE reformulation only (head w2: no pair training)" if cfg.head == "w2" else
                               "training, " + (f"{len(held):,} {held.source} pairs pick the epoch" if held is not None
                                               else "the last epoch kept")))
        ticket_texts = [self._ids(self.text_of(t)) for t in kb]
        with stage("VAE pretraining") as note:
            items = [(s, s) for s in ticket_texts + [self._ids(x) for x in query_texts] if s]
            if cfg.reformulate and train is not None:
                positive = np.flatnonzero(train.y >= 0.5)
                items += [(train.left[train.a[k]], train.right[train.b[k]]) for k in positive]
                items += [(train.right[train.b[k]], train.left[train.a[k]]) for k in positive]
                items = [(s, t) for s, t in items if s and t]
            if len(items) > cfg.max_pretrain_items:
                items = [items[i] for i in sorted(rng.choice(len(items), cfg.max_pretrain_items, replace=False))]
            history = self._pretrain(items, rng, progress)
            last = history[-1] if history else {}
            note["line"] = (f"{len(items):,} texts ({sum(1 for s, t in items if s is not t):,} reformulations), "
                            f"{cfg.pretrain_epochs} epochs, last epoch reconstruction {last.get('reconstruction', 0):.2f} "
                            f"nats/text, KL {last.get('kl', 0):.2f}, β {last.get('beta', 0):.2f}")
        pair_history: list[dict] = []
        best: dict = {}
        if cfg.head == "mlp":
            with stage("pair training") as note:
                pair_history, best = self._train_pairs(train, held, rng, progress)
                nan = float("nan")
                note["line"] = (f"{cfg.epochs} epochs, kept epoch {best['epoch']} (dev MAP "
                                f"{best.get('dev_map', nan):.3f}, train BCE {best.get('train_bce', nan):.3f})")
        self.net.eval()
        self._head, self._version = None, None
        self.meta.update({"seed": seed, "pairs": kinds, "data_fingerprint": _fingerprint_texts(kb, labelled),
                          "training": {"pretraining": history, "pair_training": pair_history,
                                       "best_epoch": best.get("epoch"),
                                       "pairs": {"train": len(train) if train is not None else 0,
                                                 "held_out": len(held) if held is not None else 0,
                                                 "source": train.source if train is not None else "none"},
                                       "knowledge_base": len(kb), "word_vectors": source,
                                       "stage_seconds": stage.seconds}})
        return self

    def _word_vectors(self, kb, query_texts, seed, word_vectors, base, progress):
        from .embeddings import align_vectors, load_word2vec, train_word2vec

        cfg = self.config
        if base is not None:
            return base.vocab, base.net.embedder.words.weight.detach().cpu().numpy().astype(np.float32), "base model"
        docs = [tokenize("\n".join(getattr(t, f, "") or "" for f in TEXT_FIELDS))[:_W2V_MAX_TOKENS] for t in kb]
        docs += [tokenize(x)[:_W2V_MAX_TOKENS] for x in query_texts]
        vocab = Vocabulary.build(docs, min_count=cfg.min_count, max_size=cfg.max_vocab)
        if word_vectors is not None:
            keyed = load_word2vec(word_vectors)
            return vocab, align_vectors(keyed, vocab), f"file {Path(word_vectors).name}"
        keyed = train_word2vec(docs, dim=cfg.word_dim, seed=seed, epochs=cfg.w2v_epochs, min_count=cfg.min_count,
                               progress=progress)
        return vocab, align_vectors(keyed, vocab, cfg.word_dim), "word2vec on the knowledge base"

    def _pairs(self, kinds: str, kb, labelled, dev, seed: int, mining) -> tuple[_Pairs | None, _Pairs | None]:
        """(training pairs, held-out pairs) of the chosen kind, as ids."""
        if kinds == "labelled":
            if self.config.head == "w2":  # the pairs only feed the VAE's reformulations: all of them
                return self._labelled_pairs(labelled, "labelled"), None
            if dev is not None and dev.pairs:
                return self._labelled_pairs(labelled, "labelled"), self._labelled_pairs(dev, "dev")
            from .pairs import split_queries

            if len({p.query_id for p in labelled.pairs}) < 5:  # too few queries to hold some out: the last epoch
                return self._labelled_pairs(labelled, "labelled"), None
            train, held = split_queries(labelled, HELD_OUT_SHARE, seed)
            return self._labelled_pairs(train, "labelled"), self._labelled_pairs(held, "held-out labelled")
        from .mining import MiningConfig, mine_pairs

        mining = mining if mining is not None else MiningConfig(augmented=0, adapt_pretrained=False)
        mined = mine_pairs(kb, mining, seed=seed)
        views = [self._ids(self.text_of(v)) for v in mined.views]

        def side(queries, q, t, y, name):
            return _Pairs([self._ids(self.text_of(x)) for x in queries], views, np.asarray(q), np.asarray(t),
                          (np.asarray(y, dtype=np.float64) - 1.0) / 4.0, name)

        train = side(mined.train_queries, mined.train_q, mined.train_t, mined.train_y, "mined")
        held = side(mined.held_out_queries, mined.held_out_q, mined.held_out_t, mined.held_out_y, "mined held-out")
        if dev is not None and dev.pairs:
            held = self._labelled_pairs(dev, "dev")
        return train, held

    def _labelled_pairs(self, data, name: str) -> _Pairs:
        from .pairs import PairSet

        pairs = PairSet.from_dataset(data, name)
        return _Pairs([self._ids(self.text_of(q)) for q in pairs.queries],
                      [self._ids(self.text_of(t)) for t in pairs.tickets],
                      pairs.q, pairs.t, np.clip((pairs.y - 1.0) / 4.0, 0.0, 1.0), name)

    def _pretrain(self, items: list[tuple[list[int], list[int]]], rng, progress: bool) -> list[dict]:
        """VAE pretraining (see the module doc); one history row per epoch."""
        cfg = self.config
        if cfg.pretrain_epochs == 0 or not items:
            return []
        n_out = min(cfg.decoder_vocab, len(self.vocab))
        decoder = _Decoder(self.net.words, cfg.latent, cfg.decoder_hidden, n_out)
        params = [p for p in self.net.parameters() if p.requires_grad and not _is_head(self.net, p)]
        optimizer = torch.optim.Adam(params + list(decoder.parameters()), lr=cfg.pretrain_lr)
        n_batches = math.ceil(len(items) / cfg.batch_size)
        total, step, history = cfg.pretrain_epochs * n_batches, 0, []
        self.net.train()
        for epoch in range(1, cfg.pretrain_epochs + 1):
            sums = {"reconstruction": 0.0, "kl": 0.0, "texts": 0}
            for batch in tqdm(_batches(items, cfg.batch_size, rng, key=lambda it: len(it[0])),
                              total=n_batches, desc=f"VAE epoch {epoch}/{cfg.pretrain_epochs}", disable=not progress,
                              leave=False):
                src = [items[i][0] for i in batch]
                tgt = [[w if w < n_out else UNK_ID for w in items[i][1][: cfg.max_words]] for i in batch]
                mu, logvar = self.net.encode(*_pad(src))
                z = mu + (0.5 * logvar).exp() * torch.randn_like(mu)
                inputs, _ = _pad([[EOS_ID] + t for t in tgt])
                if cfg.word_dropout > 0:
                    drop = (torch.rand(inputs.shape) < cfg.word_dropout) & (inputs != PAD_ID)
                    drop[:, 0] = False
                    inputs = inputs.masked_fill(drop, UNK_ID)
                targets = torch.full(inputs.shape, -100, dtype=torch.long)
                for i, t in enumerate(tgt):
                    targets[i, : len(t) + 1] = torch.as_tensor(t + [EOS_ID], dtype=torch.long)
                logits = decoder(z, inputs)
                rec = F.cross_entropy(logits.reshape(-1, n_out), targets.reshape(-1), ignore_index=-100,
                                      reduction="sum") / len(batch)
                kl = gaussian_kl(mu, logvar).mean()
                beta = kl_weight(step, total, cfg.kl_warmup)
                loss = rec + beta * kl
                if cfg.bow_weight > 0:
                    bow = torch.log_softmax(decoder.bow(z), dim=1).gather(1, targets.clamp(min=0))  # [B, T]
                    loss = loss - cfg.bow_weight * (bow * (targets >= 0)).sum() / len(batch)
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params + list(decoder.parameters()), 5.0)
                optimizer.step()
                step += 1
                sums["reconstruction"] += float(rec.detach()) * len(batch)
                sums["kl"] += float(kl.detach()) * len(batch)
                sums["texts"] += len(batch)
            history.append({"epoch": epoch, "reconstruction": round(sums["reconstruction"] / sums["texts"], 4),
                            "kl": round(sums["kl"] / sums["texts"], 4), "beta": round(beta, 4)})
        self.net.eval()
        return history

    def _pair_logits(self, pairs: _Pairs, idx: np.ndarray) -> torch.Tensor:
        mu1, lv1 = self.net.encode(*_pad([pairs.left[pairs.a[k]] for k in idx]))
        mu2, lv2 = self.net.encode(*_pad([pairs.right[pairs.b[k]] for k in idx]))
        return self.net.logits(mu1, lv1, mu2, lv2)

    def _pair_scores(self, pairs: _Pairs) -> np.ndarray:
        self.net.eval()
        with torch.no_grad():
            out = [self._pair_logits(pairs, np.arange(s, min(len(pairs), s + 256))).numpy()
                   for s in range(0, len(pairs), 256)]
        return np.concatenate(out) if out else np.zeros(0)

    def _train_pairs(self, train: _Pairs, held: _Pairs | None, rng, progress: bool) -> tuple[list[dict], dict]:
        """BCE pair training of encoder and MLP; keeps the epoch with the best held-out MAP (the last without one)."""
        cfg = self.config
        params = [p for p in self.net.parameters() if p.requires_grad]
        optimizer = torch.optim.Adam(params, lr=cfg.lr)
        target = torch.as_tensor(train.y, dtype=torch.float32)
        history: list[dict] = []
        best, best_state = {"epoch": 0}, None
        for epoch in range(1, cfg.epochs + 1):
            self.net.train()
            total, seen = 0.0, 0
            order = rng.permutation(len(train))
            for start in tqdm(range(0, len(order), cfg.batch_size), desc=f"pairs epoch {epoch}/{cfg.epochs}",
                              disable=not progress, leave=False):
                idx = order[start : start + cfg.batch_size]
                loss = F.binary_cross_entropy_with_logits(self._pair_logits(train, idx), target[idx])
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, 5.0)
                optimizer.step()
                total += float(loss.detach()) * len(idx)
                seen += len(idx)
            row = {"epoch": epoch, "train_bce": round(total / max(1, seen), 5)}
            if held is not None and len(held):
                row["dev_map"] = round(_grouped_map(self._pair_scores(held), held.a, held.y >= 0.5), 5)
            history.append(row)
            if best_state is None or "dev_map" not in row or row["dev_map"] > best.get("dev_map", -math.inf):
                best, best_state = dict(row), copy.deepcopy(self.net.state_dict())
        if best_state is not None:
            self.net.load_state_dict(best_state)
        self.net.eval()
        return history, best

    # -- persistence ---------------------------------------------------------------------------------------------
    def _state(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.net.state_dict().items() if k != "words.weight"}

    @property
    def version(self) -> str:
        """Fingerprint of the hyperparameters, vocabulary and every learned number."""
        if self._version is None:
            self._require()
            head = {"arch": ARCH, "hyperparameters": self.config.fingerprint_dict()}
            h = hashlib.sha256(json.dumps(head, sort_keys=True).encode())
            h.update(json.dumps(self.vocab.tokens).encode())
            for name, tensor in sorted(self.net.state_dict().items()):
                h.update(name.encode())
                h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
            self._version = h.hexdigest()[:16]
        return self._version

    def save(self, path: str | Path) -> None:
        """Write the model directory atomically (temporary sibling, then one rename), every file's SHA-256 in
        config.json."""
        self._require()
        with atomic_directory(path, marker=CONFIG_FILE) as tmp:
            torch.save(self._state(), tmp / WEIGHTS_FILE)
            self.vocab.save(tmp / VOCAB_FILE)
            np.save(tmp / VECTORS_FILE, self.net.words.weight.detach().cpu().numpy().astype(np.float32),
                    allow_pickle=False)
            files = {name: _sha256(tmp / name) for name in (WEIGHTS_FILE, VOCAB_FILE, VECTORS_FILE)}
            config = {"format_version": FORMAT_VERSION, "arch": ARCH, "version": self.version,
                      "hyperparameters": self.config.to_dict(), "files": files, **self.meta}
            (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "VarSiamese":
        """Read a model directory; a missing, corrupt or foreign file raises ModelError saying which and what to do."""
        path = Path(path)
        cfg_file = path / CONFIG_FILE
        if not path.is_dir():
            raise ModelError(f"no var-siamese model at {path}; {_RETRAIN}")
        try:
            config = json.loads(cfg_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelError(f"cannot read {cfg_file} ({exc}); {_RETRAIN}") from exc
        if not isinstance(config, dict) or config.get("arch") != ARCH:
            got = config.get("arch") if isinstance(config, dict) else None
            raise ModelError(f"{path} holds a {got or 'non-var-siamese'} model, not a var-siamese one; {_RETRAIN}")
        if config.get("format_version") != FORMAT_VERSION:
            raise ModelError(f"{cfg_file} has format version {config.get('format_version')!r}, this ticketrec reads "
                             f"{FORMAT_VERSION}; {_RETRAIN}")
        try:
            hyper = VarSiameseConfig.from_saved(config["hyperparameters"])
            files = dict(config["files"])
        except (KeyError, TypeError, InputError) as exc:
            raise ModelError(f"{cfg_file} is incomplete or corrupt ({exc}); {_RETRAIN}") from exc
        for name in (WEIGHTS_FILE, VOCAB_FILE, VECTORS_FILE):
            file = path / name
            if not file.is_file():
                raise ModelError(f"{file} is missing; the model directory is incomplete, {_RETRAIN}")
            if name not in files or _sha256(file) != files[name]:
                raise ModelError(f"{file} does not match the SHA-256 recorded in {cfg_file}; the file is corrupt, "
                                 f"{_RETRAIN}")
        vocab = Vocabulary.load(path / VOCAB_FILE)
        try:
            vectors = np.load(path / VECTORS_FILE, allow_pickle=False)
            if vectors.ndim != 2 or len(vectors) != len(vocab):
                raise ValueError(f"shape {vectors.shape} for {len(vocab)} words")
            net = VarSiameseNet(hyper, vectors)
            state = torch.load(path / WEIGHTS_FILE, map_location="cpu", weights_only=True)
            state["words.weight"] = torch.from_numpy(vectors)
            net.load_state_dict(state, strict=True)
        except Exception as exc:  # numpy and torch raise many types on damaged or foreign files
            raise ModelError(f"cannot read the var-siamese network in {path} ({exc}); {_RETRAIN}") from exc
        meta = {k: v for k, v in config.items()
                if k not in ("format_version", "arch", "version", "hyperparameters", "files")}
        model = cls(hyper, vocab=vocab, net=net, meta=meta)
        if config.get("version") and model.version != config["version"]:
            raise ModelError(f"the files of {path} do not match the version in {cfg_file}; {_RETRAIN}")
        return model


def _is_head(net: VarSiameseNet, param: torch.Tensor) -> bool:
    return any(param is p for p in net.mlp.parameters())


def _batches(items: Sequence, size: int, rng, key: Callable) -> list[np.ndarray]:
    """Shuffled batches of similar length: pools of 20 batches sorted by `key`, then the batch order shuffled."""
    order = rng.permutation(len(items))
    pool = size * 20
    out = []
    for p in range(0, len(order), pool):
        chunk = sorted(order[p : p + pool].tolist(), key=lambda i: key(items[i]))
        out += [np.asarray(chunk[s : s + size]) for s in range(0, len(chunk), size)]
    return [out[i] for i in rng.permutation(len(out))]


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _fingerprint_texts(kb: Sequence[Ticket], labelled) -> str:
    h = hashlib.sha256()
    for row in sorted(json.dumps([t.id, t.subject, t.description, t.solution]) for t in kb):
        h.update(row.encode())
    if labelled is not None:
        for row in sorted(json.dumps([p.query_id, p.ticket_id, p.score]) for p in labelled.pairs):
            h.update(row.encode())
    return h.hexdigest()[:16]


# -- evaluation faces ------------------------------------------------------------------------------------------------
def grid_model(train, dev, overrides: dict, seed: int, out: str | Path, progress: bool = False) -> VarSiamese:
    """The model of a `ticketrec evaluate --grid siamese` row: trained on the `train` Dataset (its tickets as the
    knowledge base, its labelled pairs or mined ones per `overrides["pairs"]`), the best epoch picked on `dev`'s
    pairs for labelled rows; saved to `out`, and reused from there when an interrupted run already trained it."""
    config = VarSiameseConfig.from_dict(overrides)
    labelled = train if config.pairs != "mined" else None
    dev = dev if config.pairs != "mined" else None
    out = Path(out)
    if (out / CONFIG_FILE).exists():
        try:
            done = VarSiamese.load(out)
            if (done.config.to_dict() == config.replace(word_dim=done.config.word_dim).to_dict()
                    and done.meta.get("seed") == seed
                    and done.meta.get("data_fingerprint") == _fingerprint_texts(
                        list({t.id: t for t in train.tickets}.values()), labelled)):
                return done
        except ModelError:
            pass
    model = VarSiamese(config).fit(train.tickets, labelled, dev=dev, seed=seed, progress=progress)
    model.save(out)
    return model


def ranker(model: VarSiamese, tickets: Sequence[Ticket], prefilter=None, candidates: int = 0):
    """A `duplicates.Ranker` for the network: the tickets encoded once; per query one encoding, then the MLP over
    the candidates, best first. Candidates: every ticket (`candidates` = 0 or no `prefilter`), or the top
    `candidates` of `prefilter(text, k) -> (rows, scores)` over the same tickets in the same order (e.g.
    `Bm25Scorer(tickets).top_k`, `TopicPrefilter.search`)."""
    ids = [t.id for t in tickets]
    matrix = model.encode_tickets(tickets)

    def rank(query: Ticket, n: int) -> list[str]:
        q = model.encode_queries([Query(query.subject, query.description, query.id)])[0]
        if prefilter is not None and candidates > 0:
            rows, _ = prefilter(query_text(query), candidates + 1)
            rows = np.asarray(rows, dtype=np.int64)
        else:
            rows = np.arange(len(ids))
        if rows.size == 0:
            return []
        g = model.similarity(q, matrix[rows])
        order = np.lexsort((rows, -g))[:n]
        return [ids[int(rows[i])] for i in order]

    return rank
