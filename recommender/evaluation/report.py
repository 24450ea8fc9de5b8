"""Render an experiment's results: report.md (the Table 5 analogue), results.csv, results.json and PNG plots."""
from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

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


def _atomic_write(path: Path, data: str | bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
            w.writerow([r["name"], r.get("paper_row", ""), split, len(r.get("seeds", []))]
                       + [r[split].get(k, "") for k in keys] + [spread.get(k, "") for k in keys])
    return out.getvalue()


def render_markdown(results: dict, plots: Sequence[str]) -> str:
    """The whole report.md text."""
    rows = results["rows"]
    parts = [f"# Evaluation report: {results.get('name', '')}", ""]
    parts += [f"Produced {results['date']} by:", "", "```", results["command"], "```", ""]
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
    _atomic_write(path, buf.getvalue())
    return path


def write_report(results: dict, out: str | Path, calibration: dict[str, tuple[list[float], list[float]]] | None = None) -> dict[str, Path]:
    """Write report.md, results.csv, results.json and the plots into `out`; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plots = plot_all(results, out, calibration)
    paths = {"json": out / "results.json", "csv": out / "results.csv", "md": out / "report.md"}
    _atomic_write(paths["json"], json.dumps(results, indent=2, default=float))
    _atomic_write(paths["csv"], results_csv(results))
    _atomic_write(paths["md"], render_markdown(results, [str(p) for p in plots]))
    return {**paths, **{p.stem: p for p in plots}}
