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
  reranked; mean AP over the queries with a relevant one, relevant = label >= 3: `training.GroupTable`).

    .venv/bin/python benchmarks/word2vec_epochs.py --kb seamonkey [--epochs 20,50,100,200,400]
    .venv/bin/python benchmarks/word2vec_epochs.py --kb semeval
    .venv/bin/python benchmarks/word2vec_epochs.py --kb seamonkey --epochs 400 --seeds 0,1,2,3,4  # the seed's spread

Label-free training without the sentence encoder S trains word2vec for `unsupervised.W2V_UPDATES` token updates
(epochs = updates / tokens, 20 to 400: `unsupervised.word2vec_updates`); with S, for the config's 20 epochs.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recommender.data.importers import load  # noqa: E402
from recommender.evaluation.duplicates import duplicate_queries  # noqa: E402
from recommender.model.embeddings import sum_emb  # noqa: E402
from recommender.model.mining import MiningConfig, mine_pairs  # noqa: E402
from recommender.model.pairs import PairSet  # noqa: E402
from recommender.model.siamese import Featurizer  # noqa: E402
from recommender.model.training import GroupTable, _unsupervised_parts  # noqa: E402
from recommender.model.grid_ranks import MRR_K, reciprocal_ranks  # noqa: E402
from recommender.model.unsupervised import label_free_config  # noqa: E402
from recommender.model.vocab import EOS  # noqa: E402
from shared_data import SEMEVAL, seamonkey_links, seamonkey_tickets  # noqa: E402


class SumEmbAlone:
    """SumEMB E of texts (`embeddings.sum_emb`, the model's "idf_l2": the IDF-weighted unit mean) over the word2vec
    vectors alone, without the char-BiLSTM half the network trains."""

    def __init__(self, config, splitter, vocab, vectors: np.ndarray):
        self.featurizer = Featurizer(config, None, None, splitter)
        self.vocab, self.words, self.idf = vocab, torch.from_numpy(vectors), torch.from_numpy(vocab.idf())

    def __call__(self, items) -> np.ndarray:
        """[n, dim] E of `items` (tickets or queries: subject, description and solution, merged)."""
        out = np.zeros((len(items), self.words.shape[1]), dtype=np.float32)
        for i, item in enumerate(items):
            raw = self.featurizer.raw_components(item.subject, item.description, getattr(item, "solution", None))
            ids = [self.vocab.id(w) for part in raw.values() for w in part if w != EOS]
            if ids:
                index = torch.tensor([ids])
                out[i] = sum_emb(self.words, index, torch.ones(index.shape), self.idf)[0].numpy()
        return out


def l1(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[len(a), len(b)] L1 distances."""
    return np.abs(a[:, None, :] - b[None, :, :]).sum(-1)


def mean_and_stderr(values: np.ndarray) -> tuple[float, float]:
    return float(values.mean()), float(values.std(ddof=1) / np.sqrt(len(values)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kb", choices=["seamonkey", "semeval"], default="seamonkey")
    ap.add_argument("--epochs", default="20,50,100,200,400", help="comma-separated epoch counts")
    ap.add_argument("--seeds", default="0",
                    help="comma-separated word2vec seeds (each epoch count with each; the mined slice is seed 0's)")
    args = ap.parse_args(argv)
    epochs = [int(e) for e in args.epochs.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]

    if args.kb == "seamonkey":
        tickets = seamonkey_tickets()
        ids = [t.id for t in tickets]
        position = {tid: i for i, tid in enumerate(ids)}
        links = duplicate_queries(ids, seamonkey_links(ids)).pairs
        queries = np.array([position[q] for q, _ in links])
        partners = np.array([position[p] for _, p in links])
        target_name = f"duplicates MRR@{MRR_K} ({len(links)} queries)"
    else:
        tickets, dev = load(SEMEVAL / "train-part2.xml").tickets, load(SEMEVAL / "dev.xml")
        pairs = PairSet.from_dataset(dev, "dev")
        table = GroupTable(pairs.q, pairs.y, 3.0)
        target_name = f"dev mean AP ({int((table.n_relevant > 0).sum())} queries with a relevant candidate)"
    mined = mine_pairs(tickets, MiningConfig(), seed=0)

    rows = []
    for n, seed in ((n, seed) for n in epochs for seed in seeds):
        started = time.time()
        config = label_free_config(pretrained=False, channels={"E": 1.0}, w2v_epochs=n)
        splitter, vocab, _, vectors, source, _, _ = _unsupervised_parts(config, tickets, [], seed, None, False)
        embed = SumEmbAlone(config, splitter, vocab, vectors)
        views = embed(mined.views)
        mined_rr = reciprocal_ranks(l1(embed(mined.held_out_queries), views), mined.held_out_truth)
        if args.kb == "seamonkey":
            whole = embed([dataclasses.replace(t, solution="") for t in tickets])  # the duplicates' query text
            d = l1(whole[queries], whole)
            d[np.arange(len(queries)), queries] = np.inf  # a query does not find itself
            target = reciprocal_ranks(d, partners)
        else:
            candidates = embed([dataclasses.replace(t, solution="") for t in pairs.tickets])  # subject + description
            d = np.abs(embed(pairs.queries)[pairs.q] - candidates[pairs.t]).sum(1)
            target = table.per_query_ap(-d)[table.n_relevant > 0] / 100.0
        rows.append((n, seed, source, mean_and_stderr(mined_rr), len(mined_rr), mean_and_stderr(target),
                     time.time() - started))
        print(f"{n} epochs, seed {seed} done ({rows[-1][-1]:.0f} s)", file=sys.stderr, flush=True)

    print(f"\n`.venv/bin/python benchmarks/word2vec_epochs.py --kb {args.kb} --epochs {args.epochs} "
          f"--seeds {args.seeds}`\n")
    print(f"| word2vec | seed | E alone: mined held-out MRR@{MRR_K} ({rows[0][4]} queries) | E alone: {target_name} | "
          "seconds |")
    print("|---|---|---|---|---|")
    for n, seed, source, (m, m_se), _, (t, t_se), seconds in rows:
        print(f"| {source.removeprefix('trained on the knowledge base ')} | {seed} | {m:.3f} ± {m_se:.3f} | "
              f"{t:.3f} ± {t_se:.3f} | {seconds:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
