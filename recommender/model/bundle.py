"""TicketModel: the trained bundle as the rest of the system sees it, and its artifact directory.

    models/NAME/
      config.json       format_version, version, hyperparameters, metric weights, package versions, data fingerprint
      weights.pt        torch state_dict of the network without the word2vec table (loaded with weights_only=True)
      vocab.json        tokens, counts, document frequencies
      word2vec.npy      the word vectors in vocabulary order (allow_pickle=False)
      punkt.json        Punkt parameters
      calibrator.json   isotonic thresholds (X, y)
      topic_vocab.json  the DocNADE vocabulary (only with the T channel)
      docnade/          DocNADE's own config.json + weights (only with the T channel)
      sentence_encoder/ the S channel's own encoder (a `--encoder DIR` copy, or the one label-free training adapted;
                        absent for the packaged all-MiniLM-L6-v2); config.json's `s_channel` says how S is computed
      channels/C, channels/V  the encoders of the extra channels (`extra_channels.py`), each a char-siamese or
                        var-siamese model directory with its own checksums; config.json's `channel_encoders` names
                        their versions
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from .calibration import Calibrator
from .embeddings import CharVocabulary
from .extra_channels import CHANNEL_ARCH, CHANNELS_DIR, ChannelEncoder, channel_record, load_channel_encoders
from ..errors import ModelError
from ..files import atomic_directory
from ..data.records import Query, Ticket, component_text
from .siamese import MERGED, Featurizer, ReplicatedSiameseLSTM, SiameseConfig
from ..lexical.analyzer import STOP_WORDS, NUMBER_TOKEN
from .sentences import SentenceSplitter
from .template_lines import TemplateLines
from .vocab import RESERVED, Vocabulary

FORMAT_VERSION = 1
EncodedBatch = dict  # dict[str, np.ndarray]: "COMP.channel" → float32 [n, d]
_WORDS_KEY = "embedder.words.weight"  # stored in word2vec.npy, not in weights.pt

#: The config's reports, which the version leaves out: training's and each fine-tuning's (`feedback.fine_tune`).
REPORT_KEYS = ("training", "fine_tuning")
#: What the version left out until 2026-12-03: a model fine-tuned before then keeps the version it was saved with.
LEGACY_REPORT_KEYS = ("training",)

#: Characters of one field (subject, description, solution) the encoders read, its first ones: far more than any
#: channel uses (the LSTM and SumEMB read `max_len` tokens, DocNADE its `max_doc_words`, the S encoder 256 word
#: pieces), so tokenising a huge text stays bounded work and never changes a vector of an ordinary one.
MAX_TEXT_CHARS = 100_000
#: Where a text's topic vector for the topic pre-filter comes from, first found on both sides: the whole text (ALL,
#: in label-free models), else the description, else the subject.
TOPIC_COMPONENTS = ("ALL", "DESC", "SUB")


@dataclass
class Prepared:
    """Texts of one side turned into component tokens and their precomputed T/S vectors (all rows)."""

    tokens: list[dict[str, list[str]]]
    extras: dict[str, np.ndarray]

    def rows(self, idx: Sequence[int]) -> tuple[list[dict[str, list[str]]], dict[str, np.ndarray]]:
        return [self.tokens[i] for i in idx], {k: v[np.asarray(idx, dtype=np.int64)] for k, v in self.extras.items()}


def topic_documents(token_lists: Sequence[Sequence[str]], topic_vocab: Vocabulary,
                    max_words: int | None = None) -> list[list[int]]:
    """Bag-of-words documents for DocNADE: ids in the topic vocabulary (0-based, reserved ids removed); other words
    dropped; each cut to its first `max_words` ids when given."""
    offset = len(RESERVED)
    docs = [[topic_vocab.index[t] - offset for t in tokens if t in topic_vocab.index and topic_vocab.index[t] >= offset]
            for tokens in token_lists]
    return docs if max_words is None else [doc[:max_words] for doc in docs]


def bounded(item: Query | Ticket) -> Query | Ticket:
    """`item` itself, or a copy whose subject, description and solution are cut to MAX_TEXT_CHARS characters."""
    long = {name: value[:MAX_TEXT_CHARS] for name in ("subject", "description", "solution")
            if len(value := getattr(item, name, None) or "") > MAX_TEXT_CHARS}
    return dataclasses.replace(item, **long) if long else item


def build_topic_vocab(token_lists: Sequence[Sequence[str]], size: int) -> Vocabulary:
    """The DocNADE vocabulary: the `size` most frequent content words (no stop words, masks or 1-letter tokens)."""
    content = [[t for t in tokens if t not in STOP_WORDS and t != NUMBER_TOKEN and len(t) > 1 and t not in RESERVED]
               for tokens in token_lists]
    return Vocabulary.build(content, min_count=2, max_size=size + len(RESERVED))


def _load_docnade(path: Path):
    try:
        from topic_models.docnade import DocNADE
    except ImportError as exc:
        raise ModelError(f"this model uses the topic channel T but topic_models.docnade cannot be imported ({exc})") from exc
    try:
        return DocNADE.load(path)
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"cannot read the DocNADE model {path}: {exc}; retrain the model") from exc


def _package_versions() -> dict:
    import gensim
    import sklearn

    return {"torch": torch.__version__, "numpy": np.__version__, "gensim": gensim.__version__,
            "scikit-learn": sklearn.__version__}


class TicketModel:
    """Encodes queries and tickets into channel vectors, scores pairs, calibrates; saves and loads itself."""

    def __init__(self, config: SiameseConfig, vocab: Vocabulary, chars: CharVocabulary, splitter: SentenceSplitter,
                 net: ReplicatedSiameseLSTM, calibrator: Calibrator | None = None, topic_model=None,
                 topic_vocab: Vocabulary | None = None, meta: dict | None = None, *, s_channel: dict | None = None,
                 channel_encoders: dict[str, ChannelEncoder] | None = None):
        """`meta["s_channel"]` records the S channel's encoder (`pretrained.channel_record`); a new model with S
        and no record takes the selected encoder (`pretrained.selected`); `s_channel` is what a loaded model without
        a record used (`pretrained.LEGACY_CHANNEL`), kept out of its config so its version stays.
        `channel_encoders` computes the extra channels C and V (`extra_channels.py`), recorded in meta."""
        self.siamese_config = config
        self.vocab, self.chars, self.splitter = vocab, chars, splitter
        self.net = net
        self.calibrator = calibrator
        self.topic_model = topic_model
        self.topic_vocab = topic_vocab
        self.meta = dict(meta or {})
        #: the knowledge base's template lines, left out of every text the model reads (None: nothing left out)
        self.template_lines = TemplateLines.from_dict(self.meta.get("template_lines"))
        self.featurizer = Featurizer(config, vocab, chars, splitter)
        #: where an adapted S encoder's files are (meta["sentence_encoder"] records their SHA-256), else None
        self.sentence_encoder_dir: Path | None = None
        self._version: str | None = None
        self.net.eval()
        if "T" in config.active_channels and (topic_model is None or topic_vocab is None):
            raise ModelError("a model with the topic channel T needs its DocNADE model and topic vocabulary")
        if "S" in config.active_channels and "s_channel" not in self.meta and s_channel is None:
            self._record_selected_encoder()
        #: how this model's S vectors are computed: encoder, dimension, backend, checksum, word pieces per component
        self.s_channel: dict | None = self.meta.get("s_channel") or s_channel
        #: the encoders of the extra channels C and V (channel → encoder)
        self.channel_encoders: dict[str, ChannelEncoder] = dict(channel_encoders or {})
        missing = [c for c in CHANNEL_ARCH if c in config.active_channels and c not in self.channel_encoders]
        if missing:
            raise ModelError(f"the channel(s) {', '.join(missing)} need their encoder: give the directory of a model "
                             f"trained with --arch {' / --arch '.join(CHANNEL_ARCH[c] for c in missing)} with "
                             "ticketrec train --channel DIR")
        if self.channel_encoders:
            self.meta["channel_encoders"] = channel_record(self.channel_encoders)

    def _record_selected_encoder(self) -> None:
        """Record the encoder new models use (`ticketrec train --encoder DIR`, TICKETREC_ENCODER, else the packaged
        one) in meta; a user's directory is also copied into the model directory when it is saved."""
        from .pretrained import channel_record, file_checksums, get_encoder, selected

        directory, _ = selected()
        encoder = get_encoder()
        self.meta["s_channel"] = channel_record(encoder)
        if directory is not None:
            self.meta["sentence_encoder"] = {"base": encoder.name, "files": file_checksums(directory)}
            self.sentence_encoder_dir = Path(directory)

    # -- the interface of docs/internals.md ------------------------------------------------
    @property
    def config(self) -> dict:
        """The JSON config: format version, hyperparameters, metric weights, package versions, data fingerprint."""
        return {
            "format_version": FORMAT_VERSION,
            "hyperparameters": self.siamese_config.to_dict(),
            "metric": self.metric_spec(),
            "chars": self.chars.chars,
            "packages": self.meta.get("packages", _package_versions()),
            **{k: v for k, v in self.meta.items() if k != "packages"},
        }

    @property
    def version(self) -> str:
        """Fingerprint of the config and every learned number; the index stores it."""
        if self._version is None:
            self._version = self._fingerprint()
        return self._version

    def metric_spec(self) -> dict:
        return self.net.metric_spec()

    def prepare(self, items: Sequence[Query] | Sequence[Ticket], side: str, progress: bool = False,
                used_only: bool = False) -> Prepared:
        """Component tokens and the precomputed T, S, C and V vectors of queries (side="query") or tickets ("ticket").

        With `used_only` only the vectors serving keeps are computed (`served_keys`: those a non-zero weight uses,
        and the topic pre-filter's): what serving needs. Without it every component's are, for anything that may
        change the weights (training, weight selection).
        """
        make = self.featurizer.query_tokens if side == "query" else self.featurizer.ticket_tokens
        items = [self.model_input(x) for x in items]
        desc = "tokenising queries" if side == "query" else "tokenising tickets"
        tokens = [make(x) for x in tqdm(items, desc=desc, disable=not progress, leave=False)]
        extras: dict[str, np.ndarray] = {}
        comps = list(tokens[0].keys()) if tokens else (
            self.siamese_config.query_components if side == "query" else self.siamese_config.ticket_components)
        channels = self.siamese_config.active_channels
        served = self.served_keys(side) if used_only else None

        def wanted(channel: str) -> list[str]:
            return [comp for comp in comps if served is None or f"{comp}.{channel}" in served]

        if "T" in channels:
            for comp in wanted("T"):
                extras[f"{comp}.T"] = self._topic_vectors([t[comp] for t in tokens])
        if "S" in channels:
            extras.update(self._sentence_vectors(items, wanted("S"), side, progress))
        for channel in CHANNEL_ARCH:
            if channel in channels:
                extras.update(self._extra_channel_vectors(channel, items, wanted(channel), side))
        return Prepared(tokens, extras)

    def topic_key(self) -> str | None:
        """The T vector that places a text in topic space (the topic pre-filter's, `serving/searchers.TopicSearcher`):
        "COMP.T" of the first of `TOPIC_COMPONENTS` that both queries and tickets have; None without the T channel."""
        if "T" not in self.net.channel_names or self.topic_model is None:
            return None
        c = self.siamese_config
        both = set(c.query_components) & set(c.ticket_components)
        return next((f"{comp}.T" for comp in TOPIC_COMPONENTS if comp in both), None)

    def _topic_vectors(self, token_lists: Sequence[Sequence[str]]) -> np.ndarray:
        """DocNADE's vectors of token lists, float32 [n, topics]."""
        docs = topic_documents(token_lists, self.topic_vocab, self.topic_model.max_doc_words)
        return (np.asarray(self.topic_model.transform(docs), dtype=np.float32) if docs
                else np.zeros((0, self.siamese_config.topics), dtype=np.float32))

    def query_topic_vector(self, query: Query) -> np.ndarray:
        """The query's `topic_key` vector [topics] (nothing else computed): what the topic pre-filter compares with
        the tickets' vectors in the index."""
        key = self.topic_key()
        if key is None:
            raise ModelError("this model has no topic channel T")
        return self._topic_vectors([self.featurizer.query_tokens(self.model_input(query))[key.split(".")[0]]])[0]

    def model_input(self, item: Query | Ticket) -> Query | Ticket:
        """`item` as every learned channel reads it: bounded (MAX_TEXT_CHARS: bounded work and memory whatever the
        text) and without the knowledge base's template lines (`template_lines`)."""
        item = bounded(item)
        return item if self.template_lines is None else self.template_lines.strip(item)

    def served_keys(self, side: str) -> set[str]:
        """The vectors serving stores (tickets, in the index) and computes (queries): those the metric weighs above
        zero (`ReplicatedSiameseLSTM.weighed_keys`), and on the ticket side the `topic_key`, so that the topic
        pre-filter works whatever weight T got. A vector of weight 0 is neither computed nor stored."""
        keys = self.net.weighed_keys(side)
        topic = self.topic_key() if side == "ticket" else None
        return keys | {topic} if topic else keys

    def _extra_channel_vectors(self, channel: str, items, comps: Sequence[str], side: str) -> dict[str, np.ndarray]:
        """"COMP.C" / "COMP.V" of the components `comps`: the component's text through the channel's encoder (each
        component its own call)."""
        encoder = self.channel_encoders[channel]
        if not items:
            return {f"{comp}.{channel}": np.zeros((0, encoder.dim), dtype=np.float32) for comp in comps}
        return {f"{comp}.{channel}": np.asarray(encoder.channel_vectors(
            [self._component_text(x, comp, side) for x in items]), dtype=np.float32) for comp in comps}

    def _sentence_vectors(self, items, comps: Sequence[str], side: str, progress: bool) -> dict[str, np.ndarray]:
        """"COMP.S" of the components `comps`: their texts encoded in one call, grouped by truncation length
        (`max_tokens`; each distinct text once per length)."""
        record = self.s_channel or {}
        dim, limits = int(record.get("dim", 0)), record.get("max_tokens")
        out = {f"{comp}.S": np.zeros((len(items), dim), dtype=np.float32) for comp in comps}
        if not comps or not items:
            return out
        encoder = self.sentence_encoder()
        if encoder.dim != dim:
            raise ModelError(f"the sentence encoder {encoder.name} gives {encoder.dim}-d vectors, this model's S channel "
                             f"was trained on {dim}-d ones; retrain the model with this encoder")
        groups: dict[int | None, list[str]] = {}
        for comp in comps:
            groups.setdefault(limits.get(comp) if isinstance(limits, dict) else limits, []).append(comp)
        n = len(items)
        texts = [([self._component_text(x, comp, side) for comp in group for x in items], limit)
                 for limit, group in groups.items()]
        encoded = encoder.encode_groups(texts, progress=progress)
        for vectors, group in zip(encoded, groups.values()):
            for j, comp in enumerate(group):
                out[f"{comp}.S"] = vectors[j * n : (j + 1) * n]
        return out

    def sentence_encoder(self, backend: str | None = None):
        """The S channel's encoder on the backend the model records (`s_channel`; `backend` another one): the packaged
        all-MiniLM-L6-v2, or the encoder in the model directory (`sentence_encoder/`: a `--encoder DIR` copy, or the
        one adapted, or whose static vectors were fitted, to the knowledge base), verified against the checksums in
        the config."""
        from .pretrained import LEGACY_CHANNEL, load_encoder

        record = dict(self.s_channel or LEGACY_CHANNEL)
        record["backend"] = backend or record["backend"]
        own = self.meta.get("sentence_encoder")
        if own:
            if self.sentence_encoder_dir is None:
                raise ModelError("this model's S channel is an encoder of its own, but its directory is unknown; "
                                 "load the model with TicketModel.load")
            name = str(own.get("base") or record.get("encoder") or "sentence encoder")
            return load_encoder(self.sentence_encoder_dir, own["files"], record["backend"],
                                name=f"{name}, adapted to the knowledge base" if own.get("loss") else name)
        encoder = load_encoder(None, None, record["backend"])
        if record.get("checksum") and encoder.checksum != record["checksum"]:
            raise ModelError(f"this model's S channel was trained with an encoder whose files differ from the "
                             f"packaged {encoder.name} (checksum {record['checksum'][:12]}…); retrain the model")
        return encoder

    def _component_text(self, item, comp: str, side: str) -> str:
        """The text of metric component `comp` of a query or ticket (MERGED: the config's merged fields of `side`)."""
        if comp == MERGED:
            comp = "+".join(self.siamese_config.merged_query if side == "query" else self.siamese_config.merged_ticket)
        return component_text(item, comp)

    def encode_prepared(self, prepared: Prepared, batch_size: int = 256, progress: bool = False,
                        keys: set[str] | None = None) -> EncodedBatch:
        """Channel vectors of prepared texts, in batches, without gradients (only `keys`, when given)."""
        self._ensure_inference()
        n = len(prepared.tokens)
        parts: list[dict[str, np.ndarray]] = []
        with torch.no_grad():
            for start in tqdm(range(0, n, batch_size), desc="encoding", disable=not progress, leave=False):
                tokens, extras = prepared.rows(range(start, min(n, start + batch_size)))
                out = self.net.encode(self.featurizer.batch(tokens, extras), keys)
                parts.append({k: v.numpy().astype(np.float32) for k, v in out.items()})
        if not parts:
            return {}
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def encode_queries(self, queries: Sequence[Query], batch_size: int = 256, progress: bool = False) -> EncodedBatch:
        """EncodedBatch of queries: "SUB.h", "DESC.E", ... (only the vectors the metric weighs: `served_keys`)."""
        return self.encode_prepared(self.prepare(queries, "query", progress, used_only=True), batch_size, progress,
                                    self.served_keys("query"))

    def encode_tickets(self, tickets: Sequence[Ticket], batch_size: int = 256, progress: bool = False) -> EncodedBatch:
        """EncodedBatch of tickets: "SUB.h", "SOL.E", ... (computed once, at index time; `served_keys` only)."""
        return self.encode_prepared(self.prepare(tickets, "ticket", progress, used_only=True), batch_size, progress,
                                    self.served_keys("ticket"))

    def score_encoded(self, q: EncodedBatch, t: EncodedBatch, lexical: np.ndarray | None = None) -> np.ndarray:
        """g for aligned rows of already encoded queries and tickets (`lexical`: see `score_pairs`)."""
        with torch.no_grad():
            qt = {k: torch.from_numpy(v) for k, v in q.items()}
            tt = {k: torch.from_numpy(v) for k, v in t.items()}
            ratio = None if lexical is None else torch.as_tensor(np.asarray(lexical, dtype=np.float32))
            return self.net.similarity(qt, tt, ratio).numpy().astype(np.float64)

    def score_pairs(self, queries: Sequence[Query], tickets: Sequence[Ticket], lexical=None) -> np.ndarray:
        """g ∈ (0, 1] for aligned (query, ticket) pairs — the model's forward pass.

        `lexical` is the lexical feature of each pair, bm25 / the query's maximum bm25 over its knowledge base
        (`lexical.bm25`: e.g. `Bm25Scorer(kb).lexical(text, rows)`). Without it the lexical term is left out.
        """
        if len(queries) != len(tickets):
            raise ValueError("score_pairs needs as many queries as tickets (aligned pairs)")
        if lexical is not None and np.shape(lexical) != (len(queries),):
            raise ValueError(f"score_pairs needs one lexical value per pair ({len(queries)}), got shape {np.shape(lexical)}")
        return self.score_encoded(self.encode_queries(queries), self.encode_tickets(tickets), lexical)

    def calibrate(self, g: np.ndarray) -> np.ndarray:
        """Calibrated 1–5 scores of raw similarities g."""
        if self.calibrator is None:
            raise ModelError("this model has no calibrator; retrain it with ticketrec train")
        return self.calibrator(np.asarray(g, dtype=np.float64))

    def topic_words(self, k: int = 10) -> list[list[str]]:
        """The k top words of every DocNADE topic ([] when the model has no topic channel)."""
        if self.topic_model is None:
            return []
        offset = len(RESERVED)
        return [[self.topic_vocab.tokens[int(i) + offset] for i in ids] for ids in self.topic_model.top_words(k)]

    def top_topics(self, ticket_vecs: EncodedBatch, row: int, n: int = 3) -> list[dict]:
        """The n strongest topics of ticket `row` (mean of its components' T vectors) with their top words."""
        keys = [k for k in ticket_vecs if k.endswith(".T")]
        if not keys or self.topic_model is None:
            return []
        vec = np.mean([ticket_vecs[k][row] for k in keys], axis=0)
        words = self.topic_words(5)
        best = np.argsort(-vec, kind="stable")[:n]
        return [{"id": int(i), "weight": float(vec[i]), "words": words[i] if i < len(words) else []} for i in best]

    # -- persistence -----------------------------------------------------------------------
    def _state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.net.state_dict().items() if k != _WORDS_KEY}

    def _fingerprint(self, reports: tuple[str, ...] = REPORT_KEYS) -> str:
        """The version: a hash of the config without its `reports` (how training went, not what it learnt: two
        fine-tunings to the same weights are one model, whatever their wall times) and of every learned number."""
        h = hashlib.sha256()
        cfg = {k: v for k, v in self.config.items() if k not in ("version", "packages", *reports)}
        cfg["hyperparameters"] = self.siamese_config.fingerprint_dict()  # a field added later leaves the version
        h.update(json.dumps(cfg, sort_keys=True).encode())
        for name, tensor in sorted(self.net.state_dict().items()):
            h.update(name.encode())
            h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        if self.calibrator is not None:
            h.update(json.dumps(self.calibrator.to_dict()).encode())
        return h.hexdigest()[:16]

    def _ensure_inference(self) -> None:
        if self.net.training or (self.net.embedder.chars is not None and self.net.embedder._char_cache is None):
            self.net.eval()
            self.net.embedder.cache_chars(self.vocab, self.chars)

    def invalidate(self) -> None:
        """Forget the cached version and char vectors (after the network was changed in place)."""
        self._version = None
        self.net.embedder._char_cache = None

    def save(self, path: str | Path) -> None:
        """Write the artifact directory atomically: into a temporary sibling, then one rename over `path`."""
        with atomic_directory(path, marker="config.json") as tmp:
            config = self.config
            config["version"] = self.version
            (tmp / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
            torch.save(self._state_dict(), tmp / "weights.pt")
            self.vocab.save(tmp / "vocab.json")
            np.save(tmp / "word2vec.npy", self.net.embedder.words.weight.detach().cpu().numpy().astype(np.float32),
                    allow_pickle=False)
            self.splitter.save(tmp / "punkt.json")
            if self.calibrator is not None:
                self.calibrator.save(tmp / "calibrator.json")
            if self.topic_model is not None:
                self.topic_vocab.save(tmp / "topic_vocab.json")
                self.topic_model.save(tmp / "docnade")
            if self.meta.get("sentence_encoder"):
                from .adaptation import save_into

                save_into(self.sentence_encoder_dir, tmp)
            for channel, encoder in self.channel_encoders.items():
                encoder.save(tmp / CHANNELS_DIR / channel)

    @staticmethod
    def saved_version(path: str | Path) -> str | None:
        """The version a model directory's config.json records (nothing else is read); None when there is none."""
        config = TicketModel.saved_config(path)
        version = config.get("version") if config is not None else None
        return version if isinstance(version, str) else None

    @staticmethod
    def saved_config(path: str | Path) -> dict | None:
        """A model directory's config.json, read without loading the model; None when it cannot be read."""
        try:
            config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return config if isinstance(config, dict) else None

    @staticmethod
    def training_facts(config: dict) -> dict:
        """When the model of `config` was trained and on how many knowledge-base tickets: {"trained_at": seconds
        since 1970, "tickets": n}, each None where the config does not say (a model saved before they were
        recorded). A model fine-tuned on feedback keeps its base's: tuning reads the judged tickets only."""
        training = config.get("training") if isinstance(config.get("training"), dict) else {}
        tickets = training.get("tickets", (training.get("mining") or {}).get("tickets"))
        trained_at = training.get("trained_at")
        return {"trained_at": float(trained_at) if isinstance(trained_at, (int, float)) else None,
                "tickets": int(tickets) if isinstance(tickets, int) else None}

    @classmethod
    def load(cls, path: str | Path) -> "TicketModel":
        """Read an artifact directory; a missing, corrupt or foreign-version file raises ModelError naming it."""
        path = Path(path)
        if not path.is_dir():
            raise ModelError(f"no model at {path}; train one with: ticketrec train --out {path} (it learns from the "
                             "tickets in the store; --train FILE adds labelled pairs)")
        cfg_file = path / "config.json"
        try:
            config = json.loads(cfg_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelError(f"cannot read {cfg_file}: {exc}; retrain the model") from exc
        if not isinstance(config, dict) or config.get("format_version") != FORMAT_VERSION:
            got = config.get("format_version") if isinstance(config, dict) else None
            raise ModelError(f"{cfg_file} has format version {got!r}, this ticketrec reads {FORMAT_VERSION}; "
                             "retrain the model with this version")
        try:
            sconfig = SiameseConfig.from_saved(config["hyperparameters"])
            chars = CharVocabulary(config["chars"])
            metric = config["metric"]
        except Exception as exc:
            raise ModelError(f"{cfg_file} is incomplete or corrupt ({exc}); retrain the model") from exc
        vocab = Vocabulary.load(path / "vocab.json")
        w2v_file = path / "word2vec.npy"
        try:
            vectors = np.load(w2v_file, allow_pickle=False)
            if vectors.shape != (len(vocab), sconfig.word_dim):
                raise ValueError(f"shape {vectors.shape}, expected {(len(vocab), sconfig.word_dim)}")
        except (OSError, ValueError) as exc:
            raise ModelError(f"cannot read the word vectors {w2v_file}: {exc}; retrain the model") from exc
        splitter = SentenceSplitter.load(path / "punkt.json")
        calibrator = Calibrator.load(path / "calibrator.json") if (path / "calibrator.json").exists() else None
        net = ReplicatedSiameseLSTM(sconfig, vectors, len(chars))
        weights_file = path / "weights.pt"
        try:
            state = torch.load(weights_file, map_location="cpu", weights_only=True)
            state[_WORDS_KEY] = torch.from_numpy(vectors)
            net.load_state_dict(state, strict=True)
        except Exception as exc:  # torch raises RuntimeError, pickle errors, zip errors... on damaged files
            raise ModelError(f"cannot read the network weights {weights_file}: {exc}; retrain the model") from exc
        topic_model = topic_vocab = None
        if "T" in sconfig.active_channels:
            topic_vocab = Vocabulary.load(path / "topic_vocab.json")
            topic_model = _load_docnade(path / "docnade")
        meta = {k: v for k, v in config.items() if k not in ("format_version", "hyperparameters", "metric", "chars", "version")}
        legacy = None
        if "S" in sconfig.active_channels and "s_channel" not in meta:  # trained before the record: torch, 256 pieces
            from .pretrained import LEGACY_CHANNEL

            legacy = dict(LEGACY_CHANNEL)
        encoders = load_channel_encoders(path, meta.get("channel_encoders") or {})
        model = cls(sconfig, vocab, chars, splitter, net, calibrator, topic_model, topic_vocab, meta, s_channel=legacy,
                    channel_encoders=encoders)
        if meta.get("sentence_encoder"):  # an own S encoder lives in the model directory (verified on first use)
            model.sentence_encoder_dir = path / "sentence_encoder"
        if model.metric_spec() != metric:
            raise ModelError(f"the metric weights in {cfg_file} do not match {weights_file}; the artifact is "
                             "inconsistent, retrain the model")
        if config.get("version") and model.version != config["version"]:
            if model._fingerprint(LEGACY_REPORT_KEYS) == config["version"]:  # saved when fine-tuning reports counted
                model._version = config["version"]
                return model
            raise ModelError(f"the files of {path} do not match the version in {cfg_file} "
                             f"({model.version} != {config['version']}); the artifact is corrupt, retrain the model")
        return model

