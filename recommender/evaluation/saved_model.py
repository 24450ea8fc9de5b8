"""Evaluate a saved model on labelled data without retraining (`ticketrec evaluate --model DIR --test FILE`):
the rerank and knowledge-base protocols exactly as the grid reports them (`experiments.ModelSystem`), beside
what a help desk would run instead (BM25, MiniLM zero-shot and their fusion: `baselines.py`), with the model's
paired differences from each."""
from __future__ import annotations

import datetime as _dt
import json
import tempfile
from pathlib import Path

from ..config import default
from ..model.encoder_base import encode_threads
from .duplicates import BM25_NAME


#: (row key, metric key of `ProtocolResult.metrics`) of the table `ticketrec evaluate` prints.
TABLE = (("MRR@10", "mrr@10"), ("Acc@1", "acc@1"), ("Acc@5", "acc@5"), ("Acc@10", "acc@10"), ("MAP@10", "map@10"))
#: Further rerank metrics: the official SemEval scorer's (×100) and the calibrated score's correlation (the model's
#: only: the baselines' raw scores are not on the labels' scale).
RERANK_EXTRA = ("official_map", "official_mrr", "official_p@1", "pearson", "spearman", "mse")
#: The model's paired differences from each baseline: (label, protocol, key of `metrics.per_query_values`).
PAIRED = (("rerank MAP (official)", "rerank", "official_map"), ("rerank MRR (official)", "rerank", "official_mrr"),
          ("KB MAP@10", "kb", "map@10"), ("KB Acc@10", "kb", "acc@10"))


def aligned_per_query(per_query: dict, first: str, other: str, protocol: str,
                      key: str) -> tuple[list[float], list[float]]:
    """Two systems' per-query values of one metric (`per_query`: {system: {protocol: `metrics.per_query_values`}}),
    over the same queries in the same order."""
    a, b = per_query[first][protocol], per_query[other][protocol]
    queries = sorted(a)
    return [a[q][key] for q in queries], [b[q][key] for q in queries]


@encode_threads()
def evaluate_saved_model(model_dir: str | Path, test: str | Path, *, candidates: int = default("candidates"),
                         out: str | Path | None = None, command: str = "", progress: bool = True,
                         baselines: bool = True, n_boot: int = 2000, seed: int = 0) -> dict:
    """Rerank and knowledge-base metrics of the model at `model_dir` on the labelled `test` file, and with
    `baselines` of BM25, MiniLM zero-shot and their fusion on the same queries (`baselines.labelled_baselines`;
    left out with a note when the pretrained extra is missing), with the model's paired differences from each.

    Returns {"rows": [model rerank row, model kb row, then each baseline's two], "paired": {baseline: {metric:
    {"diff", "low", "high", "p_not_better"}}}, "notes", ...}; each row {"system", "protocol", "MRR@10", "Acc@1",
    "Acc@5", "Acc@10", "MAP@10"} (+ the official SemEval figures on rerank, and the model's r/ρ/MSE). The paired
    metrics are `PAIRED` (model − baseline per query, 95 % paired bootstrap interval over the queries). With `out`,
    writes results.json, report.md and the predictions (JSON lines and the SemEval format) there."""
    import torch

    from ..errors import ModelError
    from ..model.bundle import TicketModel
    from . import experiments as X
    from . import metrics as M
    from .baselines import labelled_baselines

    torch.set_num_threads(1)
    model_dir = Path(model_dir)
    model = TicketModel.load(model_dir)
    test = Path(test)
    name = f"model {model_dir.name} ({model.version[:12]})"
    evaluated, notes = {}, []
    with tempfile.TemporaryDirectory(prefix="ticketrec-eval-") as tmp:
        work = Path(out) if out is not None else Path(tmp)
        split = X._open_split("test", test, work)
        try:
            systems = {name: X.ModelSystem(model, split, candidates, progress=progress)}
            if baselines:
                try:
                    systems.update(labelled_baselines(split, progress=progress))
                except ModelError as exc:
                    notes.append(f"MiniLM and RRF rows left out: {exc}")
                    systems[BM25_NAME] = X.BM25System(split)
            for system_name, system in systems.items():
                evaluated[system_name] = X._evaluate_system(system, split, 10, progress)
            if out is not None:
                for system_name, (_, rr, kb) in evaluated.items():
                    file_name = "model" if system_name == name else X.slug(system_name)
                    rr.write(work / "predictions", file_name)
                    kb.write(work / "predictions", file_name)
            data = split.describe()
        finally:
            split.store.close()
    rows = []
    for system_name, (metrics, _, _) in evaluated.items():
        for protocol, prefix in (("rerank", ""), ("kb", "kb_")):
            row = {"system": system_name, "protocol": protocol}
            row.update({label: metrics.get(prefix + key) for label, key in TABLE})
            if protocol == "rerank":
                row.update({key: metrics.get(key) for key in (RERANK_EXTRA if system_name == name
                                                              else RERANK_EXTRA[:3])})
            rows.append(row)
    per_query = {system_name: {"rerank": M.per_query_values(rr.run(), rr.qrels),
                               "kb": M.per_query_values(kb.run(), kb.qrels)}
                 for system_name, (_, rr, kb) in evaluated.items()}
    paired = {system_name: {label: M.paired_bootstrap_difference(
                                *aligned_per_query(per_query, name, system_name, protocol, key), n_boot, seed)
                            for label, protocol, key in PAIRED}
              for system_name in evaluated if system_name != name}
    results = {
        "protocol": "saved-model", "command": command or f"evaluate_saved_model({model_dir}, {test})",
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "model": {"path": str(model_dir), "version": model.version, "metric": model.metric_spec()},
        "data": {"test": data}, "candidates": candidates, "rows": rows, "metrics": evaluated[name][0],
        "paired": paired, "notes": notes,
    }
    if out is not None:
        _write(results, Path(out))
    return results


