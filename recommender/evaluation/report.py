"""Render an experiment's results: report.md (the Table 5 analogue), results.csv, results.json and PNG plots."""
from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path
from typing import Any, Sequence

from ..files import atomic_write_bytes, atomic_write_text

#: The cross-validation's baseline rows, which its verdict and Δ tables compare every configuration against
#: (`crossval` names its rows with them; they live here, where nothing of evaluation is imported).
BM25_NAME = "BM25"
ZERO_SHOT_NAME = "S zero-shot (MiniLM)"

#: (key in a row's metrics, column header, format) — the columns of the Table 5 analogue.
COLUMNS = [
    ("pearson", "r", "{:.3f}"), ("spearman", "ρ", "{:.3f}"), ("mse", "MSE", "{:.3f}"),
    ("map@1", "MAP@1", "{:.3f}"), ("map@5", "MAP@5", "{:.3f}"), ("map@10", "MAP@10", "{:.3f}"),
    ("mrr@1", "MRR@1", "{:.3f}"), ("mrr@5", "MRR@5", "{:.3f}"), ("mrr@10", "MRR@10", "{:.3f}"),
    ("acc@1", "Acc@1", "{:.3f}"), ("acc@5", "Acc@5", "{:.3f}"), ("acc@10", "Acc@10", "{:.3f}"),
    ("official_map", "off. MAP", "{:.2f}"), ("official_mrr", "off. MRR", "{:.2f}"), ("official_p@1", "off. P@1", "{:.2f}"),
    ("kb_map@10", "KB MAP@10", "{:.3f}"), ("kb_acc@10", "KB Acc@10", "{:.3f}"),
]
#: The metric that picks the best row (bold).
BEST_BY = "official_map"
#: First characters that make a spreadsheet read a cell as a formula (OWASP "CSV injection"), fullwidth forms too.
_FORMULA_START = tuple("=+-@\t\r\uff1d\uff0b\uff0d\uff20")
_PLAIN_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def csv_cell(value: Any) -> Any:
    """`value` as a CSV cell that a spreadsheet shows rather than runs: text starting like a formula (=, +, -, @,
    tab, carriage return) gets a leading single quote; numbers, and text that is only a number, are unchanged."""
    if isinstance(value, str) and value.startswith(_FORMULA_START) and not _PLAIN_NUMBER.fullmatch(value):
        return "'" + value
    return value


