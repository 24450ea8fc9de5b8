"""Evaluation on real duplicate links: the knowledge-base protocol for a help desk that has no labelled pairs.

Every ticket of a duplicate pair (a, b) is a query: its SUBJECT + DESCRIPTION searches the whole knowledge base
minus itself and must find its partner (a → b and b → a: two queries per distinct pair). Per query the protocol
keeps the partner's rank among the top k; MRR@10 and Acc@k (share of queries with the partner in the top k) are
means over the queries, with 95 % bootstrap intervals (the queries resampled, the same resamples for every
system, so the intervals of two systems are comparable).

A *system* is any callable `rank(query_ticket, n) -> [ticket id, ...]` (best first, at least n ids when the
knowledge base has them): `evaluate_duplicates` asks for n = k + 1 and drops the query's own id. Ready systems:
`bm25_ranker`, `minilm_ranker`, `rrf_ranker` (reciprocal-rank fusion) and `EngineRanker` (a model scored
exactly as serving scores it: an index built in a temporary home, the engine's candidates and scoring code).
"""
from __future__ import annotations

import hashlib
import logging
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
from tqdm import tqdm

from ..data.records import Query, Ticket, query_text, ticket_text
from ..errors import InputError
from ..model.encoder_base import encode_threads
from .metrics import bootstrap_interval, bootstrap_samples, paired_bootstrap_difference

log = logging.getLogger(__name__)

#: A system under evaluation: (query ticket, n) → the ids of its n best tickets, best first. The query's own id
#: may be among them (the protocol drops it).
Ranker = Callable[[Ticket, int], Sequence[str]]

#: The cut-offs of the report (MRR is taken at the largest).
KS = (1, 5, 10)
#: The reciprocal-rank fusion constant (Cormack et al. 2009).
RRF_K = 60
#: The reference systems' names in every table (here and in `baselines`, the labelled protocols' copies).
BM25_NAME, MINILM_NAME, RRF_NAME = "BM25", "MiniLM (zero-shot)", f"RRF BM25+MiniLM (k={RRF_K})"


def query_of(ticket: Ticket) -> Query:
    """The query a ticket asks when it is a new ticket: its subject and description (never its solution)."""
    return Query(ticket.subject, ticket.description, ticket.id)


# -- the protocol ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DuplicateQueries:
    """The queries of a links list over one knowledge base: (query id, partner id) in a fixed order."""

    pairs: list[tuple[str, str]]
    distinct_links: int
    dropped_unknown: int  # links naming an id that is not in the knowledge base


def duplicate_queries(ticket_ids: Iterable[str], links: Iterable[tuple[str, str]]) -> DuplicateQueries:
    """Both directions of every distinct link whose two tickets are in the knowledge base (self-links dropped)."""
    known = set(ticket_ids)
    seen: set[tuple[str, str]] = set()
    distinct: list[tuple[str, str]] = []
    unknown = 0
    for a, b in links:
        a, b = str(a), str(b)
        if a == b:
            continue
        key = (a, b) if a < b else (b, a)
        if key in seen:
            continue
        seen.add(key)
        if a not in known or b not in known:
            unknown += 1
            continue
        distinct.append((a, b))
    pairs = [q for a, b in distinct for q in ((a, b), (b, a))]
    return DuplicateQueries(pairs, len(distinct), unknown)


def partner_ranks(tickets: Mapping[str, Ticket], queries: Sequence[tuple[str, str]], rank: Ranker, k: int = 10,
                  desc: str = "", progress: bool = False) -> list[int | None]:
    """The 1-based rank of each query's partner within the top k of `rank` (the query itself removed); None
    when the partner is not in the top k. A query the system refuses (InputError: e.g. no words) finds nothing."""
    out: list[int | None] = []
    for qid, partner in tqdm(queries, desc=desc or "duplicates", unit="query", disable=not progress, leave=False):
        try:
            ranked = [tid for tid in rank(tickets[qid], k + 1) if tid != qid][:k]
        except InputError as exc:
            log.warning("query %s gave no ranking: %s", qid, exc)
            ranked = []
        out.append(ranked.index(partner) + 1 if partner in ranked else None)
    return out


