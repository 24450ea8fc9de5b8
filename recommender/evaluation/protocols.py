"""The two evaluation protocols and their prediction files.

- *rerank* (SemEval-2016 subtask B): each query ranks only its own labelled candidate tickets;
- *knowledge base* (the paper's): every ticket of the data set is in the knowledge base; each query retrieves its
  top k from all of them through the real engine path (BM25 pre-filter, then the model); unlabelled tickets count
  as not relevant.

Both give per-query predictions, written as JSON lines and in the SemEval prediction format
(`orgQ relQ 0 score true|false`, one line per pair) so the official scorer can be run on them.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Protocol, Sequence

import numpy as np
from tqdm import tqdm

from ..errors import InputError
from ..files import atomic_write_text
from ..data.records import Query, Recommendation
from ..data.store import Dataset
from . import metrics as M


#: Scores one query's candidate tickets (by id): higher = more similar. The rerank protocol's face.
QueryScorer = Callable[[Query, Sequence[str]], np.ndarray]
#: The top k of the knowledge base for a query: [(ticket id, raw score, calibrated score)], best first.
QueryRetriever = Callable[[Query, int], Sequence[tuple[str, float, float]]]


class Recommends(Protocol):
    """The engine's face (`recommender.engine.Recommender`)."""

    def recommend(self, query: Query, k: int = 10) -> list[Recommendation]: ...


def from_engine(engine: Recommends) -> QueryRetriever:
    """Adapt the engine (`recommend(query, k) -> [Recommendation]`) to the knowledge-base protocol."""
    return lambda query, k: [(r.ticket.id, float(r.raw_score), float(r.score)) for r in engine.recommend(query, k)]


@dataclass
class Prediction:
    """One scored (query, ticket) pair of a protocol run."""

    query_id: str
    ticket_id: str
    rank: int  # 1-based within the query
    raw_score: float
    score: float  # calibrated 1–5 when a calibration is known, else the raw score
    label: float | None  # gold 1–5, None when the pair is unlabelled


@dataclass
class ProtocolResult:
    """The predictions of one protocol run, with the gold labels they were judged against."""

    protocol: str  # "rerank" | "kb"
    predictions: list[Prediction]
    qrels: M.Qrels
    meta: dict = field(default_factory=dict)

    def run(self) -> M.Run:
        """query id → ticket ids in predicted order."""
        out: M.Run = {qid: [] for qid in self.qrels}  # a query that retrieved nothing still counts (as 0)
        for p in sorted(self.predictions, key=lambda p: (p.query_id, p.rank)):
            out.setdefault(p.query_id, []).append(p.ticket_id)
        return out

    def metrics(self, ks=M.DEFAULT_KS, threshold: float = M.YES_AND_REL) -> dict[str, float]:
        """Ranking metrics (fractions), the official SemEval ones (×100), success rate and, on labelled pairs,
        the similarity metrics of the calibrated score."""
        run = self.run()
        out = dict(M.ranking_metrics(run, self.qrels, ks, threshold))
        out.update(M.official_semeval(run, self.qrels, threshold))
        out.update({f"success_{k}": v for k, v in M.success_rate(run, self.qrels).items()})
        labelled = [p for p in self.predictions if p.label is not None]
        if len(labelled) >= 2:
            out.update(M.similarity_metrics([p.score for p in labelled], [p.label for p in labelled]))
        return out

    def write(self, directory: str | Path, name: str, threshold: float = M.YES_AND_REL) -> dict[str, Path]:
        """Write `<name>.<protocol>.jsonl` and `<name>.<protocol>.pred` (SemEval format) atomically."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        jsonl = directory / f"{name}.{self.protocol}.jsonl"
        pred = directory / f"{name}.{self.protocol}.pred"
        atomic_write_text(jsonl, "".join(json.dumps(asdict(p)) + "\n" for p in self.predictions))
        atomic_write_text(pred, semeval_lines(self.predictions, threshold))
        return {"jsonl": jsonl, "pred": pred}


def semeval_lines(predictions: Sequence[Prediction], threshold: float = M.YES_AND_REL) -> str:
    """`orgQ relQ 0 score true|false` per pair, in the order given; true = calibrated score ≥ threshold."""
    lines = []
    for p in predictions:
        for ident in (p.query_id, p.ticket_id):
            if not ident or any(c.isspace() for c in ident):
                raise InputError(f"id {ident!r} cannot be written in the SemEval format (empty or with white space)")
        lines.append(f"{p.query_id}\t{p.ticket_id}\t0\t{p.raw_score:.8g}\t{'true' if p.score >= threshold else 'false'}\n")
    return "".join(lines)


def qrels_of(dataset: Dataset) -> M.Qrels:
    """query id → ticket id → gold label (1–5) from the data set's labelled pairs."""
    qrels: M.Qrels = {}
    for p in dataset.pairs:
        qrels.setdefault(p.query_id, {})[p.ticket_id] = float(p.score)
    return qrels