def _fmt(value: Any, spread: Any, pattern: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = pattern.format(value)
    if spread is not None and not (isinstance(spread, float) and math.isnan(spread)):
        text += " ± " + pattern.format(spread)
    return text


def best_row(rows: Sequence[dict], split: str = "dev", by: str = BEST_BY) -> dict | None:
    """The row with the highest `by` metric on `split` (None when no row has it)."""
    scored = [r for r in rows if isinstance(r.get(split, {}).get(by), (int, float)) and not math.isnan(r[split][by])]
    return max(scored, key=lambda r: r[split][by]) if scored else None


def markdown_table(rows: Sequence[dict], split: str) -> str:
    """The Table 5 analogue for one split; the best row (by official MAP) in bold; ± = spread over seeds."""
    best = best_row(rows, split)
    head = ["#", "paper", "model"] + [h for _, h, _ in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, r in enumerate(rows, 1):
        values = r.get(split, {})
        spread = r.get(f"{split}_spread", {})
        cells = [str(i), r.get("paper_row", "") or "–", r["name"]] + [
            _fmt(values.get(k), spread.get(k), f) for k, _, f in COLUMNS
        ]
        if best is not None and r is best:
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def results_csv(results: dict) -> str:
    """One line per (row, split) with every metric and its spread."""
    keys = sorted({k for r in results["rows"] for s in ("dev", "test") for k in r.get(s, {})})
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["row", "paper_row", "split", "seeds"] + keys + [f"{k}_spread" for k in keys])
    for r in results["rows"]:
        for split in ("dev", "test"):
            if split not in r:
                continue
            spread = r.get(f"{split}_spread", {})
            w.writerow([csv_cell(v) for v in [r["name"], r.get("paper_row", ""), split, len(r.get("seeds", []))]
                        + [r[split].get(k, "") for k in keys] + [spread.get(k, "") for k in keys]])
    return out.getvalue()


#: The headline figures of per-seed and cross-validation tables: (key, header, format).
HEADLINE = [("official_map", "MAP", "{:.2f}"), ("official_mrr", "MRR", "{:.2f}"), ("official_p@1", "P@1", "{:.2f}"),
            ("kb_map@10", "KB MAP@10", "{:.3f}"), ("kb_acc@10", "KB Acc@10", "{:.3f}")]


def per_seed_tables(rows: Sequence[dict]) -> list[str]:
    """Report lines: the headline figures of every seed of the rows that ran with several."""
    parts: list[str] = []
    for split in ("dev", "test"):
        multi = [r for r in rows if r.get(f"{split}_per_seed")]
        if not multi:
            continue
        parts += [f"## Per-seed figures on {split}", "", "| model | seed | " + " | ".join(h for _, h, _ in HEADLINE) + " |",
                  "|---|---|" + "---|" * len(HEADLINE)]
        for r in multi:
            for s, m in zip(r["seeds"], r[f"{split}_per_seed"]):
                parts.append(f"| {r['name']} | {s} | " + " | ".join(_fmt(m.get(k), None, f) for k, _, f in HEADLINE) + " |")
        parts.append("")
    return parts


#: What the grids smaller than table5 hold (said in their report's header).
SMALLER_GRIDS = {
    "core": "the key rows of the Table 5 grid (BM25, the best topic and embedding rows, S zero-shot, the paper's "
            "model with fixed and grid weights, and the rows with the S channel)",
    "quick": "BM25, the unsupervised multi-level E row and the paper's model with its Table 2 weights",
}


def render_markdown(results: dict, plots: Sequence[str]) -> str:
    """The whole report.md text."""
    rows = results["rows"]
    parts = [f"# Evaluation report: {results.get('name', '')}", ""]
    parts += [f"Produced {results['date']} by:", "", "```", results["command"], "```", ""]
    if results.get("grid") in SMALLER_GRIDS:
        parts += [f"**A smaller grid than table5**: `--grid {results['grid']}` runs only "
                  f"{SMALLER_GRIDS[results['grid']]}; the other table5 rows are not in this report.", ""]
    parts += ["## Data", "", "| split | file | sha256 (first 16) | tickets | queries | labelled pairs |", "|---|---|---|---|---|---|"]
    for split, d in results["data"].items():
        parts.append(f"| {split} | `{d['path']}` | `{d['sha256'][:16]}` | {d['tickets']} | {d['queries']} | {d['pairs']} |")
    parts += ["", "## Protocols and metrics", "",
              "- **rerank** (SemEval subtask B): each query ranks its own labelled tickets. r, ρ, MSE compare the "
              "calibrated 1–5 score with the gold label; MAP@k (AP divides by all relevant R), MRR@k, Acc@k "
              "(share of queries with ≥ 1 relevant in the top k) are fractions; *off.* columns follow the official "
              "SemEval-2016 scorer (AP over the top 10 divided by the relevant retrieved, all queries, ×100).",
              "- **KB** (the paper's protocol): every ticket of the split is in the knowledge base; each query retrieves "
              f"its top 10 through the BM25 pre-filter (K = {results.get('candidates', '?')}) and the model; unlabelled "
              "tickets count as not relevant.",
              f"- Relevant = label ≥ {results.get('threshold', 3)} (YES and REL). Weights and thresholds are selected on "
              "dev only; ± is the spread (standard deviation) over seeds where a row ran with several.", ""]
    for split in ("dev", "test"):
        if any(split in r for r in rows):
            parts += [f"## Results on {split}", "", markdown_table(rows, split), ""]
    parts += per_seed_tables(rows)
    best = best_row(rows, "dev")
    if best is not None:
        parts += ["## Best row on dev", "", f"**{best['name']}** ({best.get('description', '')}): official MAP "
                  f"{best['dev'].get('official_map', float('nan')):.2f}, KB Acc@10 {best['dev'].get('kb_acc@10', float('nan')):.3f}.", ""]
        succ = {k[len('kb_success_'):]: v for k, v in best["dev"].items() if k.startswith("kb_success_")}
        if succ:
            parts += ["Success rate (the paper's Figure 4, KB protocol, top 10): " +
                      ", ".join(f"{k} {v:.2f}" for k, v in succ.items()), ""]
    parts += ["## Rows", "", "| model | paper row | what it is | seed(s) used | model versions |", "|---|---|---|---|---|"]
    for r in rows:
        versions = ", ".join(f"`{v[:12]}`" for v in r.get("model_versions", []) if v) or "–"
        parts.append(f"| {r['name']} | {r.get('paper_row', '') or '–'} | {r.get('description', '')} | "
                     f"{', '.join(map(str, r.get('seeds', []))) or '–'} | {versions} |")
    if results.get("notes"):
        parts += ["", "## Notes", ""] + [f"- {n}" for n in results["notes"]]
    parts += ["", "## Software", "", ", ".join(f"{k} {v}" for k, v in results.get("versions", {}).items()), ""]
    if plots:
        parts += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots] + [""]
    return "\n".join(parts)


