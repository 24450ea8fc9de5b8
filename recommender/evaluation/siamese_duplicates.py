"""The `siamese` grid on real duplicate links: `ticketrec evaluate --grid siamese --kb FILE --duplicates FILE`.

The grid's standalone encoder rows (`experiments.siamese_rows`, kind "encoder") that need no labels are trained on
the knowledge base's tickets alone and rank it for every duplicate query (`duplicates.evaluate_duplicates`), beside
BM25. Its own module: `duplicates.py` imports from `experiments.py`, so `experiments.py` may not import it back.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..data.store import Dataset
from ..errors import InputError
from .duplicates import bm25_ranker, duplicate_queries, evaluate_duplicates, query_of
from .experiments import Row, Split, _train_encoder, _versions, fingerprint, siamese_rows


def encoder_ranker(encoder, tickets: Sequence) -> Callable:
    """A duplicates `Ranker` of a standalone encoder (`encode_tickets`, `encode_queries`, `similarity`): the tickets
    encoded once; each query ticket (subject and description, never its solution) once against every ticket."""
    ids = [t.id for t in tickets]
    matrix = encoder.encode_tickets(tickets)
    position = np.arange(len(ids))

    def rank(query, n: int) -> list[str]:
        scores = np.asarray(encoder.similarity(encoder.encode_queries([query_of(query)])[0], matrix), np.float64)
        return [ids[int(i)] for i in np.lexsort((position, -scores))[:n]]

    return rank


def run_siamese_duplicates(kb_path: str | Path, links_path: str | Path, *, mapping: dict | None = None,
                           html: str = "auto", link_columns: Sequence[str] | None = None,
                           out: str | Path | None = None, seed: int = 0,
                           n_boot: int = 2000, command: str = "", progress: bool = True,
                           warn: Callable[[str], None] | None = None, rows: Sequence[Row] | None = None) -> dict:
    """The `siamese` grid's encoder rows on duplicate links, beside BM25: each row that needs no labels trained on the
    knowledge base's tickets alone (pairs mined from them; the links are never trained on), then every duplicate
    query ranks the whole knowledge base minus itself (`duplicates.evaluate_duplicates`, no BM25 pre-filter: the
    network alone). Rows that need labelled pairs are left out with a note. `rows`: the grid's rows by default.
    Trained networks go to out/models (a temporary directory without `out`); the report is written as
    `run_duplicates` writes its own."""
    import dataclasses
    import datetime as _dt
    import tempfile

    import torch

    from ..data.importers import load, load_links

    torch.set_num_threads(1)
    data = load(kb_path, mapping=mapping, warn=warn, progress=progress, html=html)
    tickets = data.tickets
    if not tickets:
        raise InputError(f"{kb_path} holds no ticket; give the knowledge base's tickets with --kb")
    links = load_links(links_path, link_columns, known_ids=[t.id for t in tickets], warn=warn)
    kb = Split("kb", Path(kb_path), Dataset(tickets, source=str(kb_path)), None, None)
    systems: dict[str, Callable] = {"BM25": bm25_ranker(tickets)}
    notes, trained = [], {}
    with tempfile.TemporaryDirectory(prefix="ticketrec-siamese-") as scratch:
        models = Path(out) if out is not None else Path(scratch)
        for row in (siamese_rows() if rows is None else rows):
            if row.kind != "encoder":
                continue
            if row.overrides.get("pairs") == "labelled":
                notes.append(f"{row.name}: left out (it trains on labelled pairs; the knowledge base has none)")
                continue
            label_free = dataclasses.replace(row, overrides={**row.overrides, "pairs": "mined"})
            encoder = _train_encoder(label_free, kb, kb, seed, models)
            trained[row.name] = getattr(encoder, "version", "")
            systems[row.name] = encoder_ranker(encoder, tickets)
        measured = evaluate_duplicates(tickets, links, systems, n_boot=n_boot, seed=seed, progress=progress)
    notes.append("The encoder rows are trained on the knowledge base's tickets alone (pairs mined from them) and "
                 "rank every ticket (no BM25 pre-filter): the network alone; the 'model' line above does not apply.")
    queries = duplicate_queries([t.id for t in tickets], links)
    results = {
        "name": Path(out).name if out else "siamese-duplicates", "protocol": "duplicates", "grid": "siamese",
        "command": command or f"run_siamese_duplicates({kb_path!s}, {links_path!s}, seed={seed})",
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "data": {"kb": {"path": str(kb_path), "sha256": fingerprint(kb_path), "tickets": len(tickets),
                        "mapping": dict(mapping or {})},
                 "links": {"path": str(links_path), "sha256": fingerprint(links_path), "links": len(links),
                           "queries": len(queries.pairs)}},
        "model": {"path": "the siamese grid's encoder rows", "version": ", ".join(f"{k} {v}" for k, v in trained.items())},
        "candidates": 0, "prefilter": "none", "seed": seed, "bootstrap": n_boot,
        "queries": [list(q) for q in queries.pairs], "rows": measured, "notes": notes, "versions": _versions(),
    }
    if out is not None:
        from .report import write_duplicates_report

        results["files"] = {k: str(v) for k, v in write_duplicates_report(results, out).items()}
    return results
