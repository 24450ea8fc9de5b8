"""Evaluate a saved model on labelled data without retraining (`ticketrec evaluate --model DIR --test FILE`):
the rerank and knowledge-base protocols exactly as the grid reports them (`experiments.ModelSystem`)."""
from __future__ import annotations

import datetime as _dt
import json
import tempfile
from pathlib import Path

from ..config import default


#: (row key, metric key of `ProtocolResult.metrics`) of the table `ticketrec evaluate` prints.
TABLE = (("MRR@10", "mrr@10"), ("Acc@1", "acc@1"), ("Acc@5", "acc@5"), ("Acc@10", "acc@10"), ("MAP@10", "map@10"))
#: Further rerank metrics: the official SemEval scorer's (×100) and the calibrated score's correlation.
RERANK_EXTRA = ("official_map", "official_mrr", "official_p@1", "pearson", "spearman", "mse")


def evaluate_saved_model(model_dir: str | Path, test: str | Path, *, candidates: int = default("candidates"),
                         out: str | Path | None = None, command: str = "", progress: bool = True) -> dict:
    """Rerank and knowledge-base metrics of the model at `model_dir` on the labelled `test` file.

    Returns {"rows": [rerank row, kb row], ...}; each row {"system", "protocol", "MRR@10", "Acc@1", "Acc@5",
    "Acc@10", "MAP@10"} (+ the official SemEval figures and r/ρ/MSE on rerank). With `out`, writes
    results.json, report.md and the predictions (JSON lines and the SemEval format) there."""
    import torch

    from ..model.bundle import TicketModel
    from . import experiments as X

    torch.set_num_threads(1)
    model_dir = Path(model_dir)
    model = TicketModel.load(model_dir)
    test = Path(test)
    with tempfile.TemporaryDirectory(prefix="ticketrec-eval-") as tmp:
        work = Path(out) if out is not None else Path(tmp)
        split = X._open_split("test", test, work)
        try:
            system = X.ModelSystem(model, split, candidates, progress=progress)
            metrics, rr, kb = X._evaluate_system(system, split, 10, progress)
            if out is not None:
                rr.write(work / "predictions", "model")
                kb.write(work / "predictions", "model")
            data = split.describe()
        finally:
            split.store.close()
    name = f"model {model_dir.name} ({model.version[:12]})"
    rows = []
    for protocol, prefix in (("rerank", ""), ("kb", "kb_")):
        row = {"system": name, "protocol": protocol}
        row.update({label: metrics.get(prefix + key) for label, key in TABLE})
        if protocol == "rerank":
            row.update({key: metrics.get(key) for key in RERANK_EXTRA})
        rows.append(row)
    results = {
        "protocol": "saved-model", "command": command or f"evaluate_saved_model({model_dir}, {test})",
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "model": {"path": str(model_dir), "version": model.version, "metric": model.metric_spec()},
        "data": {"test": data}, "candidates": candidates, "rows": rows, "metrics": metrics,
    }
    if out is not None:
        _write(results, Path(out))
    return results


def _write(results: dict, out: Path) -> None:
    from ..files import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results.json", json.dumps(results, indent=2, default=float))
    d = results["data"]["test"]
    head = ["protocol"] + [label for label, _ in TABLE] + ["off. MAP", "off. MRR", "off. P@1", "r"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in results["rows"]:
        extra = [row.get(k) for k in ("official_map", "official_mrr", "official_p@1", "pearson")]
        cells = [row["protocol"]] + [_cell(row[label]) for label, _ in TABLE] + [_cell(v, 2 if i < 3 else 3)
                                                                                 for i, v in enumerate(extra)]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join([
        f"# Saved model on labelled data: {results['model']['path']}", "",
        f"Produced {results['date']} by:", "", "```", results["command"], "```", "",
        f"Model version `{results['model']['version']}`; test file `{d['path']}` (sha256 `{d['sha256'][:16]}`): "
        f"{d['tickets']} tickets, {d['queries']} queries, {d['pairs']} labelled pairs. Knowledge-base protocol "
        f"with K = {results['candidates']} BM25 candidates. Relevant = label ≥ 3 (YES and REL).", "",
        *lines, ""])
    atomic_write_text(out / "report.md", text)


def _cell(value, digits: int = 3) -> str:
    if value is None or value != value:
        return "–"
    return f"{value:.{digits}f}"