def plot_all(results: dict, out: Path, calibration: dict[str, tuple[list[float], list[float]]] | None = None) -> list[Path]:
    """PNG plots: Acc@k and MAP@k per model, predicted vs gold (calibration), success-rate bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["rows"] if "dev" in r]
    written: list[Path] = []
    if rows:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        ks = [1, 5, 10]
        for r in rows:
            for ax, m in zip(axes, ("acc", "map")):
                ys = [r["dev"].get(f"{m}@{k}", float("nan")) for k in ks]
                ax.plot(ks, ys, marker="o", label=r["name"])
        for ax, title in zip(axes, ("Acc@k (rerank, dev)", "MAP@k (rerank, dev)")):
            ax.set_xticks(ks)
            ax.set_xlabel("k")
            ax.set_title(title)
            ax.grid(alpha=0.3)
        axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
        fig.tight_layout()
        written.append(_save(fig, out / "acc_map_at_k.png", plt))

    if calibration:
        fig, axes = plt.subplots(1, len(calibration), figsize=(4.5 * len(calibration), 4), squeeze=False)
        for ax, (name, (pred, gold)) in zip(axes[0], calibration.items()):
            levels = sorted(set(gold))
            ax.boxplot([[p for p, g in zip(pred, gold) if g == lv] for lv in levels], positions=levels, widths=0.8)
            ax.plot([1, 5], [1, 5], ls="--", color="grey", lw=1)
            ax.set_xlim(0, 6)
            ax.set_ylim(0.8, 5.2)
            ax.set_xlabel("gold label")
            ax.set_ylabel("calibrated score")
            ax.set_title(f"{name} (rerank, dev)", fontsize=9)
        fig.tight_layout()
        written.append(_save(fig, out / "calibration.png", plt))

    succ_rows = [r for r in rows if any(k.startswith("kb_success_") for k in r["dev"])]
    if succ_rows:
        keys = [f"kb_success_{a}>={n}" for a in ("yes", "yes+rel") for n in (1, 2, 3)]
        fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(succ_rows) + 4), 4.5))
        width = 0.8 / len(succ_rows)
        for i, r in enumerate(succ_rows):
            ax.bar([j + i * width for j in range(len(keys))], [r["dev"].get(k, 0.0) for k in keys], width, label=r["name"])
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))])
        ax.set_xticklabels([k[len("kb_success_"):] for k in keys])
        ax.set_ylabel("share of queries")
        ax.set_ylim(0, 1)
        ax.set_title("Success rate in the top 10 (KB protocol, dev)")
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
        fig.tight_layout()
        written.append(_save(fig, out / "success_rate.png", plt))
    return written


def _save(fig, path: Path, plt) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def write_report(results: dict, out: str | Path, calibration: dict[str, tuple[list[float], list[float]]] | None = None) -> dict[str, Path]:
    """Write report.md, results.csv, results.json and the plots into `out`; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plots = plot_all(results, out, calibration)
    paths = {"json": out / "results.json", "csv": out / "results.csv", "md": out / "report.md"}
    atomic_write_text(paths["json"], json.dumps(results, indent=2, default=float))
    atomic_write_text(paths["csv"], results_csv(results))
    atomic_write_text(paths["md"], render_markdown(results, [str(p) for p in plots]))
    return {**paths, **{p.stem: p for p in plots}}


# -- the duplicates protocol (`ticketrec evaluate --kb ... --duplicates ...`) ---------------------------------------
#: The metrics of a duplicates row, in table order.
DUPLICATE_METRICS = ("MRR@10", "Acc@1", "Acc@5", "Acc@10")


