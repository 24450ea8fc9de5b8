"""Cross-validated weight selection: figures measured on queries that nobody tuned on.

`ticketrec evaluate --train A --dev B --cv K` pools A and B, splits the labelled queries into K seeded folds
(`query_folds`) and, for each fold, trains and selects on the other folds and measures on the held-out one:

- the other folds are split again by query (`training.split_queries`, a 1/(K−1) share): the network trains on the
  rest with early stopping on that share, and the channel/pair/BM25 weights are then selected on it;
- **selection rule** (`select_simplest`): every combination of the config's weight grid is scored by rerank MAP on
  the selection queries; among the combinations whose MAP is within one standard error of the best (the standard
  error of the best combination's mean AP over the selection queries; or within a fixed `margin` of MAP points),
  the simplest wins: fewest non-zero channels (BM25 counts as a channel), then the channel weights closest to
  uniform (least squared distance of the normalised non-zero weights from 1/m), then the pair weights closest to
  uniform, then the higher MAP. `select="argmax"` is the plain best-MAP rule of the single dev split, for comparison;
- the held-out fold is its own knowledge base (its queries, their labelled tickets): both protocols run there as
  on a dev split, the KB one with a smaller knowledge base than the whole dev file;
- **the product's default recipe** (`ticketrec train`, kind "mined") is cross-validated the same way: trained on the
  other folds' tickets (pairs mined from them, S adapted to them, weights selected on their mined held-out slice),
  with the other folds' labelled pairs added as `ticketrec train --train` adds them, or without them (labels
  dropped: what a help desk without labels gets); the held-out fold's tickets and queries never reach it.

Every query is measured exactly once, by the model of the fold that held it out; the headline figures are means
over all queries, with the fold-to-fold spread, and paired-bootstrap 95 % intervals (queries resampled) of the
difference against BM25 and against the zero-shot S channel.
"""
from __future__ import annotations

import copy
from dataclasses import replace as _dc_replace
import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tqdm import tqdm

from ..data.store import Dataset
from ..errors import InputError
from ..model.encoder_base import memoised_sentence_vectors
from . import metrics as M
from . import protocols as P
from .experiments import (BM25System, ModelSystem, Split, _evaluate_system, _export_word_vectors, _versions,
                          fingerprint, quiet_single_thread_worker, slug)
from .report import BM25_NAME, ZERO_SHOT_NAME

#: The headline figures of a CV report: (key in the row metrics, key of metrics.per_query_values, protocol).
HEADLINE = [("official_map", "official_map", "rerank"), ("official_mrr", "official_mrr", "rerank"),
            ("official_p@1", "official_p@1", "rerank"), ("kb_map@10", "map@10", "kb"), ("kb_acc@10", "acc@10", "kb")]


@dataclass
class CvConfig:
    """One configuration of the CV comparison: BM25, a model preset, or a trained preset with a selection rule."""

    name: str
    description: str
    kind: str = "model"  # "bm25" | "model" | "mined" (the label-free recipe of `ticketrec train`)
    preset: str = ""
    overrides: dict = field(default_factory=dict)
    select: str = ""  # "" (the preset's own weights) | "simplest" | "argmax"
    trained: bool = False  # a baseline is not; the verdict is about trained configurations
    shares_model_with: str = ""  # reuse the model of this config in the same fold (another selection rule)
    labels: bool = False  # kind "mined": add the training folds' labelled pairs to the mined ones
    key: str = ""  # the short name `--cv-rows` selects it by


#: The CV rows of the product's default recipe (`ticketrec train`): with the training folds' labelled pairs, and without.
DEFAULT_WITH_LABELS = "default recipe: mined + labelled pairs"
DEFAULT_LABELS_DROPPED = "default recipe, labels dropped"


