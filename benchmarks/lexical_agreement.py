"""How far the BM25 backends agree: the index's postings, the in-memory scorer (`Bm25Scorer`) and SQLite FTS5.

The postings and the in-memory scorer are the one BM25 of `recommender/lexical/bm25.py` (the same functions); FTS5's
`bm25()` has the same formula, weights and parameters but stems with its own Porter tokenizer, so a word our
`fts5_stem` (NLTK's Porter) stems differently is a different term there, with its own document frequency. For
each knowledge base every query is searched on the three backends (top 10), and the table shows, per pair of
backends, the mean and worst top-10 overlap (|A ∩ B| / |A|, queries where A found something), the share of queries
with the identical top 10 in the identical order, and the largest relative score difference |a − b| / b over each
query's top 10 of A (b scored by B's `score_tickets`).

Knowledge bases: the SemEval-2016 dev tickets (`/work/shared/data/semeval2016/dev.xml`: 500 related questions with
their comments as solutions, 50 original questions as queries), the real-vocabulary one (`benchmarks/real_kb.py`:
SeaMonkey and SemEval sentences recombined, `--real-tickets`, its own queries; both skipped with a message when the
shared data is absent) and a synthetic one (`recommender.data.synthetic.generate`). Overlap with bm25s and tantivy
(other analysers, fields and IDF) is measured by `benchmarks/peers.py`.

    .venv/bin/python benchmarks/lexical_agreement.py
    .venv/bin/python benchmarks/lexical_agreement.py --synthetic-tickets 2000 --synthetic-queries 100 --real-tickets 0
"""
from __future__ import annotations

import argparse
import platform
import sqlite3
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recommender.data.records import Ticket  # noqa: E402
from recommender.data.store import Dataset, Store  # noqa: E402
from recommender.lexical.postings import Bm25Postings, PostingsBuilder, ticket_terms  # noqa: E402
from recommender.lexical.searchers import Fts5Searcher, MemorySearcher, Searcher  # noqa: E402

SEMEVAL_DEV = ROOT.parent / "shared" / "data" / "semeval2016" / "dev.xml"
TOP = 10


class PostingsSearcher(Searcher):
    """The postings of an index version, built here from the tickets alone (no model needed): what
    `serving.searchers.IndexSearcher` searches."""

    name = "postings"

    def __init__(self, tickets: list[Ticket], directory: Path):
        builder = PostingsBuilder(len(tickets))
        builder.add(np.arange(len(tickets)), ticket_terms(tickets))
        stats = builder.write(directory)
        self.postings = Bm25Postings.open(directory, stats, len(tickets))
        self.ids = [t.id for t in tickets]
        self.row_of = {tid: i for i, tid in enumerate(self.ids)}

    def search(self, text, k):
        rows, scores = self.postings.top_k(text, k)
        return [(self.ids[int(r)], float(s)) for r, s in zip(rows, scores)]

    def score_tickets(self, text, ticket_ids):
        rows = [self.row_of[t] for t in ticket_ids]
        return dict(zip(ticket_ids, self.postings.score_rows(text, rows).tolist()))

    def index(self, tickets, progress=True):
        raise NotImplementedError

    def remove(self, ticket_ids):
        raise NotImplementedError

    def rebuild(self, tickets, progress=True):
        raise NotImplementedError

    def count(self):
        return len(self.ids)


def compare(a: Searcher, b: Searcher, texts: list[str]) -> dict:
    """Top-10 overlap and score differences of backend `a` against backend `b` over `texts`."""
    overlaps, identical, worst_rel = [], 0, 0.0
    for text in texts:
        top_a, top_b = a.search(text, TOP), b.search(text, TOP)
        if not top_a:
            continue
        ids_a = [t for t, _ in top_a]
        overlaps.append(len(set(ids_a) & {t for t, _ in top_b}) / len(ids_a))
        identical += ids_a == [t for t, _ in top_b]
        theirs = b.score_tickets(text, ids_a)
        for tid, s in top_a:
            other = theirs[tid]
            rel = abs(s - other) / other if other > 0 else float("inf")
            worst_rel = max(worst_rel, rel)
    n = len(overlaps)
    return {"queries": n, "mean_overlap": float(np.mean(overlaps)) if n else float("nan"),
            "min_overlap": float(np.min(overlaps)) if n else float("nan"),
            "identical": identical / n if n else float("nan"), "max_rel": worst_rel}


def run_kb(name: str, tickets: list[Ticket], texts: list[str], tmp: Path) -> list[dict]:
    store = Store(tmp / f"{name}.sqlite3")
    store.import_dataset(Dataset(tickets, source=name))
    (tmp / name).mkdir()
    backends = {"postings": PostingsSearcher(tickets, tmp / name), "memory": MemorySearcher(tickets),
                "fts5": Fts5Searcher(store)}
    rows = []
    for a, b in (("postings", "memory"), ("postings", "fts5"), ("memory", "fts5")):
        rows.append({"kb": name, "tickets": len(tickets), "pair": f"{a} vs {b}", **compare(backends[a], backends[b], texts)})
    store.close()
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--synthetic-tickets", type=int, default=5000)
    ap.add_argument("--synthetic-queries", type=int, default=200)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--real-tickets", type=int, default=20_000, help="real-vocabulary tickets (0: skip)")
    ap.add_argument("--real-queries", type=int, default=100)
    args = ap.parse_args(argv)

    from recommender.data.importers import load
    from recommender.data.synthetic import generate

    results = []
    with tempfile.TemporaryDirectory(prefix="ticketrec-lexical-") as tmp:
        if SEMEVAL_DEV.exists():
            dev = load(SEMEVAL_DEV)
            results += run_kb("semeval-dev", list(dev.tickets), [f"{q.subject}\n{q.description}" for q in dev.queries], Path(tmp))
        else:
            print(f"SemEval-2016 dev data not found at {SEMEVAL_DEV}: skipping that knowledge base", file=sys.stderr)
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import real_kb

        if args.real_tickets and real_kb.available():
            texts = [f"{q.subject}\n{q.description}" for q in real_kb.iter_real_queries(args.real_queries)]
            results += run_kb("real", real_kb.real_tickets(args.real_tickets), texts, Path(tmp))
        elif args.real_tickets:
            print(f"shared data not found at {real_kb.DATA_DIR}: skipping the real-vocabulary knowledge base", file=sys.stderr)
        syn = generate(args.synthetic_tickets, args.synthetic_queries, seed=args.seed)
        results += run_kb("synthetic", list(syn.tickets), [f"{q.subject}\n{q.description}" for q in syn.queries], Path(tmp))

    print(f"\nBM25 backend agreement, top {TOP} (SQLite {sqlite3.sqlite_version}, Python {platform.python_version()})")
    header = (f"| {'knowledge base':<14} | {'tickets':>7} | {'backends':<20} | {'queries':>7} | {'mean overlap':>12} "
              f"| {'min overlap':>11} | {'identical top 10':>16} | {'max rel. score diff':>19} |")
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    for r in results:
        print(f"| {r['kb']:<14} | {r['tickets']:>7,} | {r['pair']:<20} | {r['queries']:>7} | {r['mean_overlap']:>12.3f} "
              f"| {r['min_overlap']:>11.2f} | {r['identical']:>16.1%} | {r['max_rel']:>19.2e} |")
    cmd = " ".join(["benchmarks/lexical_agreement.py"] + (argv if argv is not None else sys.argv[1:]))
    print(f"\nreproduce: .venv/bin/python {cmd}".rstrip())


if __name__ == "__main__":
    main()