def _labelled_queries(dataset: Dataset) -> list[Query]:
    qrels = qrels_of(dataset)
    queries = [q for q in dataset.queries if q.id in qrels]
    if not queries:
        raise InputError(f"{dataset.source or 'the data set'} has no query with labelled pairs; nothing to evaluate")
    return queries


def rerank(
    dataset: Dataset,
    score: QueryScorer,
    calibrate: Callable[[np.ndarray], np.ndarray] | None = None,
    progress: bool = True,
) -> ProtocolResult:
    """Rerank protocol: every query ranks its own labelled tickets by `score` (ties keep the pair order).

    Predictions are listed in the data set's pair order, so the SemEval file lines up with the gold file.
    """
    queries, tickets = dataset.query_map(), dataset.ticket_map()
    pairs = [p for p in dataset.pairs if p.query_id in queries and p.ticket_id in tickets]
    if not pairs:
        raise InputError(f"{dataset.source or 'the data set'} has no labelled pair whose query and ticket are both known")
    by_query: dict[str, list[int]] = {}
    for i, p in enumerate(pairs):
        by_query.setdefault(p.query_id, []).append(i)
    raw = np.empty(len(pairs), dtype=np.float64)
    rank = np.zeros(len(pairs), dtype=np.int64)
    for qid, idx in tqdm(by_query.items(), desc="rerank", unit="query", disable=not progress, leave=False):
        scores = np.asarray(score(queries[qid], [pairs[i].ticket_id for i in idx]), dtype=np.float64)
        if scores.shape != (len(idx),):
            raise ValueError(f"the scorer returned {scores.shape} scores for {len(idx)} tickets of query {qid!r}")
        raw[idx] = scores
        for r, j in enumerate(sorted(range(len(idx)), key=lambda j: -scores[j]), 1):
            rank[idx[j]] = r
    calibrated = calibrate(raw) if calibrate is not None else raw
    predictions = [
        Prediction(p.query_id, p.ticket_id, int(rank[i]), float(raw[i]), float(calibrated[i]), float(p.score))
        for i, p in enumerate(pairs)
    ]
    return ProtocolResult("rerank", predictions, qrels_of(dataset))


def knowledge_base(dataset: Dataset, retrieve: QueryRetriever, k: int = 10, progress: bool = True) -> ProtocolResult:
    """Knowledge-base protocol: each labelled query retrieves its top k from all tickets through `retrieve`.

    The retriever must already hold every ticket of `dataset` (e.g. the engine over a store the data set was
    imported into; see `from_engine`). Unlabelled retrieved tickets get label None and count as not relevant.
    """
    qrels = qrels_of(dataset)
    predictions: list[Prediction] = []
    for query in tqdm(_labelled_queries(dataset), desc="knowledge base", unit="query", disable=not progress, leave=False):
        labels = qrels[query.id]
        for r, (tid, raw, calibrated) in enumerate(list(retrieve(query, k))[:k], 1):
            predictions.append(Prediction(query.id, tid, r, float(raw), float(calibrated), labels.get(tid)))
    return ProtocolResult("kb", predictions, qrels)