def duplicates_table(rows: Sequence[dict]) -> str:
    """Markdown table of duplicates rows: each metric with its 95 % bootstrap interval."""
    head = ["system", "queries"] + list(DUPLICATE_METRICS)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["system"], str(r.get("queries", ""))] + [
            f"{r[m]:.3f} [{r[m + '_low']:.3f}, {r[m + '_high']:.3f}]" for m in DUPLICATE_METRICS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_table(paired: dict[str, dict[str, dict]], metrics: Sequence[str] = DUPLICATE_METRICS,
                 patterns: dict[str, str] | None = None) -> str:
    """Markdown table of paired differences ({other system: {metric: {"diff", "low", "high"}}}, as
    `duplicates.paired_against_first` gives them): one line per other system, Δ [low, high] per metric of `metrics`,
    each formatted by its pattern in `patterns` (default "{:+.3f}")."""
    patterns = patterns or {}
    lines = ["| against | " + " | ".join(f"Δ {m}" for m in metrics) + " |", "|---|" + "---|" * len(metrics)]
    for system, by_metric in paired.items():
        lines.append(f"| {system} | " + " | ".join(_diff_cell(by_metric.get(m), patterns.get(m, "{:+.3f}"))
                                                    for m in metrics) + " |")
    return "\n".join(lines)


def render_duplicates_markdown(results: dict, plots: Sequence[str]) -> str:
    """The report.md of a duplicates run."""
    kb, links = results["data"]["kb"], results["data"]["links"]
    parts = [f"# Duplicates evaluation: {results.get('name', '')}", "",
             f"Produced {results['date']} by:", "", "```", results["command"], "```", "",
             "## Data", "", "| input | file | sha256 (first 16) | size |", "|---|---|---|---|",
             f"| knowledge base | `{kb['path']}` | `{kb['sha256'][:16]}` | {kb['tickets']} tickets |",
             f"| duplicate links | `{links['path']}` | `{links['sha256'][:16]}` | {links['links']} distinct links "
             f"with both tickets in the knowledge base → {links['queries']} queries |", ""]
    if kb.get("mapping"):
        parts += ["Column mapping: " + ", ".join(f"{k} ← `{v}`" for k, v in kb["mapping"].items()), ""]
    model = results.get("model", {})
    parts += ["## Protocol", "",
              "Each ticket of a duplicate pair is a query (its subject + description) against the whole knowledge "
              "base minus itself and must find its partner (a → b and b → a). MRR@10 is the mean of 1/rank of the "
              "partner within the top 10 (0 beyond); Acc@k is the share of queries with the partner in the top k. "
              f"[low, high] is the 95 % percentile bootstrap interval ({results.get('bootstrap', '?')} resamples of "
              f"the queries, seed {results.get('seed', '?')}, the same resamples for every system).", "",
              f"- The model (`{model.get('path', '')}`, version `{model.get('version', '')}`) is scored as serving "
              f"scores it: an index built for this knowledge base, the {results.get('prefilter', '?')} BM25 "
              f"candidates (K = {results.get('candidates', '?')}, 0 = every ticket) without the query ticket, the "
              "engine's scoring code.",
              "- BM25: ticketrec's one BM25 (Porter stems, stop words dropped, subject weighted 2) over the tickets.",
              "- MiniLM: all-MiniLM-L6-v2, zero-shot cosine of the query text to subject + description + solution.",
              "- RRF: reciprocal-rank fusion (k = 60) of the BM25 and MiniLM rankings.", "",
              "## Results", "", duplicates_table(results["rows"]), ""]
    if results.get("paired"):
        first = results["rows"][0]["system"]
        parts += [f"## {first} against each other system (paired)", "",
                  "Δ = its per-query value minus the other system's on the same queries, with the 95 % paired "
                  "bootstrap interval (the resamples above). An interval that holds 0 means these queries cannot "
                  "tell the two apart.", "", paired_table(results["paired"]), ""]
    if results.get("notes"):
        parts += ["## Notes", ""] + [f"- {n}" for n in results["notes"]] + [""]
    parts += ["## Software", "", ", ".join(f"{k} {v}" for k, v in results.get("versions", {}).items()), ""]
    if plots:
        parts += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots] + [""]
    return "\n".join(parts)


