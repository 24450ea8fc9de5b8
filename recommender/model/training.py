"""Training of the Replicated Siamese LSTM: MSE on (score−1)/4, Adadelta, dropout, clipping, early stopping on dev,
the Table 2 weight grid (or learned weights), then calibration (centred isotonic regression on the labelled pairs and
random NO tickets).

What text the unsupervised parts (vocabulary, IDF, word2vec, Punkt, DocNADE) see: the knowledge base, i.e. every
ticket of the training data and of the dev data (their SUB, DESC, SOL), plus the training queries (SUB, DESC).
The dev queries and every label of the dev set stay unseen until early stopping and weight selection.
"""
from __future__ import annotations

import copy
import itertools
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
from scipy.stats import pearsonr, spearmanr
from tqdm import tqdm

from .calibration import Calibrator
from .encoder_base import encode_threads, memoised_sentence_vectors
from .embeddings import CharVocabulary, align_vectors, load_word2vec, train_word2vec, word2vec_epochs
from ..errors import InputError
from .bundle import Prepared, TicketModel, _package_versions, build_topic_vocab, topic_documents
from ..data.records import NO, Query, Ticket, query_text
from .adaptation import keep_saved_encoder
from .static_fit import fit_static_encoder
from .siamese import ReplicatedSiameseLSTM, SiameseConfig, metric_distance
from ..data.store import Dataset
from ..lexical.bm25 import Bm25Scorer
from .sentences import SentenceSplitter
from .pairs import PairSet, dataset_fingerprint, split_queries
from .vocab import EOS, Vocabulary

#: Random NO tickets per query in every calibration: the labelled queries' (`labelled_calibrator`), the judged ones'
#: (`train --with-feedback`) and the mined held-out queries' (`mined_calibration.calibration_pairs`).
CALIBRATION_NEGATIVES = 4


# ---------------------------------------------------------------------------------------------------
# measures
# ---------------------------------------------------------------------------------------------------

class GroupTable:
    """Pairs laid out as a [groups, max group size] table, so MAP for many score vectors costs a few numpy calls."""

    def __init__(self, groups: np.ndarray, labels: np.ndarray, relevant_min: float):
        groups = np.asarray(groups)
        keys, inverse, sizes = np.unique(groups, return_inverse=True, return_counts=True)
        width = int(sizes.max()) if len(sizes) else 0
        order = np.argsort(inverse, kind="stable")
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        col = np.arange(len(groups)) - np.repeat(starts, sizes)
        self.rows = np.full((len(keys), width), -1, dtype=np.int64)
        self.rows[inverse[order], col] = order
        self.valid = self.rows >= 0
        self.relevant = np.where(self.valid, np.asarray(labels)[self.rows] >= relevant_min, False)
        self.n_relevant = self.relevant.sum(1)

    def per_query_ap(self, scores: np.ndarray) -> np.ndarray:
        """AP×100 of each group (query), over all its relevant pairs (a group without one: 0), of the scores
        [..., pairs] (one vector, or a row per weighting) → [..., groups]. Ties keep the pairs' order."""
        s = np.where(self.valid, np.asarray(scores, dtype=np.float64)[..., self.rows], -np.inf)
        order = np.argsort(-s, axis=-1, kind="stable")
        rel = np.take_along_axis(np.broadcast_to(self.relevant, s.shape), order, axis=-1)
        precision = np.cumsum(rel, axis=-1) / np.arange(1, rel.shape[-1] + 1)
        ap = np.where(self.n_relevant > 0, (precision * rel).sum(-1) / np.maximum(self.n_relevant, 1), 0.0)
        return 100.0 * ap

    def map(self, scores: np.ndarray) -> float:
        """Rerank MAP (×100) of one score vector over the groups."""
        ap = self.per_query_ap(scores)
        return float(ap.mean()) if ap.size else 0.0


def mean_average_precision(groups: np.ndarray, scores: np.ndarray, labels: np.ndarray, relevant_min: float = 3.0) -> float:
    """Rerank MAP (×100) over groups (queries): a group without any relevant pair counts 0, as SemEval's scorer does."""
    return GroupTable(groups, labels, relevant_min).map(scores)