def default_configs() -> list[CvConfig]:
    """BM25, the zero-shot S channel, the labelled configuration (h/E/T/S + BM25, wide grid) with the
    simplicity-prior rule and with the plain argmax rule (the same trained model per fold), and the product's
    default recipe (`ticketrec train`: mined pairs, S adapted) with the labelled pairs added and without them."""
    return [
        CvConfig(BM25_NAME, "BM25 over SUB+DESC+SOL (the pre-filter alone)", kind="bm25", key="bm25"),
        CvConfig(ZERO_SHOT_NAME, "pretrained all-MiniLM-L6-v2 on SUB+DESC, Manhattan metric, no training",
                 preset="e_merged", overrides={"channels": {"S": 1.0}, "merged_query": ["SUB", "DESC"],
                                               "merged_ticket": ["SUB", "DESC"]}, key="s-zero-shot"),
        CvConfig("h/E/T/S + BM25, simplest within 1 SE", "product config, wide grid, simplicity-prior selection",
                 preset="default_s", select="simplest", trained=True, key="labelled-simplest"),
        CvConfig("h/E/T/S + BM25, argmax", "product config, wide grid, best-MAP selection (as the dev grid does)",
                 preset="default_s", select="argmax", trained=True, shares_model_with="h/E/T/S + BM25, simplest within 1 SE",
                 key="labelled-argmax"),
        CvConfig(DEFAULT_WITH_LABELS, "`ticketrec train --train`: pairs mined from the training folds' tickets plus "
                 "their labelled pairs, S adapted, weights selected on the mined held-out slice",
                 kind="mined", labels=True, trained=True, key="default"),
        CvConfig(DEFAULT_LABELS_DROPPED, "`ticketrec train` without labels: the same recipe on the training folds' "
                 "tickets alone", kind="mined", trained=True, key="default-no-labels"),
    ]


def chosen_configs(keys: Sequence[str] | None) -> list[CvConfig]:
    """The default configurations whose `key` is in `keys` (all of them for None or empty), in the report's order;
    an unknown key is an error that lists the known ones."""
    configs = default_configs()
    if not keys:
        return configs
    known = [c.key for c in configs]
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise InputError(f"unknown --cv-rows {', '.join(unknown)}; use some of {', '.join(known)} (comma-separated)")
    return [c for c in configs if c.key in set(keys)]


# -- data ------------------------------------------------------------------------------------------------------------
def pool_datasets(named: Sequence[tuple[str, Dataset]]) -> Dataset:
    """One data set of all tickets, queries and pairs; when ids collide across the inputs, every id is prefixed
    with its input's name ("train:123") so nothing is silently merged."""
    seen_t: set[str] = set()
    seen_q: set[str] = set()
    clash = False
    for _, d in named:
        ts, qs = {t.id for t in d.tickets}, {q.id for q in d.queries}
        clash = clash or bool(ts & seen_t) or bool(qs & seen_q)
        seen_t |= ts
        seen_q |= qs
    out = Dataset(source=" + ".join(d.source or name for name, d in named))
    for name, d in named:
        pre = f"{name}:" if clash else ""
        out.tickets += [_dc_replace(t, id=pre + t.id) for t in d.tickets] if pre else list(d.tickets)
        out.queries += [_dc_replace(q, id=pre + q.id) for q in d.queries] if pre else list(d.queries)
        out.pairs += [_dc_replace(p, query_id=pre + p.query_id, ticket_id=pre + p.ticket_id) for p in d.pairs] if pre \
            else list(d.pairs)
    return out


def query_folds(query_ids: Sequence[str], k: int, seed: int = 0) -> list[list[str]]:
    """K disjoint folds of the distinct query ids, covering them all (seeded permutation, sizes differ by ≤ 1)."""
    ids = sorted(set(query_ids))
    if k < 2:
        raise InputError("--cv needs at least 2 folds")
    if k > len(ids):
        raise InputError(f"--cv {k} asks for more folds than the {len(ids)} labelled queries; use --cv {len(ids)} or fewer")
    order = np.random.default_rng(seed).permutation(len(ids))
    return [sorted(ids[i] for i in part) for part in np.array_split(order, k)]


def subset(data: Dataset, query_ids: Sequence[str], name: str) -> Dataset:
    """The given queries, their labelled pairs and the tickets those pairs name (a fold's own knowledge base)."""
    keep = set(query_ids)
    pairs = [p for p in data.pairs if p.query_id in keep]
    tickets = {p.ticket_id for p in pairs}
    return Dataset([t for t in data.tickets if t.id in tickets], [q for q in data.queries if q.id in keep], pairs,
                   f"{data.source} ({name})")


