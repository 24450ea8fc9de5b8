"""Would following engineers' links pay? Simulated YES judgements read as links between tickets (issue 12).

A YES says "this ticket solves that query"; when the query is itself a ticket of the knowledge base (a new ticket,
imported once filed), the two are one problem, and links chain (duplicates form groups). A serving-time use of
that: show each result's linked tickets right after it, each with its own score, so a ticket the model ranks low
rides on a good result an engineer already tied it to. Nothing in ticketrec does this; this benchmark says whether
it would pay on a knowledge base with duplicate links, before anyone builds it.

The judgements are `feedback_seamonkey.py`'s (half of the links, seeded: each ticket of a pair, asked as a query,
gets YES on its partner), so the groups are the connected components of the judged pairs. The model ranks the
other half's queries as served (`EngineRanker`: the knowledge base minus the query ticket); the query's own ticket is
never shown. Prints, per split (seed, half), MRR@10 and Acc@10 of the model's top 10 and of the same list with each
result's linked tickets moved (or added) right after it, and the mean change; also how many held-out queries
have a partner that some judged pair holds (only those can gain), how many of those find it first already, how many
have a ticket of the partner's group right above the partner already (following the link changes nothing), and how
many partners the links moved up and down.

    .venv/bin/python benchmarks/feedback_links.py --model M [--kb … --links …] [--seeds 0,1,2]

M is a model trained on the same knowledge base (e.g. `ticketrec train` label-free after importing it).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shared_data import SEAMONKEY, SEAMONKEY_LINKS, feedback_split, seamonkey_links, seamonkey_tickets

K = 10


def groups_of(pairs) -> dict[str, set[str]]:
    """Each ticket of `pairs` → the other tickets of its connected component."""
    import numpy as np
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    ids = sorted({t for pair in pairs for t in pair})
    at = {t: i for i, t in enumerate(ids)}
    edges = np.array([(at[a], at[b]) for a, b in pairs], np.int64).reshape(-1, 2)
    graph = coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(len(ids), len(ids)))
    _, label = connected_components(graph, directed=False)
    members: dict[int, set[str]] = {}
    for t, c in zip(ids, label):
        members.setdefault(int(c), set()).add(t)
    return {t: members[int(c)] - {t} for t, c in zip(ids, label)}


def follow(ranked: list[tuple[str, float]], groups: dict[str, set[str]]) -> list[str]:
    """The top K of `ranked` (the whole knowledge base but the query, best first, with g) with each shown result's
    linked tickets right after it, in the order of their own g; a linked ticket `ranked` lacks (the query's own)
    is not shown."""
    score = dict(ranked)
    out: list[str] = []
    for tid, _ in ranked:
        if len(out) >= K:
            break
        if tid in out:
            continue
        out.append(tid)
        linked = [t for t in groups.get(tid, ()) if t not in out and t in score]
        out.extend(sorted(linked, key=lambda t: -score[t]))
    return out[:K]


def reciprocal_rank(top: list[str], partner: str) -> float:
    return 1.0 / (top.index(partner) + 1) if partner in top else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a model trained on the knowledge base (a model directory)")
    ap.add_argument("--kb", default=str(SEAMONKEY))
    ap.add_argument("--links", default=str(SEAMONKEY_LINKS))
    ap.add_argument("--seeds", default="0,1,2", help="the splits' seeds; each gives two splits (halves 0 and 1)")
    args = ap.parse_args()

    from tqdm import tqdm

    from recommender.evaluation.duplicates import EngineRanker
    from recommender.model.bundle import TicketModel

    if not Path(args.kb).exists():
        sys.exit(f"no knowledge base at {args.kb}: pass --kb (and --links)")
    tickets = seamonkey_tickets(args.kb)
    links = seamonkey_links([t.id for t in tickets], args.links)
    by_id = {t.id: t for t in tickets}
    model = TicketModel.load(args.model)
    queries = sorted({tid for pair in links for tid in pair})
    with EngineRanker(model, tickets, progress=False) as ranker:
        ranked = {q: ranker.scored(by_id[q], len(tickets)) for q in tqdm(queries, desc="ranking", unit="query")}

    print(f"# Following engineers' links: model {model.version}, {len(links)} duplicate links, K = {K}\n")
    print("| split (seed, half) | judged pairs | held-out queries | MRR@10: model → with links | "
          "Acc@10: model → with links | partner linked | first already | its group right above it | "
          "moved up | moved down |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    changes = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for half in (0, 1):
            given, held_out = feedback_split(links, seed, half)
            groups = groups_of(given)
            rr0 = rr1 = hit0 = hit1 = 0.0
            linked = first = adjacent = up = down = n = 0
            for a, b in held_out:
                for query, partner in ((a, b), (b, a)):
                    before = [tid for tid, _ in ranked[query][:K]]
                    after = follow(ranked[query], groups)
                    r0, r1 = reciprocal_rank(before, partner), reciprocal_rank(after, partner)
                    rr0, rr1 = rr0 + r0, rr1 + r1
                    hit0 += partner in before
                    hit1 += partner in after
                    up, down = up + (r1 > r0), down + (r1 < r0)
                    if partner in groups:  # a judged pair holds the partner: a link could bring it up
                        linked += 1
                        at = before.index(partner) if partner in before else None
                        first += at == 0
                        adjacent += bool(at) and before[at - 1] in groups[partner]
                    n += 1
            changes.append((rr1 - rr0) / n)
            print(f"| {seed}, {half} | {len(given)} | {n} | {rr0 / n:.3f} → {rr1 / n:.3f} | "
                  f"{hit0 / n:.3f} → {hit1 / n:.3f} | {linked} | {first} | {adjacent} | {up} | {down} |")
    print(f"\nmean change of MRR@10 over the {len(changes)} splits: {sum(changes) / len(changes):+.4f}")
    print("\ncommand: .venv/bin/python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]))


if __name__ == "__main__":
    main()