def correlations(g: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Pearson r and Spearman ρ (0 when a side is constant)."""
    if len(g) < 2 or np.ptp(g) == 0 or np.ptp(labels) == 0:
        return 0.0, 0.0
    return float(pearsonr(g, labels)[0]), float(spearmanr(g, labels)[0])


# ---------------------------------------------------------------------------------------------------
# the lexical feature of the BM25 channel: the one definition of recommender.lexical.bm25, as serving computes it
# ---------------------------------------------------------------------------------------------------

def lexical_features(pairs: PairSet, kb: Sequence[Ticket] | Bm25Scorer) -> np.ndarray:
    """lexical(q, t) = bm25(q, t) / max over the knowledge base of bm25(q, ·) for every labelled pair, with the
    one BM25 (`lexical.bm25`) and IDF over the knowledge base `kb` (its tickets, or a `Bm25Scorer` over them)."""
    scorer = kb if isinstance(kb, Bm25Scorer) else Bm25Scorer(kb)
    try:
        return scorer.lexical_pairs([query_text(q) for q in pairs.queries], pairs.q,
                                    [pairs.tickets[int(i)].id for i in pairs.t])
    except KeyError as exc:
        raise InputError(f"a labelled pair names a ticket outside the knowledge base ({exc.args[0]}); "
                         "add it to the training data's tickets") from exc


# ---------------------------------------------------------------------------------------------------
# weight selection (Table 2 grid)
# ---------------------------------------------------------------------------------------------------

def grid_combinations(channels: Sequence[str], pair_keys: Sequence[str], grid: dict, current: dict,
                      use_bm25: bool) -> list[dict[str, float]]:
    """Every weighting of a grid, as {channel, "QUERY|TICKET" pair key, and "bm25" when `use_bm25`: weight}. `grid`
    maps those names to candidate weights; a weight it does not name keeps its value in `current` (a metric spec).
    Weightings that weigh no channel or no pair are left out."""
    axes = [(c, list(grid.get(c, [current["channels"][c]]))) for c in channels]
    axes += [(k, list(grid.get(k, [v]))) for k, (_, _, v) in zip(pair_keys, current["pairs"])]
    if use_bm25:
        axes.append(("bm25", list(grid.get("bm25", [current["bm25"]]))))
    names = [a for a, _ in axes]
    combos = [dict(zip(names, c)) for c in itertools.product(*[v for _, v in axes])]
    return [w for w in combos if any(w[c] > 0 for c in channels) and any(w[k] > 0 for k in pair_keys)]


def combination_distances(dist: np.ndarray, combos: Sequence[dict[str, float]], channels: Sequence[str],
                          pair_keys: Sequence[str], lexical: np.ndarray | None = None) -> np.ndarray:
    """The metric's distance d of every pair under each weighting: [N, P, C] distances (and, for weightings with
    "bm25", the [N] lexical distances 1 − bm25 ratio) → [len(combos), N]."""
    cw = np.array([[w[c] for c in channels] for w in combos], dtype=np.float64).reshape(len(combos), len(channels))
    pw = np.array([[w[k] for k in pair_keys] for w in combos], dtype=np.float64).reshape(len(combos), len(pair_keys))
    d = np.einsum("npc,kp,kc->kn", dist, pw, cw)
    if lexical is not None:
        d = d + np.array([w.get("bm25", 0.0) for w in combos])[:, None] * np.asarray(lexical)[None, :]
    return d


#: Weightings scored together (`combination_scores`: bounds the memory of large grids).
_GRID_CHUNK = 2048


def combination_scores(dist: np.ndarray, combos: Sequence[dict[str, float]], channels: Sequence[str],
                       pair_keys: Sequence[str], lexical: np.ndarray | None = None) -> Iterator[np.ndarray]:
    """g = exp(−d) of every pair under each weighting (`combination_distances`), `_GRID_CHUNK` weightings at a time:
    [chunk, N] arrays, in the order of `combos`."""
    for start in range(0, len(combos), _GRID_CHUNK):
        yield np.exp(-combination_distances(dist, combos[start:start + _GRID_CHUNK], channels, pair_keys, lexical))


def select_weights(dist: np.ndarray, labels: np.ndarray, groups: np.ndarray, pairs: Sequence[Sequence],
                   channels: Sequence[str], grid: dict, current: dict, bm25_ratio: np.ndarray | None = None,
                   objective: str = "map", relevant_min: float = 3.0) -> tuple[dict, float]:
    """Evaluate every combination of the grid (`grid_combinations`) on precomputed [N, P, C] distances and return
    the best spec (the first of equal bests, in grid order) and its value. The objective is rerank MAP over the
    groups, or Pearson r of g with the labels."""
    pair_keys = [f"{a}|{b}" for a, b, *_ in pairs]
    use_bm25 = bm25_ratio is not None and current.get("bm25", 0) > 0
    combos = grid_combinations(channels, pair_keys, grid, current, use_bm25)
    if not combos:
        raise InputError("the weight grid weighs no channel or no pair in every combination; give it a positive weight")
    table = GroupTable(groups, labels, relevant_min)
    lexical = (1.0 - bm25_ratio) if use_bm25 else None
    scores = np.concatenate([table.per_query_ap(g).mean(axis=1) if objective == "map"
                             else np.array([correlations(row, labels)[0] for row in g])
                             for g in combination_scores(dist, combos, channels, pair_keys, lexical)])
    best = combos[int(np.argmax(scores))]
    spec = {"pairs": [[a, b, float(best[k])] for (a, b, *_), k in zip(pairs, pair_keys)],
            "channels": {c: float(best[c]) for c in channels},
            "bm25": float(best["bm25"]) if use_bm25 else current.get("bm25", 0.0)}
    return spec, float(scores.max())


# ---------------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------------

def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _unsupervised_parts(config: SiameseConfig, kb_tickets: Sequence[Ticket], kb_queries: Sequence[Query], seed: int,
                        word_vectors: str | Path | None, progress: bool, w2v_updates: int = 0):
    """Punkt, vocabulary, char vocabulary, word vectors and DocNADE, all from the knowledge-base text; word2vec trains
    `config.w2v_epochs` epochs, or with `w2v_updates` for about that many token updates (`word2vec_epochs`)."""
    texts = [t.description for t in kb_tickets] + [t.solution for t in kb_tickets if t.solution] + \
            [q.description for q in kb_queries]
    splitter = SentenceSplitter.train(texts)
    from .siamese import Featurizer

    raw_featurizer = Featurizer(config, None, None, splitter)  # only tokenises
    raws = [raw_featurizer.raw_components(t.subject, t.description, t.solution or "") for t in
            tqdm(kb_tickets, desc="tokenising the knowledge base", disable=not progress, leave=False)]
    raws += [raw_featurizer.raw_components(q.subject, q.description, None) for q in kb_queries]
    documents = [tokens for r in raws for tokens in r.values()]
    vocab = Vocabulary.build(documents, min_count=config.min_count)
    chars = CharVocabulary.build(vocab.tokens[1:])
    sentences: list[list[str]] = []
    for doc in documents:
        current: list[str] = []
        for tok in doc:
            if tok == EOS:
                sentences.append(current)
                current = []
            else:
                current.append(tok)
        sentences.append(current)
    if word_vectors is not None:
        kv = load_word2vec(word_vectors)
        source = str(word_vectors)
    else:
        n_tokens = sum(map(len, sentences))
        epochs = word2vec_epochs(n_tokens, config.w2v_epochs, w2v_updates)
        if progress:
            tqdm.write(f"word2vec {config.word_dim}-d on {n_tokens:,} tokens, {epochs} epochs ...")
        kv = train_word2vec(sentences, dim=config.word_dim, seed=seed, workers=1, epochs=epochs,
                            window=config.w2v_window, min_count=config.min_count)
        source = f"trained on the knowledge base ({n_tokens:,} tokens, {epochs} epochs)"
    vectors = align_vectors(kv, vocab, config.word_dim)
    topic_model = topic_vocab = None
    if "T" in config.active_channels:
        topic_model, topic_vocab = _fit_docnade(config, raws, seed, progress)
    return splitter, vocab, chars, vectors, source, topic_model, topic_vocab


def _fit_docnade(config: SiameseConfig, raws: list[dict], seed: int, progress: bool):
    try:
        from topic_models import docnade
    except ImportError as exc:
        raise InputError(f"the topic channel T needs topic_models.docnade, which cannot be imported ({exc}); "
                         "use a config without T (e.g. --preset ml_cl_hE)") from exc
    docs_tokens = [[w for comp in r.values() for w in comp] for r in raws]  # SUB+DESC+SOL per ticket ("M2")
    topic_vocab = build_topic_vocab(docs_tokens, config.topic_vocab)
    docs = [d for d in topic_documents(docs_tokens, topic_vocab) if d]
    if progress:
        tqdm.write(f"DocNADE {config.topics} topics on {len(docs)} documents, vocabulary {len(topic_vocab) - 3} ...")
    model = docnade.fit(docs, vocab_size=len(topic_vocab) - 3, n_topics=config.topics, epochs=config.topic_epochs,
                        seed=seed, progress=progress)
    return model, topic_vocab


def _encode_all(model: TicketModel, prepared: Prepared) -> dict[str, torch.Tensor]:
    enc = model.encode_prepared(prepared, batch_size=128)
    return {k: torch.from_numpy(v) for k, v in enc.items()}


def pair_distances(model: TicketModel, qp: Prepared, tp: Prepared, pairs: PairSet) -> np.ndarray:
    """[N, P, C] channel distances of every labelled pair (queries and tickets encoded once)."""
    return _gathered_distances(model, _encode_all(model, qp), _encode_all(model, tp), pairs.q, pairs.t)


def _gathered_distances(model: TicketModel, q: dict, t: dict, qi: np.ndarray, ti: np.ndarray) -> np.ndarray:
    """[N, P, C] channel distances of the pairs (query row qi[n], ticket row ti[n]) of encoded queries and tickets."""
    with torch.no_grad():
        qi, ti = torch.from_numpy(np.asarray(qi)), torch.from_numpy(np.asarray(ti))
        return model.net.distances({k: v[qi] for k, v in q.items()}, {k: v[ti] for k, v in t.items()}).numpy()


def _scores(model: TicketModel, dist: np.ndarray, ratio: np.ndarray | None) -> np.ndarray:
    with torch.no_grad():
        from .siamese import metric_distance

        d = metric_distance(torch.from_numpy(dist), model.net.pair_weights(), model.net.channel_weights()).numpy()
        if model.net.use_bm25 and ratio is not None:
            d = d + float(model.net.bm25_weight()) * (1.0 - ratio)
    return np.exp(-d).astype(np.float64)


def _unit_scale(model: TicketModel, data: PreparedPairs) -> float:
    """Rescale V (and W_bm25) so the mean distance d over the training pairs is 1.

    Table 2's weights fix how channels and pairs compare, not the absolute size of d; with 350-d E, 100-d T and
    50-d h the raw sum is about 10, exp(−d) ≈ 0 for every pair and MSE training gets no gradient.
    """
    mean_d = mean_distance(model, data)
    factor = 1.0 / mean_d if mean_d > 0 else 1.0
    model.net.rescale(factor)
    model.invalidate()
    return factor


# ---------------------------------------------------------------------------------------------------
# the public training API: prepared pairs, their scores, evaluation, and `fit` (a trained copy)
# ---------------------------------------------------------------------------------------------------

@dataclass
class PreparedPairs:
    """Labelled pairs with their texts prepared by a model (tokens, T and S vectors) and their lexical feature.

    Preparing is the slow part (Punkt, DocNADE, MiniLM). `fit` keeps the vocabulary, Punkt, DocNADE and the
    word vectors of its input, so one PreparedPairs serves a model and every model `fit` makes from it.
    `lexical` is `lexical_features(pairs, knowledge base)`; None scores without the BM25 channel.
    """

    pairs: PairSet
    queries: Prepared
    tickets: Prepared
    lexical: np.ndarray | None = None

    @classmethod
    def of(cls, model: TicketModel, pairs: PairSet, lexical: np.ndarray | None = None,
           progress: bool = False) -> "PreparedPairs":
        """Prepare the queries and tickets of `pairs` with `model`."""
        return cls(pairs, model.prepare(pairs.queries, "query", progress), model.prepare(pairs.tickets, "ticket", progress),
                   lexical)

    def __len__(self) -> int:
        return len(self.pairs)


def _as_prepared(model: TicketModel, data: PairSet | PreparedPairs, progress: bool,
                 scorer: Bm25Scorer | None = None) -> PreparedPairs:
    """`data` prepared with `model`; bare pairs get their lexical feature over `scorer` (default: their tickets)."""
    if isinstance(data, PreparedPairs):
        return data
    if model.siamese_config.bm25 <= 0:
        return PreparedPairs.of(model, data, None, progress)
    lexical = lexical_features(data, scorer if scorer is not None else data.tickets)
    return PreparedPairs.of(model, data, lexical, progress)


def mean_distance(model: TicketModel, data: PreparedPairs) -> float:
    """The mean metric distance d = −log g over the pairs of `data` (the scale of the metric on them)."""
    return float(np.mean(-np.log(np.maximum(pair_scores(model, data), 1e-300))))


def pair_scores(model: TicketModel, data: PreparedPairs) -> np.ndarray:
    """The uncalibrated similarity g = exp(−d) ∈ (0, 1] of every pair (BM25 channel from `data.lexical`)."""
    return _scores(model, pair_distances(model, data.queries, data.tickets, data.pairs), data.lexical)


def cross_scores(model: TicketModel, queries: Prepared, tickets: Prepared, lexical: np.ndarray | None = None,
                 max_pairs: int = 20_000) -> np.ndarray:
    """[Q, T] g of every prepared query against every prepared ticket, as `pair_scores` scores a pair (`lexical`
    [Q, T]: the BM25 share, or None); each side encoded once, the pairs scored `max_pairs` at a time."""
    q, t = _encode_all(model, queries), _encode_all(model, tickets)
    n_q, n_t = len(queries.tokens), len(tickets.tokens)
    out = np.zeros((n_q, n_t), dtype=np.float64)
    step = max(1, max_pairs // max(n_t, 1))
    for start in range(0, n_q, step):
        rows = np.arange(start, min(n_q, start + step))
        dist = _gathered_distances(model, q, t, np.repeat(rows, n_t), np.tile(np.arange(n_t), len(rows)))
        out[rows] = _scores(model, dist, None if lexical is None else lexical[rows].reshape(-1)).reshape(len(rows), n_t)
    return out


def random_negatives(model: TicketModel, data: PreparedPairs, kb: Sequence[Ticket], kb_scorer: Bm25Scorer | None,
                     seed: int, progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(g, y) of `CALIBRATION_NEGATIVES` random tickets of `kb` per query of `data` (a ticket `data` pairs with the
    query skipped) as NO pairs, scored as serving scores them (the lexical feature over `kb_scorer`'s knowledge base,
    none when None): the random NO pairs of queries that were judged or labelled, as
    `mined_calibration.calibration_pairs` gives the mined queries theirs."""
    pairs = data.pairs
    rng = np.random.default_rng(seed + 5)
    paired = {(int(qi), pairs.tickets[int(ti)].id) for qi, ti in zip(pairs.q, pairs.t)}
    q, t = [], []
    for qi in range(len(pairs.queries)):
        for r in rng.choice(len(kb), min(CALIBRATION_NEGATIVES, len(kb)), replace=False):
            if (qi, kb[int(r)].id) not in paired:
                q.append(qi)
                t.append(int(r))
    if not q:
        return np.empty(0), np.empty(0)
    used = sorted(set(t))
    at = {r: i for i, r in enumerate(used)}
    negatives = PairSet(pairs.queries, [kb[r] for r in used], np.array(q, np.int64),
                        np.array([at[r] for r in t], np.int64), np.full(len(q), float(NO)))
    lexical = lexical_features(negatives, kb_scorer) if kb_scorer is not None else None
    prepared = PreparedPairs(negatives, data.queries, model.prepare(negatives.tickets, "ticket", progress), lexical)
    return pair_scores(model, prepared), negatives.y