def fold_split(pooled: Dataset, held_out: Sequence[str], fold: int) -> tuple[Dataset, Split]:
    """(the other folds' queries, pairs and tickets; fold `fold`'s as an evaluation split): what a fold trains and
    selects on, and what it is measured on."""
    others = sorted({p.query_id for p in pooled.pairs} - set(held_out))
    return (subset(pooled, others, f"fold {fold} training"),
            _memory_split(f"fold{fold}", subset(pooled, held_out, f"fold {fold}")))


def headline_per_query(rr: P.ProtocolResult, kb: P.ProtocolResult) -> dict[str, dict[str, float]]:
    """Each headline figure's per-query values (`HEADLINE`) of one system's rerank and knowledge-base results."""
    per_query = {"rerank": M.per_query_values(rr.run(), rr.qrels), "kb": M.per_query_values(kb.run(), kb.qrels)}
    return {key: {q: per_query[proto][q][pq] for q in per_query[proto]} for key, pq, proto in HEADLINE}


def _memory_split(name: str, data: Dataset) -> Split:
    from ..lexical.searchers import MemorySearcher

    return Split(name, Path(name), data, None, MemorySearcher(data.tickets))


# -- the selection rule ----------------------------------------------------------------------------------------------
def _uniformity(values: Sequence[float]) -> float:
    v = np.asarray([x for x in values if x > 0], dtype=np.float64)
    if v.size == 0:
        return 0.0
    v = v / v.sum()
    return float(((v - 1.0 / v.size) ** 2).sum())


def simplicity(weights: dict[str, float], channels: Sequence[str], pair_keys: Sequence[str]) -> tuple[int, float, float]:
    """(non-zero channels, distance of the channel weights from uniform, distance of the pair weights from uniform):
    smaller is simpler. `channels` may include "bm25"."""
    ch = [float(weights[c]) for c in channels]
    return sum(1 for x in ch if x > 0), _uniformity(ch), _uniformity([float(weights[k]) for k in pair_keys])


def select_simplest(combos: Sequence[dict[str, float]], per_query: np.ndarray, channels: Sequence[str],
                    pair_keys: Sequence[str], margin: float | None = None) -> tuple[int, dict]:
    """Index of the chosen combination and how: among the combinations whose mean (over the selection queries, rows
    of `per_query` [combos, queries]) is within one standard error of the best — or within `margin` when given —
    the simplest (`simplicity`), then the higher mean, then the first."""
    from ..model.weight_selection import simplest_near_best, standard_error

    per_query = np.asarray(per_query, dtype=np.float64)
    if per_query.ndim != 2 or per_query.shape[0] != len(combos) or per_query.shape[0] == 0:
        raise InputError("select_simplest needs one row of per-query values for each of at least one combination")
    means = per_query.mean(axis=1)
    best = int(np.argmax(means))
    se = standard_error(per_query[best])
    tol = se if margin is None else float(margin)
    pick, near = simplest_near_best(means, tol, lambda i: simplicity(combos[i], channels, pair_keys))
    return pick, {"best": float(means[best]), "chosen": float(means[pick]), "tolerance": tol,
                  "standard_error": se, "eligible": int(near.size), "combinations": len(combos)}


