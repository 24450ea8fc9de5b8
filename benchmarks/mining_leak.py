"""Does the mined held-out task leak the answer through the query's length? (issue 12)

Label-free training mines (query, view) pairs: a ticket's subject plus the start of its description is the query,
the rest of the ticket its view. If the query's share of a short description is fixed (e.g. exactly half), the
query's length tells the view's, and a network can learn that instead of the text. This script ranks every mined
view for a sample of queries with BM25 alone and with BM25 plus a length-match indicator (1 when the view's
description has the query prefix's word count ±1), for the current cut (`mining.split_ticket`: whole sentences)
and for the earlier cut (the first 30 words, at most half). A leak shows as the indicator raising MRR@10.

    .venv/bin/python benchmarks/mining_leak.py [--kb ../shared/data/seamonkey/SeaMonkey_bugs.csv] [--queries 300]

Ties are ranked at their mid-rank (a constant feature neither helps nor hurts).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recommender.data.importers import load  # noqa: E402
from recommender.data.records import Query, Ticket  # noqa: E402
from recommender.lexical.bm25 import Bm25Scorer  # noqa: E402
from recommender.model.mining import split_ticket  # noqa: E402
from shared_data import SEAMONKEY, SEAMONKEY_MAP  # noqa: E402

WEIGHTS = (0.1, 0.3, 1.0)


def word_cut(ticket: Ticket, prefix_words: int = 30) -> tuple[Query, Ticket] | None:
    """The earlier cut: the description's first `prefix_words` words (at most half of them) go to the query."""
    words = (ticket.description or "").split()
    if not ticket.subject.strip() or not words:
        return None
    take = min(prefix_words, len(words) // 2)
    return (Query(ticket.subject, " ".join(words[:take]), id=ticket.id),
            Ticket(ticket.id, "", " ".join(words[take:]), ticket.solution))


def mrr_at_10(scores: list[np.ndarray], own: np.ndarray) -> float:
    """Mean reciprocal mid-rank of each query's own view within the top 10."""
    out = []
    for s, i in zip(scores, own):
        rank = (s > s[i]).sum() + ((s == s[i]).sum() - 1) / 2 + 1
        out.append(1.0 / rank if rank <= 10 else 0.0)
    return float(np.mean(out))


def measure(tickets: list[Ticket], cut, n_queries: int, seed: int) -> dict:
    split = [s for s in (cut(t) for t in tickets) if s is not None]
    queries, views = [q for q, _ in split], [v for _, v in split]
    scorer = Bm25Scorer(views)
    view_len = np.array([len(v.description.split()) for v in views])
    sample = np.random.default_rng(seed).permutation(len(queries))[:n_queries]
    bm25, match = [], []
    for i in sample:
        s = scorer.scores(f"{queries[i].subject}\n{queries[i].description}")
        bm25.append(s / max(float(s.max()), 1e-9))
        match.append((np.abs(view_len - len(queries[i].description.split())) <= 1).astype(np.float64))
    row = {"queries": len(sample), "with prefix": float(np.mean([bool(q.description) for q in queries])),
           "BM25": mrr_at_10(bm25, sample), "length match alone": mrr_at_10(match, sample)}
    for w in WEIGHTS:
        row[f"BM25 + {w:g}·match"] = mrr_at_10([b + w * m for b, m in zip(bm25, match)], sample)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kb", default=str(SEAMONKEY),
                    help="a CSV with Issue id, Summary and Description columns (SeaMonkey's export)")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not Path(args.kb).is_file():
        raise SystemExit(f"error: {args.kb} not found (the shared SeaMonkey export; see ../shared/data/README.md)")
    tickets = load(args.kb, mapping=SEAMONKEY_MAP).tickets
    rows = {"sentence cut (current)": measure(tickets, lambda t: split_ticket(t, 30), args.queries, args.seed),
            "first 30 words, at most half (earlier)": measure(tickets, word_cut, args.queries, args.seed)}
    columns = list(next(iter(rows.values())))
    print(f"\nHeld-out leak of the mined task: {len(tickets):,} tickets of {args.kb}; MRR@10 of the own view among "
          "all views (mid-rank ties)\n")
    print("| cut | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name, row in rows.items():
        cells = [f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]) for c in columns]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("Command: .venv/bin/python benchmarks/mining_leak.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