def _write(results: dict, out: Path) -> None:
    from ..files import atomic_write_text
    from .report import paired_table

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results.json", json.dumps(results, indent=2, default=float))
    d = results["data"]["test"]
    head = ["system", "protocol"] + [label for label, _ in TABLE] + ["off. MAP", "off. MRR", "off. P@1", "r"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in results["rows"]:
        extra = [row.get(k) for k in ("official_map", "official_mrr", "official_p@1", "pearson")]
        cells = [row["system"], row["protocol"]] + [_cell(row[label]) for label, _ in TABLE] + [
            _cell(v, 2 if i < 3 else 3) for i, v in enumerate(extra)]
        lines.append("| " + " | ".join(cells) + " |")
    paired = results.get("paired") or {}
    if paired:
        first = results["rows"][0]["system"]
        lines += ["", f"## {first} against each baseline (paired)", "",
                  "The model's per-query value minus the baseline's, averaged over the same queries, with its 95 % "
                  "paired bootstrap interval (the queries resampled); an interval above 0 is a difference these "
                  "queries can tell from none. Rerank figures are the official scorer's (×100), knowledge-base "
                  "figures fractions.", "",
                  paired_table(paired, [label for label, *_ in PAIRED],
                               {label: "{:+.2f}" for label, protocol, _ in PAIRED if protocol == "rerank"})]
    notes = [f"- {n}" for n in results.get("notes", [])]
    text = "\n".join([
        f"# Saved model on labelled data: {results['model']['path']}", "",
        f"Produced {results['date']} by:", "", "```", results["command"], "```", "",
        f"Model version `{results['model']['version']}`; test file `{d['path']}` (sha256 `{d['sha256'][:16]}`): "
        f"{d['tickets']} tickets, {d['queries']} queries, {d['pairs']} labelled pairs. Knowledge-base protocol "
        f"with K = {results['candidates']} BM25 candidates for the model; the baselines rank every ticket (BM25 the "
        "tickets sharing a word with the query). Relevant = label ≥ 3 (YES and REL). BM25, MiniLM (zero-shot: "
        "all-MiniLM-L6-v2, cosine, sentence-transformers float32) and their reciprocal-rank fusion (k = 60) are the "
        "systems of the duplicates protocol, uncalibrated (r only for the model).", "",
        *lines, "", *notes, *([""] if notes else [])])
    atomic_write_text(out / "report.md", text)


def _cell(value, digits: int = 3) -> str:
    if value is None or value != value:
        return "–"
    return f"{value:.{digits}f}"