def select_weights(model, selection: Dataset, kb: Dataset, rule: str, margin: float | None = None) -> dict:
    """Choose the weights of `model` (in place) on the selection queries from the config's grid, by `rule`
    ("simplest" or "argmax"); returns the chosen spec and how it was chosen. The calibrator is refitted on the
    selection pairs with the chosen weights (`labelled_calibrator`)."""
    from ..lexical.bm25 import Bm25Scorer
    from ..model.training import (GroupTable, PairSet, PreparedPairs, combination_scores, grid_combinations,
                                  lexical_features, pair_distances)

    config, net = model.siamese_config, model.net
    pairs = PairSet.from_dataset(selection, "selection")
    use_bm25 = bool(config.bm25 > 0 and net.use_bm25)
    scorer = Bm25Scorer(kb.tickets) if use_bm25 else None
    ratio = lexical_features(pairs, scorer) if scorer is not None else None
    prepared = PreparedPairs.of(model, pairs, ratio)
    dist = pair_distances(model, prepared.queries, prepared.tickets, pairs)  # [N, P, C]
    channels = list(net.channel_names)
    pair_keys = [f"{a}|{b}" for a, b, *_ in config.metric_pairs]
    combos = grid_combinations(channels, pair_keys, config.grid, net.metric_spec(), use_bm25)
    table = GroupTable(pairs.q, pairs.y, config.relevant_min)
    per_query = np.concatenate([table.per_query_ap(g) for g in combination_scores(  # [combinations, queries]
        dist, combos, channels, pair_keys, (1.0 - ratio) if use_bm25 else None)])
    all_channels = channels + (["bm25"] if use_bm25 else [])
    if rule == "simplest":
        pick, how = select_simplest(combos, per_query, all_channels, pair_keys, margin)
    elif rule == "argmax":
        means = per_query.mean(axis=1)
        pick = int(np.argmax(means))
        how = {"best": float(means[pick]), "chosen": float(means[pick]), "combinations": len(combos)}
    else:
        raise InputError(f"unknown selection rule {rule!r}; use simplest or argmax")
    w = combos[pick]
    net.set_weights([w[k] for k in pair_keys], {c: w[c] for c in channels}, w.get("bm25"))
    model.invalidate()
    from ..model.training import evaluate, labelled_calibrator

    model.calibrator, calibration = labelled_calibrator(model, prepared, kb.tickets, scorer,
                                                        int(model.meta.get("seed", 0)))
    model.invalidate()
    weights = {c: float(w[c]) for c in all_channels} | {k: float(w[k]) for k in pair_keys}
    chosen = {"weights": weights, "rule": rule, **how}
    # the training report describes the model as saved: these weights, this calibrator, their selection figures
    model.meta.setdefault("training", {}).update(
        weight_selection={**chosen, "objective": "map", "value": chosen["chosen"], "spec": net.metric_spec()},
        calibration=calibration, dev={k: v for k, v in evaluate(model, prepared).items() if k != "pairs"},
        dev_source="selection queries (cross-validation: weights re-selected on them)")
    return chosen


# -- one fold --------------------------------------------------------------------------------------------------------
@dataclass
class FoldSpec:
    """What a fold needs (picklable: sent to worker processes)."""

    fold: int
    k: int
    held_out: list[str]
    seed: int
    candidates: int
    out: str
    overrides: dict
    margin: float | None
    configs: list[CvConfig]


@memoised_sentence_vectors()
def run_fold(pooled: Dataset, spec: FoldSpec) -> dict:
    """Train/select every config on the other folds and measure it on fold `spec.fold`: metrics, per-query values,
    selected weights; the predictions go to out/predictions/foldN/."""
    import torch

    from ..model.calibration import Calibrator
    from ..model.siamese import SiameseConfig
    from ..model.training import split_queries, train_model

    torch.set_num_threads(1)
    train_all, test = fold_split(pooled, spec.held_out, spec.fold)
    fit_data, sel_data = split_queries(train_all, 1.0 / (spec.k - 1), spec.seed + spec.fold)
    train_split = _memory_split("train", train_all)
    out = Path(spec.out)
    cache = out / "cache" / f"fold{spec.fold}-word2vec.txt"
    models: dict[str, Any] = {}
    rows: dict[str, dict] = {}
    for cfg in spec.configs:
        selection = None
        if cfg.kind == "bm25":
            fit = P.rerank(train_all, BM25System(train_split).score, progress=False)
            cal = Calibrator.fit(np.array([p.raw_score for p in fit.predictions]), np.array([p.label for p in fit.predictions]))
            system = BM25System(test, cal)
        elif cfg.kind == "mined":
            model, selection = train_mined(train_all, cfg, spec.overrides, spec.seed,
                                           out / "models" / f"fold{spec.fold}-{slug(cfg.name)}")
            system = ModelSystem(model, test, spec.candidates)
        else:
            if cfg.shares_model_with and cfg.shares_model_with in models:
                model = copy.deepcopy(models[cfg.shares_model_with])
            else:
                config = SiameseConfig.preset(cfg.preset, **{**cfg.overrides, **spec.overrides,
                                                             **({"weights": "fixed"} if cfg.select else {})})
                kwargs = {"word_vectors": cache} if cache.exists() else {}
                model = train_model(fit_data, sel_data, config, out / "models" / f"fold{spec.fold}-{slug(cfg.name)}",
                                    seed=spec.seed, progress=False, **kwargs)
                if not cache.exists() and not config.fine_tune_words:
                    _export_word_vectors(model, cache)
                models[cfg.name] = copy.deepcopy(model)
            if cfg.select:
                selection = select_weights(model, sel_data, train_all, cfg.select, spec.margin)
                # the fold's model as it is evaluated: its selected weights and refitted calibrator, not training's
                model.save(out / "models" / f"fold{spec.fold}-{slug(cfg.name)}")
            system = ModelSystem(model, test, spec.candidates)
        metrics, rr, kb = _evaluate_system(system, test, 10, False)
        rr.write(out / "predictions" / f"fold{spec.fold}", slug(cfg.name))
        kb.write(out / "predictions" / f"fold{spec.fold}", slug(cfg.name))
        rows[cfg.name] = {"metrics": metrics, "selection": selection, "per_query": headline_per_query(rr, kb)}
    return {"fold": spec.fold, "queries": len(spec.held_out), "tickets": len(test.dataset.tickets),
            "train_queries": len(fit_data.queries), "selection_queries": len(sel_data.queries), "rows": rows}


