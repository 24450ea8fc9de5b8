"""Would the default recipe rank better if its channel weights were re-selected on the labelled pairs? (issue 12)

`ticketrec evaluate --cv K --out DIR` keeps each fold's models in DIR/models. The default recipe's two rows (mined +
labelled pairs; labels dropped) select their weights on the mined held-out slice. This re-selects the channel and
BM25 weights of each fold's saved model on the training folds' labelled queries, as the mining option
`select_on_labelled` does at the end of training (`weight_selection.select_on_labelled`, the pair weights kept), scores
the held-out fold as the cross-validation does, and prints the cross-validated figures with paired-bootstrap intervals
against the row as saved and against the zero-shot S channel (whose saved fold models are scored again too). A run
with `--cv-rows` needs the zero-shot row and at least one of the two; the other is left out.

    .venv/bin/python benchmarks/cv_label_selection.py --cv-dir reports/semeval-cv [--jobs 2]

Each saved row is scored first as it was: its per-fold rerank MAP must be the one in DIR/results.json, or the run
stops (the models or the data are not the run's). About 2 minutes a fold on one core.
"""
from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: The rows re-selected, and the baseline each is compared with.
ROWS = ("default recipe: mined + labelled pairs", "default recipe, labels dropped")
ZERO_SHOT = "S zero-shot (MiniLM)"
#: The figures the table shows (keys of the cross-validation's headline figures).
SHOWN = ("official_map", "kb_map@10")


def _resolve(path: str, cv_dir: Path) -> Path:
    """A data path of results.json, as the run's command gave it (relative to where it ran: the repository root)."""
    p = Path(path)
    return p if p.is_absolute() else (ROOT / p if (ROOT / p).exists() else cv_dir / p)


def _to_grid_scale(model, model_dir: Path) -> None:
    """Divide the saved model's pair and BM25 weights by the factor the calibration's unit scaling gave them, back to
    the grid's scale where training selects (the ranking is the same: every term of d scales alike), so that the
    labelled selection weighs BM25 against the channels as it does at the end of training."""
    selected = json.loads((model_dir / "config.json").read_text())["training"]["weight_selection"]["spec"]
    served = model.metric_spec()
    factor = next(s / g for (_, _, s), (_, _, g) in zip(served["pairs"], selected["pairs"]) if s > 0 and g > 0)
    model.net.set_weights([v / factor for *_, v in served["pairs"]], served["channels"], served["bm25"] / factor)
    model.invalidate()


def run_fold(cv_dir: str, fold: int) -> dict:
    """Score fold `fold`'s saved models of `ROWS` and the zero-shot row as saved, and `ROWS` re-selected on the
    labelled queries of the other folds: {row: {"metrics", "per_query", "weights"}}."""
    import torch

    from recommender.data.importers import load
    from recommender.evaluation import crossval as CV
    from recommender.evaluation.experiments import ModelSystem, _evaluate_system, slug
    from recommender.lexical.bm25 import Bm25Scorer
    from recommender.model.bundle import TicketModel
    from recommender.model.training import PairSet, PreparedPairs, lexical_features
    from recommender.model.weight_selection import select_on_labelled

    torch.set_num_threads(1)
    cv_dir = Path(cv_dir)
    results = json.loads((cv_dir / "results.json").read_text())
    pooled = CV.pool_datasets([(name, load(_resolve(results["data"][name]["path"], cv_dir), progress=False))
                               for name in ("train", "dev")])
    folds = CV.query_folds([p.query_id for p in pooled.pairs], results["k"], results["seed"])
    train_all, test = CV.fold_split(pooled, folds[fold], fold)

    def scored(model) -> dict:
        metrics, rr, kb = _evaluate_system(ModelSystem(model, test, results["candidates"]), test, 10, False)
        spec = model.metric_spec()
        return {"metrics": {key: metrics[key] for key in SHOWN}, "per_query": CV.headline_per_query(rr, kb),
                "weights": {c: w for c, w in spec["channels"].items() if w} | ({"bm25": spec["bm25"]}
                                                                              if spec["bm25"] else {})}

    saved = {r["name"]: r["folds"]["official_map"]["values"][fold] for r in results["rows"]}
    out = {}
    for name in (ZERO_SHOT,) + tuple(r for r in ROWS if r in saved):
        model = TicketModel.load(cv_dir / "models" / f"fold{fold}-{slug(name)}")
        out[name] = scored(model)
        if abs(out[name]["metrics"]["official_map"] - saved[name]) > 1e-6:
            raise SystemExit(f"fold {fold}, {name}: rerank MAP {out[name]['metrics']['official_map']:.4f}, the run "
                             f"recorded {saved[name]:.4f}: these are not the models or the data of {cv_dir}")
        if name == ZERO_SHOT:
            continue
        _to_grid_scale(model, cv_dir / "models" / f"fold{fold}-{slug(name)}")
        pairs = PairSet.from_dataset(train_all, "labelled")
        lexical = lexical_features(pairs, Bm25Scorer(train_all.tickets)) if model.net.use_bm25 else None
        report = select_on_labelled(model, PreparedPairs.of(model, pairs, lexical, False),
                                    model.siamese_config.relevant_min)
        out[name + ", re-selected on the labels"] = dict(scored(model), report={
            k: report.get(k) for k in ("queries", "applied", "before", "value", "best", "stderr")})
    return out


