"""The variational Siamese network on the SeaMonkey duplicates (knowledge-base protocol of
`recommender/evaluation/duplicates.py`), beside BM25.

The network learns from the 1,076 bug reports alone: VAE pretraining on their text and pairs mined from them
(`mining.mine_pairs`); the duplicate links are only the truth, never trained on. Each ticket of a link queries the
knowledge base minus itself and must find its partner; MRR@10 and Acc@k with 95 % bootstrap intervals.

Systems: BM25; the network scanning every ticket (one query encoding, the MLP over all rows); the network over the
BM25 top K and over the topic pre-filter's top K (LDA, `model/topic_prefilter.py`); reciprocal-rank fusion of BM25
and the network.

    .venv/bin/python benchmarks/var_siamese_seamonkey.py [--seed 0] [--model-out DIR | --model DIR] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shared_data import seamonkey_links, seamonkey_tickets  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", type=json.loads, default={}, help="VarSiameseConfig fields as JSON")
    parser.add_argument("--model", type=Path, default=None, help="evaluate this saved model instead of training")
    parser.add_argument("--model-out", type=Path, default=None, help="save the trained model here")
    parser.add_argument("--candidates", type=int, default=100, help="K of the BM25 and topic pre-filters")
    parser.add_argument("--topics", type=int, default=50)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import torch

    from recommender.evaluation.duplicates import bm25_ranker, evaluate_duplicates, rrf_ranker
    from recommender.lexical.bm25 import Bm25Scorer
    from recommender.model.topic_prefilter import TopicPrefilter
    from recommender.model.var_siamese import VarSiamese, VarSiameseConfig, ranker

    torch.set_num_threads(1)
    tickets = seamonkey_tickets()
    links = seamonkey_links(t.id for t in tickets)
    started = time.time()
    if args.model:
        model = VarSiamese.load(args.model)
    else:
        model = VarSiamese(VarSiameseConfig.from_dict({"pairs": "mined", **args.config})).fit(
            tickets, None, seed=args.seed, progress=True, echo=lambda line: print(line, flush=True))
        if args.model_out:
            model.save(args.model_out)
    train_seconds = round(time.time() - started, 1)
    k = args.candidates
    topics = TopicPrefilter.fit(tickets, "lda", n_topics=args.topics, seed=args.seed)
    bm25 = bm25_ranker(tickets)
    scan = ranker(model, tickets)
    systems = {
        "BM25": bm25,
        "VarSiamese, every ticket": scan,
        f"VarSiamese over BM25 top {k}": ranker(model, tickets, Bm25Scorer(tickets).top_k, candidates=k),
        f"VarSiamese over LDA topics top {k}": ranker(model, tickets, topics.search, candidates=k),
        "RRF BM25 + VarSiamese (k=60)": rrf_ranker([bm25, scan], depth=len(tickets)),
    }
    rows = evaluate_duplicates(tickets, links, systems, seed=args.seed, progress=False)
    print(f"model {model.version} (trained in {train_seconds} s; pairs {model.meta.get('pairs')})")
    print("| system | queries | MRR@10 | Acc@1 | Acc@5 | Acc@10 |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['system']} | {r['queries']} | {r['MRR@10']:.3f} [{r['MRR@10_low']:.2f}, {r['MRR@10_high']:.2f}] | "
              f"{r['Acc@1']:.3f} | {r['Acc@5']:.3f} | {r['Acc@10']:.3f} [{r['Acc@10_low']:.2f}, {r['Acc@10_high']:.2f}] |")
    if args.json:
        args.json.write_text(json.dumps({"model": model.version, "config": model.config.to_dict(),
                                         "training": model.meta.get("training"), "train_seconds": train_seconds,
                                         "rows": [{k: v for k, v in r.items() if k != "ranks"} for r in rows]},
                                        indent=2))


if __name__ == "__main__":
    main()