def rank_metrics(ranks: Sequence[int | None], ks: Sequence[int] = KS) -> dict[str, np.ndarray]:
    """Per-query values: "MRR@K" (1/rank within the largest k, else 0) and "Acc@k" (partner in the top k)."""
    r = np.array([math.inf if x is None else x for x in ranks], dtype=np.float64)
    top = max(ks)
    out = {f"MRR@{top}": np.where(r <= top, 1.0 / r, 0.0)}
    for k in ks:
        out[f"Acc@{k}"] = (r <= k).astype(np.float64)
    return out


def evaluate_duplicates(
    tickets: Sequence[Ticket],
    links: Iterable[tuple[str, str]],
    systems: Mapping[str, Ranker],
    *,
    k: int = 10,
    ks: Sequence[int] = KS,
    n_boot: int = 2000,
    seed: int = 0,
    progress: bool = False,
) -> list[dict]:
    """Run the duplicates protocol for every system, in the order given; one row per system.

    `tickets` is the knowledge base, `links` the duplicate pairs (ticket ids; e.g. `importers.load_links`),
    `systems` maps a name to a `Ranker` over those tickets (`bm25_ranker(tickets)`, `minilm_ranker(tickets)`,
    `rrf_ranker([...])`, `EngineRanker(...)`, or your own). A row is
    `{"system", "queries", "MRR@10", "Acc@1", "Acc@5", "Acc@10", "<metric>_low", "<metric>_high", "ranks"}`:
    means over the queries, their 95 % bootstrap interval (`seed` fixes the resamples) and the partner's rank
    per query (None = not in the top k), in the order of `duplicate_queries(...).pairs`.
    Raises InputError when no link has both tickets in the knowledge base.
    """
    kb = {t.id: t for t in tickets}
    queries = duplicate_queries(kb, links)
    if not queries.pairs:
        raise InputError(f"none of the duplicate links names two tickets of the knowledge base ({len(kb)} tickets, "
                         f"{queries.dropped_unknown} links with an unknown id); check that the links file and the "
                         "tickets use the same ids")
    if k < max(ks):
        raise ValueError(f"k={k} is smaller than the largest cut-off {max(ks)}")
    samples = bootstrap_samples(len(queries.pairs), n_boot, seed)
    rows = []
    for name, rank in systems.items():
        ranks = partner_ranks(kb, queries.pairs, rank, k, desc=name, progress=progress)
        row: dict = {"system": name, "queries": len(ranks)}
        per_query = rank_metrics(ranks, ks)
        for metric, values in per_query.items():
            row[metric] = float(values.mean())
        for metric, values in per_query.items():
            row[f"{metric}_low"], row[f"{metric}_high"] = bootstrap_interval(values, samples)
        row["ranks"] = ranks
        rows.append(row)
    return rows


def paired_against_first(rows: Sequence[dict], n_boot: int = 2000, seed: int = 0) -> dict[str, dict[str, dict]]:
    """The first row's system against each other row's, on the same queries: per metric, the mean of the per-query
    difference (first − other), its 95 % paired bootstrap interval and the share of resamples where it is ≤ 0
    (`metrics.paired_bootstrap_difference`; the resamples of `evaluate_duplicates` for the same `seed`).
    {other system: {metric: {"diff", "low", "high", "p_not_better"}}}."""
    if not rows:
        return {}
    first = rank_metrics(rows[0]["ranks"])
    out = {}
    for row in rows[1:]:
        other = rank_metrics(row["ranks"])
        out[row["system"]] = {m: paired_bootstrap_difference(first[m], other[m], n_boot, seed) for m in first}
    return out


def paired_line(by_metric: dict[str, dict]) -> str:
    """One system's paired differences as a line: "MRR@10 +0.048 [-0.011, +0.109], …" (three decimals, as
    report.md)."""
    return ", ".join(f"{m} {d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]" for m, d in by_metric.items())


