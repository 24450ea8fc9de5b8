"""How well does a query's best BM25 match match? A pointer for the off-topic score promise (issue 12).

ticketrec's lexical feature is bm25(q, t) / the query's best bm25 in the knowledge base, so every query's best lexical
match sits at lexical distance 0, an off-topic query's as much as a duplicate's. This prints, on a knowledge base with
duplicate links (SeaMonkey by default), bm25 as a share of the query's bm25 against its own text (the same IDF, avgdl,
k1, b and field weights; the query as a ticket of its subject and description): for each ticket of a link asked as a
query (its own ticket left out), its best other ticket and its partner, and for the off-topic queries of
`score_promises.py`, their best ticket. BM25 alone, no model.

    .venv/bin/python benchmarks/lexical_coverage.py [--kb ../shared/data/seamonkey/SeaMonkey_bugs.csv]
        [--links ../shared/data/seamonkey/SeaMonkey_bugs-combined.csv]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from score_promises import OFF_TOPIC
from shared_data import SEAMONKEY, SEAMONKEY_LINKS, seamonkey_links, seamonkey_tickets


def self_score(scorer, avgdl: float, subject: str, description: str) -> float:
    """bm25 of the query's text against a ticket made of that text, with the knowledge base's statistics (`avgdl`:
    its tickets' mean length in tokens)."""
    from recommender.lexical.bm25 import document_terms, idf, query_stems, term_score

    freq, length = document_terms(subject, description, "", scorer.weights)
    norm = scorer.k1 * (1.0 - scorer.b + scorer.b * length / avgdl)
    n = len(scorer)
    df = scorer.document_frequency
    stems = set(query_stems(f"{subject}\n{description}", df, n, scorer.max_terms))
    return float(sum(term_score(idf(df(s), n), freq.get(s, 0.0), norm, scorer.k1 + 1.0) for s in stems))


def quantiles(values, qs=(0.05, 0.25, 0.5, 0.75)) -> str:
    return " / ".join(f"{v:.2f}" for v in np.quantile(values, qs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kb", default=str(SEAMONKEY))
    ap.add_argument("--links", default=str(SEAMONKEY_LINKS))
    args = ap.parse_args()
    from recommender.lexical.bm25 import Bm25Scorer, document_terms

    for path in (args.kb, args.links):
        if not Path(path).exists():
            sys.exit(f"no file at {path}: pass --kb and --links")
    tickets = seamonkey_tickets(args.kb)
    scorer = Bm25Scorer(tickets)
    avgdl = float(np.mean([document_terms(t.subject, t.description, t.solution, scorer.weights)[1] for t in tickets]))
    by_id = {t.id: t for t in tickets}
    best, partner = [], []
    for a, b in seamonkey_links(by_id, args.links):
        for query, match in ((a, b), (b, a)):
            q = by_id[query]
            scores = scorer.scores(f"{q.subject}\n{q.description}")
            scores[scorer.row_of[query]] = 0.0
            own = self_score(scorer, avgdl, q.subject, q.description)
            best.append(scores.max() / own)
            partner.append(scores[scorer.row_of[match]] / own)
    print(f"knowledge base {args.kb} ({len(tickets)} tickets), {len(best)} duplicate queries\n")
    print("| bm25 / the query's bm25 against its own text | 5th pct / 25th / median / 75th |")
    print("|---|---|")
    print(f"| duplicate queries: best other ticket | {quantiles(best)} |")
    print(f"| duplicate queries: partner | {quantiles(partner)} |")
    for subject, description in OFF_TOPIC:
        scores = scorer.scores(f"{subject}\n{description}")
        print(f"| off-topic \"{subject}\": best ticket | {scores.max() / self_score(scorer, avgdl, subject, description):.2f} |")


if __name__ == "__main__":
    main()