def train_mined(train_all: Dataset, cfg: CvConfig, overrides: dict, seed: int, out_dir: Path) -> tuple[Any, dict]:
    """The label-free recipe of `ticketrec train` (`label_free_config` with `cfg.overrides` and the run's
    `overrides`) on the training folds' tickets, their labelled pairs added when `cfg.labels`; saved to `out_dir`.
    (the model, its selection as the labelled rows record theirs: the weights the mined held-out slice chose)."""
    from ..model.unsupervised import label_free_config, train_without_labels

    config = label_free_config(**{**cfg.overrides, **overrides})
    model = train_without_labels(train_all.tickets, config, out_dir, seed=seed,
                                 labelled=train_all if cfg.labels else None, progress=False)
    spec = model.metric_spec()
    weights = dict(spec["channels"]) | ({"bm25": spec["bm25"]} if model.net.use_bm25 else {}) \
        | {f"{a}|{b}": v for a, b, v in spec["pairs"]}
    return model, {"weights": weights, "rule": "mined held-out slice"}


_WORKER_POOLED: list[Dataset] = []


def _worker_init(pooled: Dataset) -> None:
    """A fold worker: one thread, no inner progress bars, the pooled labelled data."""
    quiet_single_thread_worker()
    _WORKER_POOLED[:] = [pooled]


def _worker_fold(spec: FoldSpec) -> dict:
    return run_fold(_WORKER_POOLED[0], spec)


# -- the run ---------------------------------------------------------------------------------------------------------
def summarise(folds: Sequence[dict], configs: Sequence[CvConfig], n_boot: int = 2000, seed: int = 0) -> list[dict]:
    """Per config: CV estimate (mean over all queries), fold min/max/std of every headline figure, the spread of
    each selected weight, and paired-bootstrap differences against BM25 and the zero-shot S channel."""
    rows = []
    qids = sorted(q for f in folds for q in f["rows"][configs[0].name]["per_query"]["official_map"])

    def values(name: str, key: str) -> np.ndarray:
        merged = {q: v for f in folds for q, v in f["rows"][name]["per_query"][key].items()}
        return np.array([merged[q] for q in qids])

    for cfg in configs:
        row: dict[str, Any] = {"name": cfg.name, "description": cfg.description, "trained": cfg.trained,
                               "kind": cfg.kind, "labels": cfg.labels, "select": cfg.select, "cv": {}, "folds": {},
                               "weights": {}, "vs": {}}
        for key, _, _ in HEADLINE:
            per_fold = [f["rows"][cfg.name]["metrics"][key] for f in folds]
            row["cv"][key] = float(values(cfg.name, key).mean())
            row["folds"][key] = {"values": per_fold, "min": float(min(per_fold)), "max": float(max(per_fold)),
                                 "std": float(np.std(per_fold, ddof=1)) if len(per_fold) > 1 else 0.0}
        selections = [f["rows"][cfg.name]["selection"] for f in folds]
        if all(selections):
            for w in selections[0]["weights"]:
                xs = [s["weights"][w] for s in selections]
                row["weights"][w] = {"values": xs, "min": min(xs), "max": max(xs)}
        for base in (BM25_NAME, ZERO_SHOT_NAME):
            if base == cfg.name or not any(c.name == base for c in configs):
                continue
            row["vs"][base] = {key: M.paired_bootstrap_difference(values(cfg.name, key), values(base, key), n_boot, seed)
                               for key, _, _ in HEADLINE}
        rows.append(row)
    return rows


