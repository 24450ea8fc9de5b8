"""How fast the synthetic generator is, and how hard its knowledge base is for word overlap (BM25).

BM25 Acc@1 = share of queries whose BM25 top-1 ticket over the whole generated knowledge base has label 5
(unlabelled = not relevant), with the FTS5 pre-filter the product uses. Also Acc@10 and the share of queries
whose top 1 is at least REL (3).

    .venv/bin/python benchmarks/synthetic_kb.py [--tickets 2000] [--queries 200] [--seeds 0 1 2] [--speed 100000]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recommender.lexical.searchers import Fts5Searcher  # noqa: E402
from recommender.data.store import Store  # noqa: E402
from recommender.data.synthetic import DEFAULT_OVERLAP, generate  # noqa: E402


def bm25_accuracy(n_tickets: int, n_queries: int, seed: int, overlap: float) -> dict:
    data = generate(n_tickets, n_queries, seed=seed, overlap=overlap)
    labels: dict[str, dict[str, float]] = {}
    for p in data.pairs:
        labels.setdefault(p.query_id, {})[p.ticket_id] = p.score
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "kb.sqlite3") as store:
        store.import_dataset(data)
        prefilter = Fts5Searcher(store)
        at1 = at10 = rel1 = 0
        for q in data.queries:
            hits = [tid for tid, _ in prefilter.search(f"{q.subject}\n{q.description}", 10)]
            gold = labels.get(q.id, {})
            at1 += bool(hits) and gold.get(hits[0], 0) == 5
            rel1 += bool(hits) and gold.get(hits[0], 0) >= 3
            at10 += any(gold.get(t, 0) == 5 for t in hits)
    n = len(data.queries)
    return {"acc@1": at1 / n, "acc@10": at10 / n, "top1>=REL": rel1 / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tickets", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--overlap", type=float, nargs="+", default=[DEFAULT_OVERLAP])
    parser.add_argument("--speed", type=int, default=100_000, help="tickets for the generation-speed row (0: skip)")
    args = parser.parse_args()

    print(f"command: .venv/bin/python benchmarks/synthetic_kb.py {' '.join(sys.argv[1:])}".rstrip())
    if args.speed:
        started = time.perf_counter()
        data = generate(args.speed, args.speed // 100, seed=0)
        seconds = time.perf_counter() - started
        print(f"\ngenerate({args.speed} tickets, {args.speed // 100} queries): {seconds:.1f} s "
              f"({args.speed / seconds:,.0f} tickets/s, {len(data.pairs)} pairs)")
    print(f"\nBM25 (FTS5) on {args.tickets} tickets, {args.queries} queries")
    print(f"{'overlap':>7}  {'seed':>4}  {'acc@1':>6}  {'acc@10':>6}  {'top1>=REL':>9}")
    for overlap in args.overlap:
        rows = []
        for seed in args.seeds:
            r = bm25_accuracy(args.tickets, args.queries, seed, overlap)
            rows.append(r)
            print(f"{overlap:7.2f}  {seed:4d}  {r['acc@1']:6.3f}  {r['acc@10']:6.3f}  {r['top1>=REL']:9.3f}")
        mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
        print(f"{overlap:7.2f}  {'mean':>4}  {mean['acc@1']:6.3f}  {mean['acc@10']:6.3f}  {mean['top1>=REL']:9.3f}")


if __name__ == "__main__":
    main()
