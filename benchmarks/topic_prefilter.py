"""Recall of the topic pre-filter (LDA or DocNADE topics, `recommender/model/topic_prefilter.py`) against BM25 at
the same K: the share of a query's relevant tickets among the K candidates a model would score.

Knowledge bases (real data in ../shared/data, skipped with a note when missing):
- SemEval-2016 dev and train-part2, the knowledge-base protocol: every related question of the split is a ticket,
  each original question a query, relevant = label ≥ 3 (PerfectMatch or Relevant);
- SeaMonkey duplicates: every ticket of a duplicate link queries the knowledge base minus itself, relevant = its
  partner (the links are only the truth here; the topics never see them).

Systems at each K (10, 100, 1000 where the knowledge base has more tickets): BM25 (the one BM25 of
`lexical/bm25.py`; it returns only tickets sharing a term), the topic pre-filter with the query's topic cluster
first (the paper's) and by nearest topic vector alone, and BM25 ∪ topics (K/2 from BM25, filled from the topic
order). The topic models are fitted on the knowledge base's tickets (subject + description + solution).

    .venv/bin/python benchmarks/topic_prefilter.py [--topics 50] [--epochs 10] [--json out.json]

Timings are wall-clock on whatever machine runs it (shared, for orientation only).
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shared_data import SEAMONKEY_DIR, SEMEVAL, seamonkey_links, seamonkey_tickets  # noqa: E402

KS = (10, 100, 1000)


def semeval_kb(path: Path):
    """(tickets, [(query text, own id or None, relevant ids)]) of one SemEval split, relevant = label ≥ 3."""
    from recommender.data.importers import load

    data = load(path)
    relevant: dict[str, set[str]] = {}
    for p in data.pairs:
        if p.score >= 3.0:
            relevant.setdefault(p.query_id, set()).add(p.ticket_id)
    queries = [(f"{q.subject}\n{q.description}", None, relevant[q.id]) for q in data.queries if q.id in relevant]
    return data.tickets, queries


def seamonkey_kb(directory: Path):
    """(tickets, queries) of the SeaMonkey duplicates: each linked ticket asks for its partner."""
    from recommender.evaluation.duplicates import duplicate_queries

    tickets = seamonkey_tickets(directory / "SeaMonkey_bugs.csv")
    ids = [t.id for t in tickets]
    links = seamonkey_links(ids, directory / "SeaMonkey_bugs-combined.csv")
    by_id = {t.id: t for t in tickets}
    pairs = duplicate_queries(ids, links).pairs
    return tickets, [(f"{by_id[a].subject}\n{by_id[a].description}", a, {b}) for a, b in pairs]


def recall_at(search, tickets, queries, ks) -> dict[int, float]:
    """Mean recall of the relevant tickets within each K (one search per K: a union is not a prefix of a larger
    one; the query's own ticket removed), and ms per search."""
    ids = [t.id for t in tickets]
    found = {k: [] for k in ks}
    started = time.perf_counter()
    for text, own, relevant in queries:
        for k in ks:
            rows, _ = search(text, k + 1)
            ranked = [ids[int(r)] for r in rows if ids[int(r)] != own][:k]
            found[k].append(len(relevant & set(ranked)) / len(relevant))
    ms = 1000 * (time.perf_counter() - started) / max(1, len(queries) * len(ks))
    return {**{k: float(np.mean(v)) for k, v in found.items()}, "ms": ms}


def union(first, second):
    """K/2 candidates from `first`, then `second`'s order fills up to K (distinct rows)."""

    def search(text: str, k: int):
        rows = [int(r) for r in first(text, k // 2)[0]]
        seen = set(rows)
        for r in second(text, k)[0]:
            if len(rows) >= k:
                break
            if int(r) not in seen:
                rows.append(int(r))
                seen.add(int(r))
        return np.asarray(rows, np.int64), np.zeros(len(rows))

    return search


def run_kb(name: str, tickets, queries, args) -> list[dict]:
    from recommender.lexical.bm25 import Bm25Scorer
    from recommender.model.topic_prefilter import TopicPrefilter

    ks = [k for k in KS if k < len(tickets)]
    bm25 = Bm25Scorer(tickets)
    systems = {"BM25": bm25.top_k}
    fits = {}
    for method in args.methods:
        started = time.time()
        clustered = TopicPrefilter.fit(tickets, method, n_topics=args.topics, vocab_size=args.vocab, seed=args.seed,
                                       epochs=args.epochs)
        fits[method] = round(time.time() - started, 1)
        nearest = copy.copy(clustered)
        nearest.cluster = False
        label = method.upper() if method == "lda" else "DocNADE"
        systems[f"{label}, topic cluster first"] = clustered.search
        systems[f"{label}, nearest topic vector"] = nearest.search
        systems[f"BM25 ∪ {label} (K/2 + fill)"] = union(bm25.top_k, clustered.search)
    rows = []
    for system, search in systems.items():
        recall = recall_at(search, tickets, queries, ks)
        rows.append({"kb": name, "tickets": len(tickets), "queries": len(queries), "system": system,
                     **{f"R@{k}": recall[k] for k in ks}, "ms_per_query": round(recall["ms"], 2)})
        print(f"{name:<22} {system:<34} " + "  ".join(f"R@{k} {recall[k]:.3f}" for k in ks)
              + f"  ({recall['ms']:.1f} ms/query)", flush=True)
    print(f"{name}: topic models fitted in {fits} s", flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| knowledge base | tickets | queries | pre-filter | R@10 | R@100 | R@1000 |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{r[k]:.3f}" if k in r else "–" for k in ("R@10", "R@100", "R@1000")]
        lines.append(f"| {r['kb']} | {r['tickets']} | {r['queries']} | {r['system']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=50)
    parser.add_argument("--vocab", type=int, default=2000, help="content words the topic models read")
    parser.add_argument("--epochs", type=int, default=10, help="LDA passes / DocNADE epochs")
    parser.add_argument("--methods", nargs="+", default=["lda", "docnade"], choices=["lda", "docnade"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args()
    import torch

    from recommender.errors import TicketrecError

    torch.set_num_threads(1)
    rows: list[dict] = []
    kbs = [("SemEval-2016 dev", lambda: semeval_kb(SEMEVAL / "dev.xml")),
           ("SemEval-2016 train-part2", lambda: semeval_kb(SEMEVAL / "train-part2.xml")),
           ("SeaMonkey duplicates", lambda: seamonkey_kb(SEAMONKEY_DIR))]
    for name, make in kbs:
        try:
            tickets, queries = make()
        except (OSError, TicketrecError) as exc:  # the importers raise InputError for a missing file
            print(f"{name}: skipped ({exc})", flush=True)
            continue
        rows += run_kb(name, tickets, queries, args)
    print()
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "json"}, "rows": rows},
                                        indent=2))


if __name__ == "__main__":
    main()