def labelled_calibrator(model: TicketModel, data: PreparedPairs, kb: Sequence[Ticket], kb_scorer: Bm25Scorer | None,
                        seed: int, progress: bool = False) -> tuple[Calibrator, dict]:
    """The calibrator of a model trained on labelled pairs: `Calibrator.fit_centered` (ties broken by raw score) on
    `data`'s labelled pairs plus `random_negatives`' random tickets of `kb` per query as NO pairs, so that an
    unrelated ticket is calibrated by examples of one, as label-free training's mined calibration does. Also returns
    what it was fitted on: {"labelled_pairs", "random_no", "median_score": {label or "random tickets": median}}."""
    labelled_g = pair_scores(model, data)
    random_g, random_y = random_negatives(model, data, kb, kb_scorer, seed, progress)
    calibrator = Calibrator.fit_centered(np.r_[labelled_g, random_g], np.r_[data.pairs.y, random_y])
    medians = {f"label {label:g}": float(np.median(calibrator(labelled_g[data.pairs.y == label])))
               for label in sorted(set(data.pairs.y.tolist()), reverse=True)}
    if len(random_g):
        medians["random tickets"] = float(np.median(calibrator(random_g)))
    return calibrator, {"labelled_pairs": len(labelled_g), "random_no": len(random_g), "median_score": medians}


