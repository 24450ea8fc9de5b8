"""How long should word2vec train on one knowledge base? (issue 12)

Label-free training learns its word vectors from the knowledge base alone, a corpus of 10^5 tokens where word2vec is
usually trained on 10^9. This script trains the knowledge base's word2vec (`training._unsupervised_parts`, the
vectors label-free training builds, every setting but the epochs as `label_free_config`) for several epoch counts
and ranks with SumEMB of those vectors alone (the IDF-weighted unit mean: E without its char-BiLSTM half, which the
network trains later), L1 distance, on:

- the mined held-out slice label-free training selects on (`mining.mine_pairs`: a held-out ticket's subject and
  first sentences against every ticket's view; MRR@10 of its own view), which needs no label;
- a labelled target the recipe never selects on: SeaMonkey's duplicates (each of a pair's tickets, subject and
  description, against the others; MRR@10 of its partner) or SemEval-2016 dev (each query's labelled candidates
  reranked; mean AP, relevant = label >= 3, the project's per-query AP).

    .venv/bin/python benchmarks/word2vec_epochs.py --kb seamonkey [--epochs 20,50,100,200,400]
    .venv/bin/python benchmarks/word2vec_epochs.py --kb semeval

Label-free training without the sentence encoder S trains word2vec for `unsupervised.W2V_UPDATES` token updates
(epochs = updates / tokens, 20 to 200: `unsupervised.word2vec_updates`); with S, for the config's 20 epochs.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recommender.data.importers import load  # noqa: E402
from recommender.evaluation.duplicates import duplicate_queries  # noqa: E402
from recommender.model.mining import MiningConfig, mine_pairs  # noqa: E402
from recommender.model.siamese import Featurizer  # noqa: E402
from recommender.model.training import _unsupervised_parts  # noqa: E402
from recommender.model.unsupervised import label_free_config  # noqa: E402
from recommender.model.vocab import EOS  # noqa: E402
from shared_data import SEMEVAL, seamonkey_links, seamonkey_tickets  # noqa: E402

K = 10


def sum_emb(tokens: list[str], vocab, vectors: np.ndarray, idf: np.ndarray) -> np.ndarray:
    """The IDF-weighted mean of the known words' vectors, unit length (`embeddings.sum_emb`, "idf_l2")."""
    ids = np.array([vocab.id(t) for t in tokens if t != EOS], dtype=np.int64)
    weights = idf[ids] if len(ids) else np.zeros(0)
    if weights.sum() <= 0:
        return np.zeros(vectors.shape[1])
    mean = weights @ vectors[ids] / weights.sum()
    return mean / max(float(np.linalg.norm(mean)), 1e-6)


def reciprocal_rank(distances: np.ndarray, truth: int) -> float:
    """1/rank of `truth` among `distances` (ties against it count as ahead), 0 beyond K."""
    rank = int((distances <= distances[truth]).sum())
    return 1.0 / rank if rank <= K else 0.0


def mean_and_stderr(values: list[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1) / np.sqrt(len(a)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kb", choices=["seamonkey", "semeval"], default="seamonkey")
    ap.add_argument("--epochs", default="20,50,100,200,400", help="comma-separated epoch counts")
    args = ap.parse_args(argv)
    epochs = [int(e) for e in args.epochs.split(",")]

    if args.kb == "seamonkey":
        tickets, dev = seamonkey_tickets(), None
        ids = [t.id for t in tickets]
        targets = duplicate_queries(ids, seamonkey_links(ids)).pairs
        target_name = f"duplicates MRR@{K} ({len(targets)} queries)"
    else:
        tickets, dev = load(SEMEVAL / "train-part2.xml").tickets, load(SEMEVAL / "dev.xml")
        target_name = "dev mean AP (queries with a relevant candidate)"
    mined = mine_pairs(tickets, MiningConfig(), seed=0)

    rows = []
    for n in epochs:
        started = time.time()
        config = label_free_config(pretrained=False, channels={"E": 1.0}, w2v_epochs=n)
        splitter, vocab, _, vectors, source, _, _ = _unsupervised_parts(config, tickets, [], 0, None, False)
        idf = vocab.idf()
        featurizer = Featurizer(config, None, None, splitter)

        def embed(subject: str, description: str, solution: str | None = None) -> np.ndarray:
            raw = featurizer.raw_components(subject, description, solution)
            return sum_emb([w for part in raw.values() for w in part], vocab, vectors, idf)

        views = np.array([embed(v.subject, v.description, v.solution or "") for v in mined.views])
        mined_rr = [reciprocal_rank(np.abs(views - embed(q.subject, q.description)).sum(1), int(truth))
                    for q, truth in zip(mined.held_out_queries, mined.held_out_truth)]
        if dev is None:
            position = {t.id: i for i, t in enumerate(tickets)}
            whole = np.array([embed(t.subject, t.description) for t in tickets])
            target = []
            for query, partner in targets:
                d = np.abs(whole - whole[position[query]]).sum(1)
                d[position[query]] = np.inf
                target.append(reciprocal_rank(d, position[partner]))
        else:
            target = semeval_aps(dev, embed)
        rows.append((n, source, mean_and_stderr(mined_rr), len(mined_rr), mean_and_stderr(target),
                     time.time() - started))
        print(f"{n} epochs done ({rows[-1][-1]:.0f} s)", file=sys.stderr, flush=True)

    print(f"\n`.venv/bin/python benchmarks/word2vec_epochs.py --kb {args.kb} --epochs {args.epochs}`\n")
    print(f"| word2vec | E alone: mined held-out MRR@{K} ({rows[0][3]} queries) | E alone: {target_name} | seconds |")
    print("|---|---|---|---|")
    for n, source, (m, m_se), _, (t, t_se), seconds in rows:
        print(f"| {source.removeprefix('trained on the knowledge base ')} | {m:.3f} ± {m_se:.3f} | "
              f"{t:.3f} ± {t_se:.3f} | {seconds:.0f} |")
    return 0


def semeval_aps(dev, embed) -> list[float]:
    """Average precision of each dev query whose candidates hold a relevant one, candidates ranked by E's L1."""
    tickets = dev.ticket_map()
    queries = {q.id: q for q in dev.queries}
    by_query: dict[str, list] = {}
    for pair in dev.pairs:
        by_query.setdefault(pair.query_id, []).append(pair)
    aps = []
    for qid, pairs in by_query.items():
        query = embed(queries[qid].subject, queries[qid].description)
        scored = sorted((float(np.abs(embed(tickets[p.ticket_id].subject, tickets[p.ticket_id].description)
                                      - query).sum()), p.score >= 3) for p in pairs)
        relevant = np.array([r for _, r in scored])
        if relevant.any():
            hits = np.cumsum(relevant)
            aps.append(float(np.sum(hits[relevant] / (np.flatnonzero(relevant) + 1)) / hits[-1]))
    return aps


if __name__ == "__main__":
    sys.exit(main())