def plot_duplicates(results: dict, out: Path) -> list[Path]:
    """PNG plots of a duplicates run: the metrics with their intervals, and Acc@k for k = 1..10."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    if not rows:
        return []
    written: list[Path] = []
    fig, ax = plt.subplots(figsize=(max(7, 1.5 * len(rows) + 4), 4.5))
    width = 0.8 / len(rows)
    for i, r in enumerate(rows):
        xs = [j + i * width for j in range(len(DUPLICATE_METRICS))]
        ys = [r[m] for m in DUPLICATE_METRICS]
        err = [[r[m] - r[m + "_low"] for m in DUPLICATE_METRICS], [r[m + "_high"] - r[m] for m in DUPLICATE_METRICS]]
        ax.bar(xs, ys, width, yerr=err, capsize=3, label=r["system"])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(DUPLICATE_METRICS))])
    ax.set_xticklabels(DUPLICATE_METRICS)
    ax.set_ylim(0, 1)
    ax.set_ylabel("mean over queries (95 % bootstrap interval)")
    ax.set_title(f"Duplicates protocol ({rows[0].get('queries', '?')} queries)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    written.append(_save(fig, out / "duplicates_metrics.png", plt))

    if all("ranks" in r for r in rows):
        fig, ax = plt.subplots(figsize=(8, 4.5))
        ks = list(range(1, 11))
        for r in rows:
            ranks = [x for x in r["ranks"] if x is not None]
            n = max(1, len(r["ranks"]))
            ax.plot(ks, [sum(1 for x in ranks if x <= k) / n for k in ks], marker="o", label=r["system"])
        ax.set_xticks(ks)
        ax.set_xlabel("k")
        ax.set_ylabel("Acc@k (partner in the top k)")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
        fig.tight_layout()
        written.append(_save(fig, out / "duplicates_acc_at_k.png", plt))
    return written


def write_duplicates_report(results: dict, out: str | Path) -> dict[str, Path]:
    """Write report.md, results.json and the plots of a duplicates run into `out`; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plots = plot_duplicates(results, out)
    paths = {"json": out / "results.json", "md": out / "report.md"}
    atomic_write_text(paths["json"], json.dumps(results, indent=2, default=float))
    atomic_write_text(paths["md"], render_duplicates_markdown(results, [str(p) for p in plots]))
    return {**paths, **{p.stem: p for p in plots}}


# -- cross-validation (`ticketrec evaluate --train A --dev B --cv K`) -----------------------------------------------
def _cv_cell(row: dict, key: str, pattern: str) -> str:
    f = row["folds"][key]
    return f"{pattern.format(row['cv'][key])} [{pattern.format(f['min'])}–{pattern.format(f['max'])}] ± {pattern.format(f['std'])}"


def _diff_cell(d: dict | None, pattern: str) -> str:
    if not d:
        return "–"
    return f"{pattern.format(d['diff'])} [{pattern.format(d['low'])}, {pattern.format(d['high'])}]"