def evaluate(model: TicketModel, data: PreparedPairs) -> dict:
    """Pearson r, Spearman ρ, calibrated MSE (1–5 scale) and rerank MAP of `model` on labelled pairs."""
    g = pair_scores(model, data)
    r, rho = correlations(g, data.pairs.y)
    return {"pairs": len(data), "pearson": r, "spearman": rho,
            "mse": float(np.mean((model.calibrate(g) - data.pairs.y) ** 2)),
            "map": mean_average_precision(data.pairs.q, g, data.pairs.y, model.siamese_config.relevant_min)}


def fit(model: TicketModel, train: PairSet | PreparedPairs, dev: PairSet | PreparedPairs | None = None, *,
        epochs: int | None = None, lr: float | None = None, seed: int = 0, calibrate: bool = True,
        progress: bool = False, history: list[dict] | None = None) -> TicketModel:
    """Train a copy of `model` on `train`'s labelled pairs (scores 1–5) and return it; `model` is left untouched.

    The MSE loop of the paper: Adadelta at `lr` (default: the model's config) for up to `epochs` epochs (default:
    the config's), early stopping on `dev`'s Pearson r when `dev` is given (the best epoch is kept). The
    vocabulary, word vectors, Punkt and DocNADE are the input's. With `calibrate`, the copy's calibrator is refitted
    on `train` (`labelled_calibrator`, its random NO tickets drawn from `train`'s tickets). Pairs may come prepared
    (`PreparedPairs`, to prepare once for several calls); bare `PairSet`s are prepared here, their lexical feature
    over their own tickets. `history`, when given, receives one row per epoch (train_mse, and dev_pearson,
    dev_spearman, dev_map with `dev`).
    """
    config = model.siamese_config
    tuned = copy.deepcopy(model)
    tickets = (train.pairs if isinstance(train, PreparedPairs) else train).tickets
    # one BM25 over `train`'s tickets serves both the bare pairs' lexical feature and the calibration's
    scorer = Bm25Scorer(tickets) if calibrate and config.bm25 > 0 else None
    train_data = _as_prepared(tuned, train, progress, scorer)
    dev_data = _as_prepared(tuned, dev, progress) if dev is not None else None
    rows = _fit(tuned, train_data, dev_data, config.epochs if epochs is None else epochs,
                config.lr if lr is None else lr, seed, progress)
    if calibrate:
        scorer = scorer if train_data.lexical is not None else None
        tuned.calibrator = labelled_calibrator(tuned, train_data, tickets, scorer, seed, progress)[0]
    tuned.invalidate()
    if history is not None:
        history.extend(rows)
    return tuned


