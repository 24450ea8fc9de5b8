"""The Table 5 experiment grid: every row a configuration of the one model class (or the BM25 baseline),
trained on --train, selected on --dev, reported on dev (and --test) under both protocols.

Entry point: `run_experiment(...)`, used by `ticketrec evaluate`. Rows run in `jobs` worker processes (one torch
thread each, inner progress bars off, one bar of rows done); every seed's predictions and figures are kept.
Cross-validation of the weight selection lives in `crossval.py`.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import math
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tqdm import tqdm

from ..config import default, usable_cpus
from ..errors import InputError
from ..model.encoder_base import memoised_sentence_vectors
from ..data.records import Query, query_text
from ..data.store import Dataset, Store
from . import metrics as M
from . import protocols as P
from .report import write_report

# (query components, ticket components) of the merged-text rows: Table 5 #1–9 (T), #11–14 (E), #15–18 (S-LSTM)
_COMBOS_9 = [(q, t) for q in (["SUB"], ["DESC"], ["SUB", "DESC"]) for t in (["SUB"], ["DESC"], ["SUB", "DESC", "SOL"])]
_COMBOS_4 = [(["SUB"], ["SUB"]), (["DESC"], ["DESC"]), (["SUB", "DESC"], ["SUB", "DESC"]), (["SUB", "DESC"], ["SUB", "DESC", "SOL"])]


def _combo_name(q: list[str], t: list[str]) -> str:
    return "+".join(q) + "–" + "+".join(t)


@dataclass
class Row:
    """One line of the Table 5 analogue."""

    name: str
    paper_row: str
    description: str
    kind: str = "model"  # "model" (a SiameseConfig preset + overrides) | "bm25" | "encoder" (`preset` names it)
    preset: str = ""
    overrides: dict = field(default_factory=dict)
    headline: bool = False  # run with every seed (mean ± spread)

    @property
    def trained(self) -> bool:
        if self.kind == "encoder":  # a standalone Siamese network of issue 13 (`_train_encoder`)
            return True
        return self.kind == "model" and self.overrides.get("epochs", 1) != 0 and self.preset not in ("t_merged", "e_merged", "e_ml")


def grid_rows(grid: str) -> list[Row]:
    """The rows of a named grid: `table5` (the paper's ablation plus baselines and options beyond it) or `quick`."""
    if grid == "quick":
        return [
            Row("BM25", "", "BM25 over SUB+DESC+SOL (the pre-filter alone)", kind="bm25"),
            Row("E ML (unsupervised)", "11–14", "SumEMB E, multi-level pairs, no training", preset="e_ml"),
            Row("ML+CL h/E/T (paper weights)", "22", "replicated Siamese LSTM, Table 2 weights", preset="ml_cl_hET", headline=True),
        ]
    if grid == "siamese":
        return siamese_rows()
    if grid not in ("table5", "core"):
        raise InputError(f"unknown grid {grid!r}; use table5, core or quick (the Table 5 grids) or siamese (issue 13)")
    rows = [Row("BM25", "", "BM25 over SUB+DESC+SOL (the pre-filter alone)", kind="bm25")]
    for i, (q, t) in enumerate(_COMBOS_9, 1):
        rows.append(Row(f"T {_combo_name(q, t)}", str(i), "DocNADE topic vectors, no training", preset="t_merged",
                        overrides={"merged_query": q, "merged_ticket": t}))
    for i, (q, t) in enumerate(_COMBOS_4, 11):
        rows.append(Row(f"E {_combo_name(q, t)}", str(i), "SumEMB on merged text, no training", preset="e_merged",
                        overrides={"merged_query": q, "merged_ticket": t}))
    rows.append(Row("E ML", "", "SumEMB, multi-level pairs SUB–SUB, DESC–DESC, no training", preset="e_ml"))
    for i, (q, t) in enumerate(_COMBOS_4, 15):
        rows.append(Row(f"S-LSTM {_combo_name(q, t)}", str(i), "standard Siamese LSTM on merged text, h only",
                        preset="slstm_merged", overrides={"merged_query": q, "merged_ticket": t}, headline=(i == 18)))
    rows += [
        Row("S zero-shot", "", "pretrained all-MiniLM-L6-v2 on SUB+DESC, cosine-free Manhattan metric, no training",
            preset="e_merged", overrides={"channels": {"S": 1.0}, "merged_query": ["SUB", "DESC"], "merged_ticket": ["SUB", "DESC"]}),
        Row("ML", "19", "replicated, multi-level pairs, h only", preset="ml"),
        Row("ML+CL", "20", "+ cross-level pairs", preset="ml_cl"),
        Row("ML+CL h/E", "21", "+ weighted channels h 0.8, E 0.2", preset="ml_cl_hE"),
        Row("ML+CL h/E/T", "22", "+ weighted channels h 0.7, E 0.1, T 0.2 (the paper's model)", preset="ml_cl_hET", headline=True),
        Row("ML+CL h/E/T, grid weights", "", "weights selected on dev by the Table 2 grid", preset="ml_cl_hET_grid",
            headline=True),
        Row("ML+CL h/E/T, learned weights", "", "channel and pair weights learned", preset="ml_cl_hET", overrides={"weights": "learn"}),
        Row("+ BM25 channel", "", "h/E/T + BM25, grid weights", preset="ml_cl_hET", overrides={"bm25": 0.3, "weights": "grid"}),
        Row("+ S channel", "", "h/E/T + pretrained S, grid weights", preset="ml_cl_hET",
            overrides={"channels": {"h": 0.7, "E": 0.1, "T": 0.2, "S": 0.3}, "weights": "grid"}),
        Row("best: h/E/T/S + BM25", "", "all channels + BM25, wide dev grid (the product's --pretrained model)",
            preset="default_s", headline=True),
    ]
    if grid == "core":
        return [r for r in rows if r.name in CORE_ROWS]
    return rows


#: The `core` grid: the key rows of table5 (baselines, the best unsupervised row of each kind, the paper's model,
#: and the grid-weighted rows with S) — what fits a shared 2-core machine in well under an hour on SemEval.
CORE_ROWS = ("BM25", "T SUB+DESC–SUB+DESC+SOL", "E SUB+DESC–SUB+DESC", "E ML", "S zero-shot", "ML+CL h/E/T",
             "ML+CL h/E/T, grid weights", "+ S channel", "best: h/E/T/S + BM25")


def siamese_rows() -> list[Row]:
    """The `siamese` grid: issue 13's standalone Siamese networks alone, beside BM25 (kind "encoder")."""
    return [
        Row("BM25", "", "BM25 over SUB+DESC+SOL (the pre-filter alone)", kind="bm25"),
        Row("VarSiamese, labelled pairs", "", "variational Siamese (Deudon 2018): VAE-pretrained Gaussian intents, "
            "W2 + Hadamard features, MLP trained on the labelled pairs", kind="encoder", preset="var-siamese",
            overrides={"pairs": "labelled"}, headline=True),
        Row("VarSiamese, mined pairs", "", "the same network trained on pairs mined from the training tickets "
            "(no labels)", kind="encoder", preset="var-siamese", overrides={"pairs": "mined"}),
        Row("VarSiamese intents only", "", "VAE-pretrained intents alone: g = exp(−mean W2 feature), no pair "
            "training, no MLP", kind="encoder", preset="var-siamese", overrides={"head": "w2"}),
        Row("char trigrams SUB", "", "TF-IDF over the subjects' character trigrams, cosine (the char-Siamese "
            "baseline)", kind="encoder", preset="char-siamese", overrides={"arch": "trigram"}),
        Row("CharSiamese SUB, labelled pairs", "", "character-level Siamese BLSTM (Neculoiu et al. 2016) over the "
            "subjects, contrastive loss, trained on the labelled pairs", kind="encoder", preset="char-siamese",
            overrides={"pairs": "labelled"}, headline=True),
        Row("CharSiamese SUB, mined pairs", "", "the same network trained on noisy subjects mined from the training "
            "tickets (no labels)", kind="encoder", preset="char-siamese", overrides={"pairs": "mined"}),
    ]


# -- data -----------------------------------------------------------------------------------------------------------
def fingerprint(path: str | Path) -> str:
    """sha256 of a data file."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class Split:
    """One data split with its own SQLite store and BM25 searcher over its tickets (its knowledge base)."""

    name: str
    path: Path
    dataset: Dataset
    store: Store | None  # None in a grid worker process (it only reads the data set)
    searcher: Any  # a MemorySearcher: the one BM25, IDF over this split's tickets

    def describe(self) -> dict:
        return {"path": str(self.path), "sha256": fingerprint(self.path), "tickets": len(self.dataset.tickets),
                "queries": len(self.dataset.queries), "pairs": len(self.dataset.pairs)}


def _open_split(name: str, path: Path, out: Path | None) -> Split:
    """Load a split; with `out`, also import it into a fresh SQLite store under out/stores (the parent's copy)."""
    if not path.is_file():
        raise InputError(f"--{name} file {path} does not exist; give the path of a JSONL, CSV or SemEval XML data set")
    from ..data.importers import load
    from ..lexical.searchers import MemorySearcher

    dataset = load(path)
    if not dataset.pairs:
        raise InputError(f"--{name} {path} has no labelled pairs; evaluation needs (query, ticket, score) labels")
    if out is None:
        return Split(name, path, dataset, None, MemorySearcher(dataset.tickets))
    db = out / "stores" / f"{name}.sqlite3"
    db.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):  # a fresh knowledge base per run: exactly this split's tickets
        Path(str(db) + suffix).unlink(missing_ok=True)
    store = Store(db)
    store.import_dataset(dataset)
    return Split(name, path, dataset, store, MemorySearcher(dataset.tickets))


# -- systems: what a row becomes on one split ---------------------------------------------------------------------
class BM25System:
    """The BM25 pre-filter alone (the one BM25 over the split's tickets, as an index of them would score);
    calibrated by isotonic regression fitted on the training pairs."""

    def __init__(self, split: Split, calibrator=None):
        self.split, self.calibrate = split, calibrator

    def score(self, query: Query, ids: Sequence[str]) -> np.ndarray:
        found = dict(self.split.searcher.score_tickets(query_text(query), list(ids)))
        return np.array([float(found.get(t, 0.0)) for t in ids])

    def retrieve(self, query: Query, k: int):
        hits = self.split.searcher.search(query_text(query), k)
        raw = np.array([float(s) for _, s in hits])
        cal = self.calibrate(raw) if (self.calibrate is not None and len(raw)) else raw
        return [(tid, float(r), float(c)) for (tid, _), r, c in zip(hits, raw, cal)]


class ModelSystem:
    """A trained (or unsupervised) TicketModel over one split, scored the engine's way: tickets encoded once,
    the query encoded once, BM25 pre-filter K candidates, the vectorised metric over them, the lexical feature
    bm25 / the query's maximum over the split's knowledge base (`lexical.bm25`)."""

    def __init__(self, model, split: Split, candidates: int, progress: bool = False):
        from ..serving.scoring import PackedVectors, score_candidates

        self.model, self.split, self.candidates = model, split, candidates
        self._score_candidates = score_candidates
        self.spec = model.metric_spec()
        self.ticket_ids = [t.id for t in split.dataset.tickets]
        self.row_of = {tid: i for i, tid in enumerate(self.ticket_ids)}
        self.ticket_vecs = PackedVectors.pack(model.encode_tickets(split.dataset.tickets, progress=progress))
        queries = split.dataset.queries
        qv = model.encode_queries(queries, progress=progress)
        self.query_vecs = {q.id: {k: v[i : i + 1] for k, v in qv.items()} for i, q in enumerate(queries)}
        self.calibrate = model.calibrate

    @property
    def _scorer(self):
        return self.split.searcher.scorer  # rows in the order of split.dataset.tickets, like self.row_of

    def _uses_bm25(self) -> bool:
        return bool(float(self.spec.get("bm25", 0.0) or 0.0))

    def lexical(self, query: Query, ids: Sequence[str]) -> np.ndarray:
        """lexical(q, t) of these tickets: bm25 / the query's maximum over the split's knowledge base."""
        return self._scorer.lexical(query_text(query), [self.row_of[t] for t in ids])

    def score(self, query: Query, ids: Sequence[str]) -> np.ndarray:
        rows = np.array([self.row_of[t] for t in ids], np.int64)
        if not self._uses_bm25():
            return self._score_candidates(self.spec, self.query_vecs[query.id], self.ticket_vecs, rows)
        every = self._scorer.scores(query_text(query))
        return self._score_candidates(self.spec, self.query_vecs[query.id], self.ticket_vecs, rows,
                                      every[rows].astype(np.float32), bm25_max=float(every.max(initial=0.0)))

    def retrieve(self, query: Query, k: int):
        """The engine's answer: the top K by BM25 (all tickets when K = 0), or every ticket, those sharing no word
        with the query at lexical 0, when fewer than k share one (`engine.scores_every_ticket`)."""
        from ..serving.engine import scores_every_ticket, weighs_dense

        n = len(self.ticket_ids)
        rows, scores = self._scorer.top_k(query_text(query), self.candidates if self.candidates > 0 else n)
        bm25 = scores.astype(np.float32) if self._uses_bm25() else None
        if self.candidates <= 0 or scores_every_ticket(rows.size, k, self.candidates, weighs_dense(self.spec)):
            dense = np.zeros(n, np.float32)
            dense[rows] = scores
            rows, bm25 = np.arange(n, dtype=np.int64), dense if self._uses_bm25() else None
        g = self._score_candidates(self.spec, self.query_vecs[query.id], self.ticket_vecs, rows, bm25)
        order = np.argsort(-g, kind="stable")[:k]
        cal = self.calibrate(g[order])
        return [(self.ticket_ids[int(rows[i])], float(g[i]), float(c)) for i, c in zip(order, cal)]


class EncoderSystem:
    """A standalone Siamese network of issue 13 over one split (`encode_tickets`, `encode_queries`, `similarity`):
    tickets encoded once, each query once, the network's own score over the BM25 top K candidates (every ticket
    when K = 0 or fewer than the results asked for share a word); raw scores calibrated by `calibrator`
    (isotonic, fitted on the training split) when given."""

    def __init__(self, encoder, split: Split, candidates: int, calibrator=None):
        self.encoder, self.split, self.candidates, self.calibrate = encoder, split, candidates, calibrator
        self.ticket_ids = [t.id for t in split.dataset.tickets]
        self.row_of = {tid: i for i, tid in enumerate(self.ticket_ids)}
        self.ticket_vecs = encoder.encode_tickets(split.dataset.tickets)
        queries = split.dataset.queries
        self.query_vecs = dict(zip([q.id for q in queries], encoder.encode_queries(queries)))

    def score(self, query: Query, ids: Sequence[str]) -> np.ndarray:
        rows = np.array([self.row_of[t] for t in ids], np.int64)
        return np.asarray(self.encoder.similarity(self.query_vecs[query.id], self.ticket_vecs[rows]), np.float64)

    def retrieve(self, query: Query, k: int):
        from ..serving.engine import scores_every_ticket

        n = len(self.ticket_ids)
        rows, _ = self.split.searcher.scorer.top_k(query_text(query), self.candidates if self.candidates > 0 else n)
        if self.candidates <= 0 or scores_every_ticket(rows.size, k, self.candidates, dense=True):
            rows = np.arange(n, dtype=np.int64)
        g = np.asarray(self.encoder.similarity(self.query_vecs[query.id], self.ticket_vecs[rows]), np.float64)
        order = np.argsort(-g, kind="stable")[:k]
        cal = self.calibrate(g[order]) if self.calibrate is not None else g[order]
        return [(self.ticket_ids[int(rows[i])], float(g[i]), float(c)) for i, c in zip(order, cal)]


def _train_encoder(row: Row, train: Split, dev: Split, seed: int, out: Path):
    """Train (or reuse from an interrupted run) one encoder row's network, saved under out/models."""
    target = out / "models" / f"{slug(row.name)}-seed{seed}"
    if row.preset == "var-siamese":
        from ..model.var_siamese import grid_model

        return grid_model(train.dataset, dev.dataset, row.overrides, seed, target)
    if row.preset == "char-siamese":
        from ..model.char_siamese import grid_model as char_grid_model

        return char_grid_model(train.dataset, dev.dataset, row.overrides, seed, target)
    raise InputError(f"unknown encoder {row.preset!r} in grid row {row.name!r}")


# -- the run -------------------------------------------------------------------------------------------------------
def _mean_spread(values: list[dict]) -> tuple[dict, dict]:
    keys = sorted({k for v in values for k in v})
    mean, spread = {}, {}
    for k in keys:
        xs = [v[k] for v in values if k in v and not (isinstance(v[k], float) and math.isnan(v[k]))]
        mean[k] = float(np.mean(xs)) if xs else float("nan")
        if len(values) > 1:
            spread[k] = float(np.std(xs, ddof=1)) if len(xs) > 1 else float("nan")
    return mean, spread


def _export_word_vectors(model, path: Path) -> None:
    """Write a trained model's word vectors in word2vec text format, so later rows reuse them (no retraining)."""
    from ..model.vocab import RESERVED

    weights = model.net.embedder.words.weight.detach().cpu().numpy()
    tokens = [(i, t) for i, t in enumerate(model.vocab.tokens) if t not in RESERVED and not any(c.isspace() for c in t)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(f"{len(tokens)} {weights.shape[1]}\n")
        for i, t in tokens:
            fh.write(t + " " + " ".join(f"{x:.6g}" for x in weights[i]) + "\n")
    tmp.replace(path)


def _train(row: Row, train: Split, dev: Split, seed: int, out: Path, overrides: dict, progress: bool):
    """Train one row's model; word2vec is trained once per run and shared by every later row (out/cache)."""
    from ..model.siamese import SiameseConfig
    from ..model.training import train_model

    config = SiameseConfig.preset(row.preset, **{**row.overrides, **overrides})
    cached = out / "cache" / "word2vec.txt"
    kwargs: dict[str, Any] = {"seed": seed, "progress": progress}
    if cached.exists():
        kwargs["word_vectors"] = cached
    target = out / "models" / f"{slug(row.name)}-seed{seed}"
    model = _trained_before(target, config, seed, train, dev)
    if model is None:
        model = train_model(train.dataset, dev.dataset, config, target, **kwargs)
    if not cached.exists() and not config.fine_tune_words:
        _export_word_vectors(model, cached)
    return model


def _trained_before(target: Path, config, seed: int, train: Split, dev: Split):
    """The model an interrupted run already saved at `target`, when it has this config, seed and data; else None."""
    from ..errors import ModelError
    from ..model.bundle import TicketModel
    from ..model.training import dataset_fingerprint

    if not (target / "config.json").exists():
        return None
    try:
        model = TicketModel.load(target)
    except ModelError:
        return None
    same = (model.siamese_config.to_dict() == config.to_dict() and model.meta.get("seed") == seed
            and model.meta.get("data_fingerprint") == dataset_fingerprint(train.dataset, dev.dataset))
    return model if same else None


def _evaluate_system(system, split: Split, k: int, progress: bool) -> tuple[dict, P.ProtocolResult, P.ProtocolResult]:
    rr = P.rerank(split.dataset, system.score, calibrate=system.calibrate, progress=progress)
    kb = P.knowledge_base(split.dataset, system.retrieve, k=k, progress=progress)
    metrics = rr.metrics()
    kb_metrics = kb.metrics()
    metrics.update({f"kb_{key}": value for key, value in kb_metrics.items()
                    if key.startswith(("map@", "mrr@", "acc@", "p@", "success_"))})
    return metrics, rr, kb


def slug(name: str) -> str:
    """A row name as a file name: lower case, every other character a dash."""
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


@dataclass
class RunSpec:
    """What every row of a run shares (picklable: sent to the grid's worker processes)."""

    paths: dict[str, str]  # split name → data file
    out: str
    seeds: int
    seed: int
    candidates: int
    overrides: dict

    @property
    def eval_splits(self) -> list[str]:
        return [s for s in ("dev", "test") if s in self.paths]

    def row_seeds(self, row: Row) -> list[int]:
        """Every seed for a trained headline row, the first seed alone for the others."""
        return [self.seed + i for i in range(self.seeds)] if (row.headline and row.trained) else [self.seed]


@memoised_sentence_vectors()
def run_row(row: Row, splits: dict[str, Split], spec: RunSpec) -> dict:
    """Train (every seed of) one row, evaluate it on dev (and test) under both protocols and write every seed's
    predictions (`predictions/SPLIT/NAME-seedS.{rerank,kb}.{jsonl,pred}`); returns {"entry", "calibration", "note"}.
    Inner progress bars stay off: the grid shows one bar."""
    from ..model.calibration import Calibrator

    out = Path(spec.out)
    row_seeds = spec.row_seeds(row)
    per_split: dict[str, list[dict]] = {s: [] for s in spec.eval_splits}
    versions: list[str] = []
    calibration = None
    try:
        for s in row_seeds:
            if row.kind == "bm25":
                train_sys = BM25System(splits["train"])
                fit = P.rerank(splits["train"].dataset, train_sys.score, progress=False)
                cal = Calibrator.fit(np.array([p.raw_score for p in fit.predictions]), np.array([p.label for p in fit.predictions]))
                systems = {name: BM25System(splits[name], cal) for name in spec.eval_splits}
            elif row.kind == "encoder":
                encoder = _train_encoder(row, splits["train"], splits["dev"], s, out)
                versions.append(encoder.version)
                fit = P.rerank(splits["train"].dataset, EncoderSystem(encoder, splits["train"], spec.candidates).score,
                               progress=False)
                cal = Calibrator.fit(np.array([p.raw_score for p in fit.predictions]), np.array([p.label for p in fit.predictions]))
                systems = {name: EncoderSystem(encoder, splits[name], spec.candidates, cal) for name in spec.eval_splits}
            else:
                model = _train(row, splits["train"], splits["dev"], s, out, spec.overrides, False)
                versions.append(getattr(model, "version", ""))
                systems = {name: ModelSystem(model, splits[name], spec.candidates) for name in spec.eval_splits}
            for name, system in systems.items():
                m, rr, kb = _evaluate_system(system, splits[name], 10, False)
                per_split[name].append(m)
                rr.write(out / "predictions" / name, f"{slug(row.name)}-seed{s}")
                kb.write(out / "predictions" / name, f"{slug(row.name)}-seed{s}")
                if name == "dev" and s == row_seeds[0]:
                    calibration = ([p.score for p in rr.predictions], [p.label for p in rr.predictions])
    except (ImportError, NotImplementedError) as exc:
        return {"entry": None, "calibration": None, "note": f"row {row.name!r} skipped: {exc}"}
    entry = {"name": row.name, "paper_row": row.paper_row, "description": row.description, "kind": row.kind,
             "preset": row.preset, "overrides": row.overrides, "seeds": row_seeds, "model_versions": versions}
    for name in spec.eval_splits:
        entry[name], entry[f"{name}_spread"] = _mean_spread(per_split[name])
        if len(row_seeds) > 1:
            entry[f"{name}_per_seed"] = per_split[name]
    return {"entry": entry, "calibration": calibration, "note": None}


_WORKER_SPLITS: dict[str, Split] = {}


def quiet_single_thread_worker() -> None:
    """Make this worker process of a parallel run compute on one thread (torch, OpenMP, BLAS, numba) and draw no
    progress bars of its own: the parent draws one bar for the run, and its workers share the CPUs."""
    import os

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS", "TQDM_DISABLE",
                "HF_HUB_DISABLE_PROGRESS_BARS"):
        os.environ[var] = "1"
    import torch

    torch.set_num_threads(1)


def _worker_init(paths: dict[str, str]) -> None:
    """A grid worker: one thread, no inner progress bars, its own read-only copy of the splits."""
    quiet_single_thread_worker()
    _WORKER_SPLITS.update({name: _open_split(name, Path(path), None) for name, path in paths.items()})


def _worker_row(row: Row, spec: RunSpec) -> dict:
    return run_row(row, _WORKER_SPLITS, spec)


def default_jobs() -> int:
    """The default --jobs: the number of cores this process may use."""
    return usable_cpus()


@memoised_sentence_vectors()
def run_rows(rows: Sequence[Row], splits: dict[str, Split], spec: RunSpec, jobs: int = 1,
             progress: bool = True) -> list[dict]:
    """Run `rows` (in `jobs` processes), one progress bar of rows done; results in the order of `rows`.

    Every row up to the first model row runs here first: that row trains word2vec once and caches it
    (out/cache/word2vec.txt) for every later row, so a parallel run reads the same word vectors as a serial one
    and gives the same figures.
    """
    rows = list(rows)
    if jobs < 1:
        raise InputError("--jobs must be at least 1")
    results: list[dict | None] = [None] * len(rows)
    first_model = next((i for i, r in enumerate(rows) if r.kind == "model"), -1)  # none: no word2vec to cache
    with tqdm(total=len(rows), desc="grid", unit="row", disable=not progress) as bar:
        serial_upto = len(rows) if jobs == 1 else first_model + 1
        for i in range(min(serial_upto, len(rows))):
            results[i] = run_row(rows[i], splits, spec)
            bar.update(1)
        rest = list(range(serial_upto, len(rows)))
        if rest:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor, as_completed

            with ProcessPoolExecutor(max_workers=min(jobs, len(rest)), mp_context=mp.get_context("spawn"),
                                     initializer=_worker_init, initargs=(spec.paths,)) as pool:
                futures = {pool.submit(_worker_row, rows[i], spec): i for i in rest}
                for future in as_completed(futures):
                    results[futures[future]] = future.result()
                    bar.update(1)
    return [r for r in results if r is not None]


def run_experiment(
    train: str | Path,
    dev: str | Path,
    out: str | Path,
    test: str | Path | None = None,
    grid: str = "table5",
    seeds: int = 3,
    seed: int = 0,
    candidates: int = default("candidates"),
    overrides: dict | None = None,
    rows: Sequence[Row] | None = None,
    command: str = "",
    progress: bool = True,
    jobs: int = 1,
) -> dict:
    """Run every row of `grid` (in `jobs` processes) and write the report into `out`; returns the results dict."""
    import torch

    torch.set_num_threads(1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    overrides = dict(overrides or {})
    rows = list(rows) if rows is not None else grid_rows(grid)
    if seeds < 1:
        raise InputError("--seeds must be at least 1")
    from ..model.siamese import SiameseConfig

    for row in rows:  # fail now, not after an hour of training, on a row that cannot be configured
        if row.kind == "model":
            SiameseConfig.preset(row.preset, **{**row.overrides, **overrides})
    paths = {"train": Path(train), "dev": Path(dev), **({"test": Path(test)} if test is not None else {})}
    splits = {name: _open_split(name, path, out) for name, path in paths.items()}
    spec = RunSpec({k: str(v) for k, v in paths.items()}, str(out), seeds, seed, candidates, overrides)

    done = run_rows(rows, splits, spec, jobs, progress)
    results_rows = [d["entry"] for d in done if d["entry"] is not None]
    notes = [d["note"] for d in done if d["note"]]
    calibration = {d["entry"]["name"]: d["calibration"] for d in done if d["entry"] is not None and d["calibration"]}

    from .report import best_row

    best = best_row(results_rows, "dev")
    keep = {r["name"] for r in results_rows if r["kind"] == "bm25"} | ({best["name"]} if best else set())
    results = {
        "name": out.name,
        "command": command or f"run_experiment(train={train!s}, dev={dev!s}, test={test!s}, grid={grid}, seeds={seeds}, seed={seed})",
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "grid": grid, "seeds": seeds, "seed": seed, "candidates": candidates, "threshold": M.YES_AND_REL,
        "overrides": overrides, "jobs": jobs,
        "data": {name: split.describe() for name, split in splits.items()},
        "versions": _versions(),
        "rows": results_rows,
        "notes": notes,
    }
    write_report(results, out, {k: v for k, v in calibration.items() if k in keep})
    for split in splits.values():
        split.store.close()
    return results


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for pkg in ("ticketrec", "torch", "numpy", "scipy", "scikit-learn", "gensim", "sentence-transformers"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    return out