def table(folds: list[dict], n_boot: int = 2000, seed: int = 0) -> str:
    """The cross-validated figures of every row over all folds' queries, with paired-bootstrap intervals."""
    from recommender.evaluation.metrics import paired_bootstrap_difference

    def values(name: str, key: str) -> np.ndarray:
        merged = {q: v for f in folds for q, v in f[name]["per_query"][key].items()}
        return np.array([merged[q] for q in sorted(merged)])

    def interval(a: str, b: str, key: str) -> str:
        d = paired_bootstrap_difference(values(a, key), values(b, key), n_boot, seed)
        return f"{d['diff']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}]" if key == "official_map" else \
            f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"

    lines = ["| row (CV) | rerank MAP | KB MAP@10 | Δ MAP vs the row as saved | Δ MAP vs S zero-shot | "
             "Δ KB MAP@10 vs S zero-shot | weights per fold |", "|---|---|---|---|---|---|---|"]
    for name in folds[0]:
        base = next((r for r in ROWS if name.startswith(r) and name != r), None)
        weights = "; ".join(", ".join(f"{c} {w:.3g}" for c, w in f[name]["weights"].items()) for f in folds)
        lines.append(f"| {name} | {values(name, 'official_map').mean():.2f} | {values(name, 'kb_map@10').mean():.3f} | "
                     f"{interval(name, base, 'official_map') if base else '–'} | "
                     + (f"{interval(name, ZERO_SHOT, 'official_map')} | {interval(name, ZERO_SHOT, 'kb_map@10')}"
                        if name != ZERO_SHOT else "– | –") + f" | {weights} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cv-dir", required=True, help="the --out of `ticketrec evaluate --cv K`, with its models/")
    ap.add_argument("--jobs", type=int, default=2, help="folds scored at once (processes)")
    args = ap.parse_args()
    cv_dir = Path(args.cv_dir)
    if not (cv_dir / "results.json").is_file() or not (cv_dir / "models").is_dir():
        sys.exit(f"{cv_dir} is not the output of `ticketrec evaluate --cv K --out DIR` (results.json and models/)")
    results = json.loads((cv_dir / "results.json").read_text())
    names = {r["name"] for r in results["rows"]}
    if ZERO_SHOT not in names or not names & set(ROWS):
        sys.exit(f"{cv_dir} lacks the rows this needs: the zero-shot S row and a default-recipe row "
                 "(`--cv-rows s-zero-shot,default-no-labels` at least)")
    k = results["k"]
    import multiprocessing as mp

    with ProcessPoolExecutor(max(1, args.jobs), mp_context=mp.get_context("spawn")) as pool:
        folds = list(pool.map(run_fold, [str(cv_dir)] * k, range(k)))
    print(f".venv/bin/python benchmarks/cv_label_selection.py --cv-dir {args.cv_dir} --jobs {args.jobs}\n")
    print(table(folds))
    for i, f in enumerate(folds):
        for name, row in f.items():
            r = row.get("report")
            if r and not r["applied"]:
                print(f"fold {i}, {name}: not re-selected, {r['queries']} labelled queries")
            elif r:
                print(f"fold {i}, {name}: {r['queries']} labelled queries; their MAP {r['before']:.2f} with the "
                      f"mined slice's weights, {r['value']:.2f} re-selected (best {r['best']:.2f}, standard error "
                      f"{r['stderr']:.2f})")


if __name__ == "__main__":
    main()