@encode_threads()
@memoised_sentence_vectors()
def train_model(train: Dataset, dev: Dataset | None, config: SiameseConfig, out_dir: str | Path | None,
                seed: int = 0, word_vectors: str | Path | None = None, progress: bool = True,
                channel_encoders: dict | None = None) -> TicketModel:
    """Train, select weights, calibrate and (when `out_dir` is given) save a TicketModel; fixed seed → same model.
    `channel_encoders` computes the extra channels C / V the config weighs (`extra_channels.py`)."""
    started = time.time()
    torch.set_num_threads(1)  # small LSTMs: one thread is as fast, and the machine is shared
    _seed_everything(seed)
    if not train.pairs:
        raise InputError("the training data has no labelled pairs; import a file with (query, ticket, score) pairs")
    held_out = dev is None
    fit_data, dev_data = split_queries(train, config.dev_share, seed) if held_out else (train, dev)
    train_pairs = PairSet.from_dataset(fit_data, "training")
    dev_pairs = PairSet.from_dataset(dev_data, "dev") if dev_data.pairs else None

    kb_tickets = list({t.id: t for t in list(train.tickets) + (list(dev.tickets) if dev else [])}.values())
    splitter, vocab, chars, vectors, w2v_source, topic_model, topic_vocab = _unsupervised_parts(
        config, kb_tickets, fit_data.queries, seed, word_vectors, progress)
    _seed_everything(seed)
    net = ReplicatedSiameseLSTM(config, vectors, len(chars))
    meta = {"data_fingerprint": dataset_fingerprint(train, dev), "seed": seed, "word_vectors": w2v_source,
            "packages": _package_versions(), "kb_text": "train tickets + train queries" + (" + dev tickets" if dev else "")}
    model = TicketModel(config, vocab, chars, splitter, net, None, topic_model, topic_vocab, meta,
                        channel_encoders=channel_encoders)
    static_fit = fit_static_encoder(model, kb_tickets, seed, progress)  # None unless S runs on the static backend

    tq, tt = model.prepare(train_pairs.queries, "query", progress), model.prepare(train_pairs.tickets, "ticket", progress)
    dq = dt = None
    if dev_pairs is not None:
        dq, dt = model.prepare(dev_pairs.queries, "query", progress), model.prepare(dev_pairs.tickets, "ticket", progress)
    train_ratio = dev_ratio = None
    kb_scorer = None
    if config.bm25 > 0:  # the lexical feature, IDF over the training knowledge base (as an index of it would)
        kb_scorer = Bm25Scorer(kb_tickets)
        train_ratio = lexical_features(train_pairs, kb_scorer)
        if dev_pairs is not None:
            dev_ratio = lexical_features(dev_pairs, kb_scorer)

    train_set = PreparedPairs(train_pairs, tq, tt, train_ratio)
    dev_set = PreparedPairs(dev_pairs, dq, dt, dev_ratio) if dev_pairs is not None else None
    scale = _unit_scale(model, train_set)
    history: list[dict] = []
    model = fit(model, train_set, dev_set, seed=seed, calibrate=False, progress=progress, history=history)
    net = model.net

    selection = None
    if config.weights == "grid" and dev_set is not None:
        dist = pair_distances(model, dq, dt, dev_pairs)
        spec, value = select_weights(dist, dev_pairs.y, dev_pairs.q, config.metric_pairs, net.channel_names,
                                     config.grid, net.metric_spec(), dev_ratio, config.select_by, config.relevant_min)
        net.set_weights([v for *_, v in spec["pairs"]], spec["channels"], spec["bm25"])
        selection = {"objective": config.select_by, "value": value, "spec": spec,
                     "scale": _unit_scale(model, train_set)}

    model.net.eval()
    model.calibrator, calibration = labelled_calibrator(model, train_set, kb_tickets, kb_scorer, seed, progress)
    if progress:
        tqdm.write("calibrated on the training pairs and random tickets: median score " + ", ".join(
            f"{name} {value:.2f}" for name, value in calibration["median_score"].items()))
    report = {"tickets": len(kb_tickets), "train_pairs": len(train_pairs), "calibration": calibration,
              "dev_pairs": len(dev_pairs) if dev_pairs else 0,
              "dev_source": "held-out training queries" if held_out else "dev file", "history": history,
              "weight_selection": selection, "initial_scale": scale, "static_fit": static_fit}
    if dev_set is not None:
        report["dev"] = {k: v for k, v in evaluate(model, dev_set).items() if k != "pairs"}
    report["wall_seconds"] = round(time.time() - started, 1)
    report["trained_at"] = time.time()
    model.meta["training"] = report
    model.invalidate()
    if out_dir is not None:
        model.save(out_dir)
        if static_fit:
            keep_saved_encoder(model, out_dir)
    return model