def verdict(rows: Sequence[dict]) -> dict:
    """Which trained configuration wins CV (rerank MAP) and whether it beats BM25 and the zero-shot S channel:
    beating means the 95 % interval of the difference lies above 0 on rerank MAP and on KB MAP@10. Without both
    baselines' rows there is no default to name (None)."""
    trained = [r for r in rows if r["trained"]]
    if not trained:
        return {"winner": None, "beats": {}, "default": None}
    win = max(trained, key=lambda r: r["cv"]["official_map"])
    beats = {base: all(win["vs"].get(base, {}).get(k, {}).get("low", -1.0) > 0 for k in ("official_map", "kb_map@10"))
             for base in (BM25_NAME, ZERO_SHOT_NAME) if base in win["vs"]}
    if len(beats) < 2:  # a baseline's row was not run (`--cv-rows`): no verdict on the default
        return {"winner": win["name"], "beats": beats, "default": None}
    baselines = [r for r in rows if not r["trained"]]
    best_base = max(baselines, key=lambda r: r["cv"]["official_map"])
    default = win["name"] if all(beats.values()) else best_base["name"]
    return {"winner": win["name"], "beats": beats, "default": default}


def run_cv(
    train: str | Path,
    dev: str | Path,
    out: str | Path,
    k: int = 5,
    seed: int = 0,
    candidates: int = 1000,
    configs: Sequence[CvConfig] | None = None,
    overrides: dict | None = None,
    margin: float | None = None,
    jobs: int = 1,
    n_boot: int = 2000,
    command: str = "",
    progress: bool = True,
) -> dict:
    """Pool `train` and `dev`, run K-fold cross-validation of `configs` (folds in `jobs` processes) and write
    report.md, results.json into `out`; returns the results dict."""
    from ..data.importers import load

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if jobs < 1:
        raise InputError("--jobs must be at least 1")
    configs = list(configs) if configs is not None else default_configs()
    named = []
    for name, path in (("train", Path(train)), ("dev", Path(dev))):
        if not path.is_file():
            raise InputError(f"--{name} file {path} does not exist; give the path of a JSONL, CSV or SemEval XML data set")
        named.append((name, load(path)))
    pooled = pool_datasets(named)
    folds = query_folds([p.query_id for p in pooled.pairs], k, seed)
    specs = [FoldSpec(i, k, ids, seed, candidates, str(out), dict(overrides or {}), margin, configs)
             for i, ids in enumerate(folds)]
    done: list[dict] = []
    with tqdm(total=k, desc="cv folds", unit="fold", disable=not progress) as bar:
        if jobs == 1:
            for s in specs:
                done.append(run_fold(pooled, s))
                bar.update(1)
        else:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor, as_completed

            with ProcessPoolExecutor(max_workers=min(jobs, k), mp_context=mp.get_context("spawn"),
                                     initializer=_worker_init, initargs=(pooled,)) as pool:
                for future in as_completed([pool.submit(_worker_fold, s) for s in specs]):
                    done.append(future.result())
                    bar.update(1)
    done.sort(key=lambda f: f["fold"])
    rows = summarise(done, configs, n_boot, seed)
    results = {
        "name": out.name, "command": command or f"run_cv(train={train!s}, dev={dev!s}, k={k}, seed={seed})",
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "k": k, "seed": seed, "candidates": candidates, "margin": margin, "bootstrap": n_boot, "jobs": jobs,
        "threshold": M.YES_AND_REL, "overrides": dict(overrides or {}),
        "data": {name: {"path": str(p), "sha256": fingerprint(p), "tickets": len(d.tickets), "queries": len(d.queries),
                        "pairs": len(d.pairs)} for (name, d), p in zip(named, (Path(train), Path(dev)))},
        "folds": [{key: f[key] for key in ("fold", "queries", "tickets", "train_queries", "selection_queries")}
                  for f in done],
        "rows": rows, "verdict": verdict(rows), "versions": _versions(),
    }
    from .report import write_cv_report

    write_cv_report(results, out)
    return results
