"""Benchmark the embedded BM25 pre-filter: import throughput and FTS5 candidate latency on synthetic knowledge bases.

For each size it generates a synthetic knowledge base (`recommender.data.synthetic.generate`, not timed), imports
its tickets into a fresh SQLite store through `Store.import_dataset` (one transaction, FTS5 kept in sync by
the store's triggers: timed as tickets/s), then times `Fts5Searcher.search(query, k)` for the generated
queries (SUBJECT + DESCRIPTION, after a few warm-up queries) and prints p50/p95 latency.

    .venv/bin/python benchmarks/prefilter.py                    # 10k and 100k tickets, 100 queries, k=1000
    .venv/bin/python benchmarks/prefilter.py --sizes 10000 --queries 50 -k 100
"""
from __future__ import annotations

import argparse
import platform
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recommender.lexical.analyzer import MAX_QUERY_TERMS  # noqa: E402
from recommender.lexical.bm25 import BM25_B, BM25_K1, DEFAULT_WEIGHTS  # noqa: E402
from recommender.lexical.searchers import Fts5Searcher  # noqa: E402
from recommender.data.store import Dataset, Store  # noqa: E402
from recommender.data.synthetic import generate  # noqa: E402


def bench_size(n_tickets: int, n_queries: int, k: int, seed: int, workdir: Path, max_terms: int = MAX_QUERY_TERMS) -> dict:
    """One row of the table: import throughput and candidate latency for `n_tickets` synthetic tickets."""
    t0 = time.perf_counter()
    data = generate(n_tickets, n_queries, seed)
    gen_s = time.perf_counter() - t0
    if not data.queries:
        raise SystemExit("the synthetic generator produced no queries; cannot time the pre-filter")

    with Store(workdir / f"bench-{n_tickets}.sqlite3") as store:
        t0 = time.perf_counter()
        store.import_dataset(Dataset(data.tickets, source="benchmark"))
        import_s = time.perf_counter() - t0

        prefilter = Fts5Searcher(store, max_terms=max_terms)
        texts = [f"{q.subject}\n{q.description}" for q in data.queries]
        texts = (texts * (n_queries // len(texts) + 1))[:n_queries]
        for text in texts[:5]:  # warm the page cache and the statement cache
            prefilter.search(text, k)
        latencies, returned = [], []
        for text in tqdm(texts, desc=f"queries on {n_tickets:,} tickets", unit="q", leave=False):
            t0 = time.perf_counter()
            hits = prefilter.search(text, k)
            latencies.append(time.perf_counter() - t0)
            returned.append(len(hits))
    ms = np.array(latencies) * 1000.0
    return {
        "tickets": n_tickets,
        "generate_s": gen_s,
        "import_s": import_s,
        "import_tps": n_tickets / import_s,
        "queries": len(texts),
        "k": k,
        "mean_hits": float(np.mean(returned)),
        "p50_ms": float(np.percentile(ms, 50)),
        "p95_ms": float(np.percentile(ms, 95)),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000], help="knowledge-base sizes (tickets)")
    ap.add_argument("--queries", type=int, default=100, help="timed queries per size")
    ap.add_argument("-k", type=int, default=1000, help="candidates per query")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--max-terms", type=int, default=MAX_QUERY_TERMS, help="distinct query terms kept (fewer: faster, less exact)")
    args = ap.parse_args(argv)

    rows = []
    with tempfile.TemporaryDirectory(prefix="ticketrec-bench-") as tmp:
        for n in args.sizes:
            rows.append(bench_size(n, args.queries, args.k, args.seed, Path(tmp), args.max_terms))

    w_sub, w_desc, w_sol = DEFAULT_WEIGHTS
    print(f"\nBM25 pre-filter (SQLite FTS5 {sqlite3.sqlite_version}, weights subject {w_sub:g} / description {w_desc:g} / "
          f"solution {w_sol:g}, k1 {BM25_K1}, b {BM25_B}, max {args.max_terms} query terms) on {platform.machine()}, Python {platform.python_version()}")
    header = f"| {'tickets':>8} | {'import s':>8} | {'import tickets/s':>16} | {'queries':>7} | {'k':>5} | {'mean hits':>9} | {'p50 ms':>7} | {'p95 ms':>7} |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for r in rows:
        print(f"| {r['tickets']:>8,} | {r['import_s']:>8.2f} | {r['import_tps']:>16,.0f} | {r['queries']:>7} | {r['k']:>5} "
              f"| {r['mean_hits']:>9.0f} | {r['p50_ms']:>7.1f} | {r['p95_ms']:>7.1f} |")
    cmd = " ".join(["benchmarks/prefilter.py"] + (argv if argv is not None else sys.argv[1:]))
    print(f"\nreproduce: .venv/bin/python {cmd}".rstrip())


if __name__ == "__main__":
    main()
