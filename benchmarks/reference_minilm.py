"""Zero-shot MiniLM on SeaMonkey's duplicates as the data's README measured it, and as `ticketrec evaluate` does.

../shared/data/README.md gives reference figures from an independent script (text = Summary + " . " + Description,
as written); `ticketrec evaluate --duplicates` scores the same encoder on the texts as ticketrec reads them (HTML
entities unescaped, tags dropped, white space folded; fields joined by a newline). This prints both on the same 92
queries, so that a reader can tell the baseline of README's tables from the reference's:

    .venv/bin/python benchmarks/reference_minilm.py
"""
from __future__ import annotations

import argparse
import sys
import time

from shared_data import SEAMONKEY, SEAMONKEY_LINKS, seamonkey_links, seamonkey_tickets


def main(argv=None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    missing = [str(p) for p in (SEAMONKEY, SEAMONKEY_LINKS) if not p.exists()]
    if missing:
        sys.exit(f"missing data: {', '.join(missing)} (see ../shared/data/README.md)")
    from recommender.evaluation.duplicates import (duplicate_queries, minilm_ranker, partner_ranks, rank_metrics,
                                                   top_rows)
    from recommender.model.pretrained import get_encoder

    started = time.time()
    tickets = seamonkey_tickets(SEAMONKEY)
    by_id = {t.id: t for t in tickets}
    queries = duplicate_queries(by_id, seamonkey_links(by_id, SEAMONKEY_LINKS)).pairs
    encoder = get_encoder(backend="torch").model  # sentence-transformers itself: no cleaning of ours
    ids = [t.id for t in tickets]

    def raw_ranker(join: str):
        def text(t):
            return t.subject + join + (t.description or "")

        matrix = encoder.encode([text(t) for t in tickets], normalize_embeddings=True, batch_size=32)
        row = {tid: r for r, tid in enumerate(ids)}
        return lambda query, n: [ids[int(r)] for r in top_rows(matrix @ matrix[row[query.id]], n)]

    systems = {'data README\'s text: Summary + " . " + Description, as written': raw_ranker(" . "),
               "the same, joined by a newline": raw_ranker("\n"),
               "ticketrec evaluate's MiniLM row: cleaned, joined by a newline": minilm_ranker(tickets)}
    print(f"SeaMonkey duplicates, {len(queries)} queries, all-MiniLM-L6-v2 zero-shot (sentence-transformers, "
          "float32), cosine against every other ticket\n")
    print("| text | MRR@10 | Acc@1 | Acc@5 | Acc@10 |\n|---|---|---|---|---|")
    for name, ranker in systems.items():
        m = rank_metrics(partner_ranks(by_id, queries, ranker))
        print(f"| {name} | " + " | ".join(f"{m[k].mean():.3f}" for k in ("MRR@10", "Acc@1", "Acc@5", "Acc@10"))
              + " |")
    print(f"\n{time.time() - started:.0f} s; `.venv/bin/python benchmarks/reference_minilm.py`")


if __name__ == "__main__":
    main()