def render_cv_markdown(results: dict) -> str:
    """The report.md of a cross-validation run."""
    rows, v = results["rows"], results["verdict"]
    parts = [f"# Cross-validated evaluation: {results.get('name', '')}", "",
             f"Produced {results['date']} by:", "", "```", results["command"], "```", "",
             "## Data", "", "| input | file | sha256 (first 16) | tickets | queries | labelled pairs |", "|---|---|---|---|---|---|"]
    for name, d in results["data"].items():
        parts.append(f"| {name} | `{d['path']}` | `{d['sha256'][:16]}` | {d['tickets']} | {d['queries']} | {d['pairs']} |")
    parts += ["", "| fold | held-out queries | its knowledge base (tickets) | training queries | selection queries |",
              "|---|---|---|---|---|"]
    parts += [f"| {f['fold']} | {f['queries']} | {f['tickets']} | {f['train_queries']} | {f['selection_queries']} |"
              for f in results["folds"]]
    margin = results.get("margin")
    rule = "one standard error of the best" if margin is None else f"{margin} MAP points of the best"
    parts += ["", "## Protocol", "",
              f"The inputs are pooled and their labelled queries split into {results['k']} folds (seed "
              f"{results['seed']}). For each fold, the other folds are split again by query: the network trains on "
              "one part (early stopping on the other), and the weights are selected on the other part. Each "
              "held-out fold is measured as a dev split is (rerank: official SemEval scorer ×100; KB: its own "
              f"tickets are the knowledge base, BM25 pre-filter K = {results['candidates']}), so every query is "
              "measured once, by a model that never saw it.", "",
              f"- **Selection rule** (`simplest`): among the grid combinations whose selection MAP is within {rule}, "
              "the one with the fewest non-zero channels (BM25 counts as one), then the channel weights closest to "
              "uniform, then the pair weights closest to uniform, then the higher MAP. `argmax` is the plain best MAP.",
              *(["- **The default recipe** (rows of kind `mined`: `ticketrec train`) trains on the other folds' "
                 "tickets alone: pairs mined from them, S adapted to them, weights selected on their mined held-out "
                 "slice (not on the selection queries); \"mined + labelled pairs\" adds the other folds' labelled "
                 "pairs as `ticketrec train --train` does, \"labels dropped\" does not. Their BM25 and pair weights "
                 "are listed as the saved model holds them, rescaled to a mean distance of 1 over the pairs it was "
                 "calibrated on: compare them within a fold, not with the grid values of the other rows."]
               if any(r.get("kind") == "mined" for r in rows) else []),
              "- **CV estimate** = mean over all queries; [min–max] ± std = the spread of the per-fold figures.",
              f"- **Δ** = paired difference of the per-query values against a baseline, with its 95 % percentile "
              f"bootstrap interval ({results['bootstrap']} resamples of the queries, seed {results['seed']}).",
              "- The KB figures use each fold's own knowledge base (about 1/K of the pooled tickets), so they are "
              "not comparable with a KB figure over a whole dev file.", "",
              "## Cross-validated figures", "",
              "| configuration | " + " | ".join(h for _, h, _ in HEADLINE) + " |", "|---|" + "---|" * len(HEADLINE)]
    for r in rows:
        parts.append(f"| {r['name']} | " + " | ".join(_cv_cell(r, k, f) for k, _, f in HEADLINE) + " |")
    for base in (BM25_NAME, ZERO_SHOT_NAME):
        against = [r for r in rows if base in r["vs"]]
        if against:
            parts += ["", f"## Δ against {base} (95 % paired bootstrap interval)", "",
                      "| configuration | " + " | ".join(h for _, h, _ in HEADLINE) + " |", "|---|" + "---|" * len(HEADLINE)]
            parts += [f"| {r['name']} | " + " | ".join(_diff_cell(r["vs"][base].get(k), f) for k, _, f in HEADLINE) + " |"
                      for r in against]
    weighted = [r for r in rows if r["weights"]]
    if weighted:
        parts += ["", "## Selected weights per fold", "", "| configuration | weight | per fold | min–max |", "|---|---|---|---|"]
        for r in weighted:
            for w, d in r["weights"].items():
                parts.append(f"| {r['name']} | {w.replace('|', '–')} | {', '.join(f'{x:.3g}' for x in d['values'])} | "
                             f"{d['min']:.3g}–{d['max']:.3g} |")
    parts += ["", "## Verdict", ""]
    if v.get("winner") is None:
        parts.append("No trained configuration was cross-validated.")
    else:
        beats = v["beats"]
        both = bool(beats) and all(beats.values())
        named = ", ".join(f"{b}: {'yes' if ok else 'no'}" for b, ok in beats.items())
        missing = [b for b in (BM25_NAME, ZERO_SHOT_NAME) if b not in beats]
        parts.append(f"The trained configuration with the best CV rerank MAP is **{v['winner']}**."
                     + (f" Beats each baseline (95 % interval of Δ above 0 on rerank MAP and KB MAP@10): {named}."
                        if beats else ""))
        if missing:
            parts.append(f"Not compared with {' and '.join(missing)}: the run left "
                         f"{'that row' if len(missing) == 1 else 'those rows'} out (`--cv-rows`), so this report "
                         "gives no verdict on the default.")
        else:
            parts.append("It beats both, so it can stay the default." if both else
                         f"**No trained configuration beats both BM25 and the zero-shot S channel in cross-validation**; "
                         f"it should not be the default. The best baseline by CV rerank MAP is **{v.get('default')}**.")
    parts += ["", "## Software", "", ", ".join(f"{k} {v}" for k, v in results.get("versions", {}).items()), ""]
    return "\n".join(parts)


def write_cv_report(results: dict, out: str | Path) -> dict[str, Path]:
    """Write report.md and results.json of a cross-validation run into `out`; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "md": out / "report.md"}
    atomic_write_text(paths["json"], json.dumps(results, indent=2, default=float))
    atomic_write_text(paths["md"], render_cv_markdown(results))
    return paths