# -- ready systems -----------------------------------------------------------------------------------------------
def top_rows(scores: np.ndarray, n: int, keep: np.ndarray | None = None) -> np.ndarray:
    """Rows of the n highest scores, best first, ties by row (only rows where `keep`, when given)."""
    rows = np.arange(len(scores)) if keep is None else np.flatnonzero(keep)
    order = np.lexsort((rows, -scores[rows]))[:n]
    return rows[order]


def bm25_ranker(tickets: Sequence[Ticket]) -> Ranker:
    """BM25 alone: the one BM25 of ticketrec (`lexical.bm25.Bm25Scorer`, our analyser) over these tickets;
    tickets sharing no term with the query are not ranked."""
    from ..lexical.bm25 import Bm25Scorer

    scorer = Bm25Scorer(list(tickets))
    ids = scorer.ids

    def rank(query: Ticket, n: int) -> list[str]:
        scores = scorer.scores(query_text(query))
        return [ids[int(r)] for r in top_rows(scores, n, scores > 0)]

    return rank


#: MiniLM vectors by sha1 of the text: computed once per process, shared by every ranker and call.
_MINILM_CACHE: dict[str, np.ndarray] = {}


def minilm_vectors(texts: Sequence[str], progress: bool = False) -> np.ndarray:
    """[n, dim] unit vectors of `texts` by the off-the-shelf sentence encoder, the baseline a help desk would run
    instead: the S channel's encoder for new models (all-MiniLM-L6-v2 unless TICKETREC_ENCODER says otherwise) as
    sentence-transformers runs it, torch float32 (not the int8 export ticketrec serves), cached per process."""
    from ..model.pretrained import get_encoder

    encoder = get_encoder(backend="torch")
    tag = f"{encoder.checksum}:{encoder.backend}:".encode()
    keys = [hashlib.sha1(tag + t.encode("utf-8")).hexdigest() for t in texts]
    missing = list(dict.fromkeys(key for key in keys if key not in _MINILM_CACHE))
    if missing:
        first = {key: t for key, t in zip(keys, texts)}
        vectors = encoder.encode([first[key] for key in missing], progress=progress)
        _MINILM_CACHE.update(zip(missing, vectors))
    if not keys:
        return np.zeros((0, encoder.dim), np.float32)
    return np.stack([_MINILM_CACHE[key] for key in keys])


def minilm_ranker(tickets: Sequence[Ticket], progress: bool = False) -> Ranker:
    """The pretrained all-MiniLM-L6-v2 alone, zero-shot: cosine of the query's SUBJECT + DESCRIPTION to each
    ticket's SUBJECT + DESCRIPTION + SOLUTION (needs the `[pretrained]` extra)."""
    ids = [t.id for t in tickets]
    matrix = minilm_vectors([ticket_text(t) for t in tickets], progress=progress)

    def rank(query: Ticket, n: int) -> list[str]:
        q = minilm_vectors([query_text(query)])[0]
        return [ids[int(r)] for r in top_rows(matrix @ q, n)]

    return rank


def reciprocal_rank_fusion(rankings: Iterable[Sequence[str]], k: int = RRF_K) -> dict[str, float]:
    """Reciprocal-rank fusion (Cormack et al. 2009): id → Σ over `rankings` (ids best first) of 1 / (k + its rank),
    ranks counted from 1; best first, ties in the order the ids are first met (the first ranking's)."""
    fused: dict[str, float] = {}
    for ranking in rankings:
        for r, tid in enumerate(ranking, 1):
            fused[tid] = fused.get(tid, 0.0) + 1.0 / (k + r)
    return {tid: fused[tid] for tid in sorted(fused, key=lambda tid: -fused[tid])}  # sorted() is stable