def in_batch_ranking_loss(net, qv: dict[str, torch.Tensor], tv: dict[str, torch.Tensor], ticket_ids: np.ndarray,
                          relevant: np.ndarray, scale: float) -> torch.Tensor:
    """Cross-entropy of each relevant pair's own ticket among the batch's tickets, with logits −scale·d (the
    metric's learnable channels; BM25 is not known for the cross pairs). Other rows holding the positive's ticket
    are left out; 0 when the batch has no relevant pair."""
    pos = np.flatnonzero(relevant)
    if len(pos) == 0:
        return torch.zeros(())
    n = len(ticket_ids)
    qi, tj = np.repeat(pos, n), np.tile(np.arange(n), len(pos))
    qi_t, tj_t = torch.from_numpy(qi), torch.from_numpy(tj)
    d = metric_distance(net.distances({k: v[qi_t] for k, v in qv.items()}, {k: v[tj_t] for k, v in tv.items()}),
                        net.pair_weights(), net.channel_weights()).view(len(pos), n)
    same = ticket_ids[pos][:, None] == ticket_ids[None, :]
    same[np.arange(len(pos)), pos] = False  # the own row stays: it is the target
    logits = (-scale * d).masked_fill(torch.from_numpy(same), float("-inf"))
    return torch.nn.functional.cross_entropy(logits, torch.from_numpy(pos))