def rrf_ranker(rankers: Sequence[Ranker], depth: int, k: int = RRF_K) -> Ranker:
    """Reciprocal-rank fusion: score(t) = Σ_systems 1 / (k + rank of t), over each system's top `depth`
    (give the knowledge-base size to fuse full rankings); the query itself is removed before ranks are counted."""

    def rank(query: Ticket, n: int) -> list[str]:
        fused = reciprocal_rank_fusion(([tid for tid in ranker(query, depth + 1) if tid != query.id][:depth]
                                        for ranker in rankers), k)
        return list(fused)[:n]

    return rank


def baseline_systems(tickets: Sequence[Ticket], progress: bool = False) -> dict[str, Ranker]:
    """The three reference systems of the protocol: BM25, MiniLM (zero-shot) and their RRF (k = 60)."""
    bm25 = bm25_ranker(tickets)
    minilm = minilm_ranker(tickets, progress=progress)
    return {BM25_NAME: bm25, MINILM_NAME: minilm, RRF_NAME: rrf_ranker([bm25, minilm], depth=len(tickets))}


class EngineRanker:
    """A trained model scored exactly as serving scores it: the tickets imported into a store in a temporary
    home, an index version built with the model (`serving.index_build.build_index`), each query answered by the
    engine's own candidate search (K = `settings.candidates`) and scoring (`serving.engine.score_in_process`),
    with the query ticket removed from the candidates (the knowledge base minus itself).

    Use as a context manager (the temporary home is removed on exit), or call `close()`.
    """

    def __init__(self, model, tickets: Sequence[Ticket], settings=None, workdir: str | Path | None = None,
                 progress: bool = False):
        from ..config import Settings
        from ..data.store import Dataset, Store
        from ..serving.engine import Recommender
        from ..serving.index_build import build_index

        base = settings or Settings.from_env()
        self._tmp = Path(tempfile.mkdtemp(prefix="ticketrec-dups-", dir=workdir))
        # no search server for a temporary knowledge base
        prefilter = base.prefilter if base.prefilter in ("index", "topics", "fts5") else "index"
        self.settings = base.replace(home=self._tmp, db=self._tmp / "kb.sqlite3", model=self._tmp / "model",
                                     prefilter=prefilter, broker_url="", max_description=10**9, index_workers=1)
        try:
            self.store = Store(self.settings.db)
            self.store.import_dataset(Dataset(list(tickets), source="duplicates"))
            build_index(self.store, model, self.settings, incremental=False, progress=progress, workers=1)
            self.engine = Recommender(self.settings, store=self.store, model=model)
        except BaseException:
            self.close()
            raise
        self.model = model

    def __call__(self, query: Ticket, n: int) -> list[str]:
        return [tid for tid, _ in self.scored(query, n)]

    def scored(self, query: Ticket, n: int) -> list[tuple[str, float]]:
        """The top n tickets for the knowledge-base ticket `query`, itself left out: (ticket id, raw g), best first
        (`model.calibrate` gives the 1–5 scores serving shows)."""
        from ..serving.engine import score_in_process, validate_query

        engine = self.engine
        q = query_of(query)
        validate_query(q, self.settings)
        index = engine.index
        model = engine.model_for(index)  # the model serving this index version
        k_candidates = self.settings.candidates
        if k_candidates > 0:  # one more candidate than K: the query ticket itself is dropped below
            engine.settings = self.settings.replace(candidates=k_candidates + 1)
        try:
            rows, bm25 = engine.candidates(q, index, least=n + 1)  # n results besides the query's own ticket
        finally:
            engine.settings = self.settings
        own = index.row_of.get(query.id)
        if own is not None:
            if rows is None:  # the whole index is scored: every row but the query's own
                keep = np.ones(len(index), bool)
                keep[own] = False
                rows = np.flatnonzero(keep)
                bm25 = None if bm25 is None else np.asarray(bm25)[rows]
            else:
                keep = rows != own
                rows, bm25 = rows[keep], (None if bm25 is None else bm25[keep])
                if k_candidates > 0:
                    rows, bm25 = rows[:k_candidates], (None if bm25 is None else bm25[:k_candidates])
        return [(tid, g) for tid, g, _ in score_in_process(index, model.encode_queries([q]), n, rows, bm25)]

    def close(self) -> None:
        store = getattr(self, "store", None)
        if store is not None:
            store.close()
            self.store = None
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> "EngineRanker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- the `ticketrec evaluate --kb ... --duplicates ...` run -----------------------------------------------------------
@encode_threads()
def run_duplicates(
    kb_path: str | Path,
    links_path: str | Path,
    *,
    mapping: Mapping[str, str] | None = None,
    html: str = "auto",
    link_columns: Sequence[str] | None = None,
    model_dir: str | Path | None = None,
    settings=None,
    baselines: bool = True,
    out: str | Path | None = None,
    seed: int = 0,
    n_boot: int = 2000,
    command: str = "",
    progress: bool = True,
    warn: Callable[[str], None] | None = None,
) -> dict:
    """Import the knowledge base (`mapping` for an export's own columns, `html` as `ticketrec import --html`) and
    the links, evaluate the model (`model_dir`, default the settings' model) through the engine, then BM25, MiniLM
    and their RRF (when `baselines`), and write the report into `out` when given. Returns the results (rows first
    the model's). MiniLM and RRF are left out, with a note, when the pretrained extra is not installed."""
    import datetime as _dt

    import torch

    from ..config import Settings
    from ..data.importers import load, load_links
    from ..errors import ModelError
    from ..model.bundle import TicketModel
    from .experiments import _versions, fingerprint

    torch.set_num_threads(1)
    settings = settings or Settings.from_env()
    data = load(kb_path, mapping=mapping, warn=warn, progress=progress, html=html)
    tickets = data.tickets
    if not tickets:
        raise InputError(f"{kb_path} holds no ticket; give the knowledge base's tickets with --kb")
    links = load_links(links_path, link_columns, known_ids=[t.id for t in tickets], warn=warn)
    model_path = Path(model_dir) if model_dir else settings.model
    model = TicketModel.load(model_path)
    notes: list[str] = []
    with EngineRanker(model, tickets, settings, progress=progress) as engine:
        systems: dict[str, Ranker] = {f"model {model_path.name} ({model.version[:12]})": engine}
        if baselines:
            try:
                systems.update(baseline_systems(tickets, progress=progress))
            except ModelError as exc:
                notes.append(f"MiniLM and RRF rows left out: {exc}")
                systems[BM25_NAME] = bm25_ranker(tickets)
        rows = evaluate_duplicates(tickets, links, systems, n_boot=n_boot, seed=seed, progress=progress)
        candidates = engine.settings.candidates
        prefilter = engine.settings.prefilter
    queries = duplicate_queries([t.id for t in tickets], links)
    results = {
        "name": Path(out).name if out else "duplicates",
        "protocol": "duplicates",
        "command": command or f"run_duplicates({kb_path!s}, {links_path!s}, model_dir={model_path!s}, seed={seed})",
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "data": {"kb": {"path": str(kb_path), "sha256": fingerprint(kb_path), "tickets": len(tickets),
                        "mapping": dict(mapping or {})},
                 "links": {"path": str(links_path), "sha256": fingerprint(links_path), "links": len(links),
                           "queries": len(queries.pairs)}},
        "model": {"path": str(model_path), "version": model.version, "metric": model.metric_spec()},
        "candidates": candidates, "prefilter": prefilter, "seed": seed, "bootstrap": n_boot,
        "queries": [list(q) for q in queries.pairs],
        "rows": rows, "paired": paired_against_first(rows, n_boot, seed), "notes": notes, "versions": _versions(),
    }
    if out is not None:
        from .report import write_duplicates_report

        results["files"] = {k: str(v) for k, v in write_duplicates_report(results, out).items()}
    return results


def public_rows(rows: Sequence[dict]) -> list[dict]:
    """Rows without the per-query ranks (what `ticketrec evaluate --json` prints)."""
    return [{k: v for k, v in row.items() if k != "ranks"} for row in rows]