def _fit(model: TicketModel, train: PreparedPairs, dev: PreparedPairs | None, epochs: int, lr: float, seed: int,
         progress: bool) -> list[dict]:
    """The MSE loop (plus `in_batch_ranking_loss` when the config's rank_loss > 0), in place on `model`: Adadelta
    (network) and Adam (learned weights), clipping, early stopping on
    dev Pearson r (the best epoch's weights are kept)."""
    config, net = model.siamese_config, model.net
    pairs, tq, tt, ratio = train.pairs, train.queries, train.tickets, train.lexical
    params = net.network_parameters()
    if epochs <= 0 or not params:
        return []
    opt = torch.optim.Adadelta(params, lr=lr)
    wopt = torch.optim.Adam([p for p in net.weight_parameters() if p.requires_grad], lr=config.weight_lr) \
        if config.learn_weights else None
    target = torch.from_numpy(((pairs.y - 1.0) / 4.0).astype(np.float32))
    rng = np.random.default_rng(seed)
    best_state, best_r, since_best, history = None, -np.inf, 0, []
    bar = tqdm(range(epochs), desc="training", disable=not progress)
    for epoch in bar:
        net.train()
        order = rng.permutation(len(pairs))
        total = 0.0
        steps = tqdm(range(0, len(order), config.batch_size), desc=f"epoch {epoch + 1}", leave=False,
                     disable=not progress)
        for start in steps:
            idx = order[start:start + config.batch_size]
            qb = model.featurizer.batch(*tq.rows(pairs.q[idx]))
            tb = model.featurizer.batch(*tt.rows(pairs.t[idx]))
            r = None if ratio is None else torch.from_numpy(ratio[idx].astype(np.float32))
            qv, tv = net.encode(qb), net.encode(tb)
            g = net.similarity(qv, tv, r)
            loss = torch.mean((g - target[idx]) ** 2)
            if config.rank_loss > 0:
                loss = loss + config.rank_loss * in_batch_ranking_loss(net, qv, tv, pairs.t[idx],
                                                                       pairs.y[idx] >= config.relevant_min,
                                                                       config.rank_scale)
            opt.zero_grad()
            if wopt:
                wopt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, config.clip)
            opt.step()
            if wopt:
                wopt.step()
            total += float(loss.detach()) * len(idx)
            steps.set_postfix(loss=f"{float(loss.detach()):.4f}", refresh=False)
        row = {"epoch": epoch + 1, "train_mse": total / len(order)}
        if dev is not None:
            model.invalidate()
            g = pair_scores(model, dev)
            row["dev_pearson"], row["dev_spearman"] = correlations(g, dev.pairs.y)
            row["dev_map"] = mean_average_precision(dev.pairs.q, g, dev.pairs.y, config.relevant_min)
            if row["dev_pearson"] > best_r:
                best_r, since_best = row["dev_pearson"], 0
                best_state = copy.deepcopy(net.state_dict())
            else:
                since_best += 1
        history.append(row)
        bar.set_postfix(loss=f"{row['train_mse']:.4f}", dev_r=f"{row.get('dev_pearson', float('nan')):.3f}")
        if dev is not None and since_best >= config.patience:
            break
    if best_state is not None:
        net.load_state_dict(best_state)
    model.invalidate()
    net.eval()
    return history
