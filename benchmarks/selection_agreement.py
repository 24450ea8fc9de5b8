"""Does the label-free weight selection agree with real relevance? (issue 12)

Label-free training selects its channel and pair weights on mined queries (`weight_selection.select_by_rank`: the
held-out and paraphrase slices). This script rebuilds those slices for a saved label-free model exactly as its
training did (same tickets, mining config and seed; the reproduced selection is printed beside the recorded one),
with the condition that the held-out tickets pasted whole set on it when the training used one, ranks every
combination of the weight grid on them, and scores the same combinations on a real target the selection never sees:

- `--kb seamonkey`: SeaMonkey's duplicate pairs (each ticket of a pair queries the knowledge base minus itself; the
  lexical feature normalised over the other tickets, as the engine's candidates do), MRR@10 and Acc@10;
- `--kb semeval`: SemEval-2016 dev, reranking each query's labelled candidates, MAP (relevant = label ≥ 3; the
  project's per-query AP, not the official scorer).

It prints the selected combination, BM25 alone and the best combination of each side, how the combinations the
selection cannot tell apart (eligible, and within one standard error of the best eligible mined MRR@10) fare on
the target, and the Spearman correlation of the two over the whole grid. A diagnostic: nothing here is selected on the target.
Beside the reproduced selection it counts the queries that tie within 1e-4 with another view under it (copies of one
ticket): float noise between the training run and this rebuild breaks such ties either way, so the reproduced MRR@10
can differ a little from the recorded one.

    .venv/bin/python benchmarks/selection_agreement.py --model $TICKETREC_HOME/models/paper --kb seamonkey
    .venv/bin/python benchmarks/selection_agreement.py --model DIR --kb semeval   # trained on train-part2's tickets

The model must have been trained label-free on exactly these tickets (SeaMonkey_bugs.csv; SemEval's
train-part2.xml) at code that mines the same pairs; the script refuses otherwise. Every combination is ranked:
about 26,000 for the paper's channels (a few minutes), several times more with S.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recommender.data.importers import load  # noqa: E402
from recommender.data.store import Dataset  # noqa: E402
from recommender.data.records import query_text  # noqa: E402
from recommender.evaluation.duplicates import duplicate_queries, query_of  # noqa: E402
from recommender.lexical.bm25 import Bm25Scorer  # noqa: E402
from recommender.model.bundle import TicketModel  # noqa: E402
from recommender.model.mining import MiningConfig, mine_pairs  # noqa: E402
from recommender.model.pairs import dataset_fingerprint  # noqa: E402
from recommender.model.augment import vocabulary_augmenter  # noqa: E402
from recommender.model.weight_selection import (PASTED, GridRanking, RankedSlice, combination_spec,  # noqa: E402
                                                observable_pairs, rank_distances, selection_slices)

from shared_data import SEMEVAL, seamonkey_links, seamonkey_tickets  # noqa: E402


def knowledge_base(kind: str) -> list:
    """The tickets the model was trained on."""
    if kind == "seamonkey":
        return seamonkey_tickets()
    return load(SEMEVAL / "train-part2.xml").tickets


def mined_slices(model: TicketModel, model_dir: Path, tickets: list) -> dict[str, RankedSlice]:
    """The held-out and paraphrase slices of the model's training, and the pasted one when it used it, rebuilt
    (raises SystemExit when the tickets or the mined pairs differ from the training's)."""
    training = model.meta.get("training") or {}
    if training.get("mode") != "label-free":
        raise SystemExit(f"{model_dir} was not trained label-free; nothing to compare")
    tickets = list({t.id: t for t in tickets}.values())
    if dataset_fingerprint(Dataset(tickets), None) != model.meta.get("data_fingerprint"):
        raise SystemExit(f"{model_dir} was trained on other tickets than --kb's; train it on them first")
    seed = int(model.meta["seed"])
    recorded = training["mining"]
    mining = MiningConfig.from_dict(recorded["config"])
    augmenter = vocabulary_augmenter(model.vocab, np.load(model_dir / "word2vec.npy"), seed)
    mined = mine_pairs(tickets, mining, seed, augmenter)
    differs = [k for k, v in mined.stats.items() if k != "config" and recorded.get(k) != v]
    if differs:
        raise SystemExit(f"the pairs mined now differ from the training's ({', '.join(differs)}): the model was "
                         "trained at other code; retrain it")
    views = model.prepare(list(mined.views), "ticket")
    held = model.prepare(mined.held_out_queries, "query")
    scorer = Bm25Scorer(mined.views) if model.siamese_config.bm25 > 0 else None
    return selection_slices(model, mined, held, views, scorer, observable_pairs(model.siamese_config, mined), seed,
                            mining.held_out_pasted)


def duplicates_target(model: TicketModel, tickets: list):
    """(name, score of a spec → (MRR@10, Acc@10)) over SeaMonkey's duplicate pairs, ranked as the engine ranks."""
    ids = [t.id for t in tickets]
    row = {tid: i for i, tid in enumerate(ids)}
    links = seamonkey_links(ids)
    pairs = duplicate_queries(ids, links).pairs
    queries = [query_of(tickets[row[a]]) for a, _ in pairs]
    own = np.array([row[a] for a, _ in pairs])
    truth = np.array([row[b] for _, b in pairs])
    dist = rank_distances(model, model.prepare(queries, "query"), model.prepare(tickets, "ticket"))
    scorer = Bm25Scorer(tickets)
    raw = np.stack([scorer.scores(query_text(tickets[i])) for i in own])
    raw[np.arange(len(own)), own] = 0.0  # the query ticket is not a candidate: the others' maximum normalises
    lexical = raw / np.maximum(raw.max(axis=1, keepdims=True), 1e-12)
    dist[:, :, np.arange(len(own)), own] = np.inf  # and it never ranks
    lexical[np.arange(len(own)), own] = -np.inf
    target = RankedSlice(dist, lexical, truth, [True] * dist.shape[0])

    def score(spec: dict) -> tuple[float, float]:
        rr = target.reciprocal_ranks(spec)
        return float(rr.mean()), float((rr >= 0.1).mean())

    return f"SeaMonkey duplicates ({len(pairs)} queries): MRR@10, Acc@10", score


def semeval_target(model: TicketModel, path: Path = SEMEVAL / "dev.xml"):
    """(name, score of a spec → (MAP,)) reranking the labelled candidates of SemEval-2016 dev (or the file `path`)."""
    from recommender.model.training import GroupTable, PairSet, PreparedPairs, lexical_features, pair_distances

    dev = load(path)
    pairs = PairSet.from_dataset(dev, "dev")
    ratio = lexical_features(pairs, Bm25Scorer(dev.tickets))
    prepared = PreparedPairs.of(model, pairs, ratio)
    dist = pair_distances(model, prepared.queries, prepared.tickets, pairs)  # [N, P, C]
    table = GroupTable(pairs.q, pairs.y, 3.0)

    def score(spec: dict) -> tuple[float]:
        pw = np.array([v for *_, v in spec["pairs"]])
        cw = np.array(list(spec["channels"].values()))
        d = np.einsum("npc,p,c->n", dist, pw, cw) + spec["bm25"] * (1.0 - ratio)
        return (table.map(np.exp(-d)),)

    return f"SemEval-2016 dev rerank ({len(np.unique(pairs.q))} queries): MAP", score


def near_ties(ranked: RankedSlice, spec: dict, tolerance: float = 1e-4) -> int:
    """How many queries of `ranked` have another view within `tolerance` of their own view's distance under `spec`
    (copies of one ticket): float noise between the training's run and this rebuild breaks such ties either way."""
    d = ranked.distances(spec)
    own = d[np.arange(len(ranked.truth)), ranked.truth][:, None]
    return int(((np.abs(d - own) <= tolerance).sum(axis=1) > 1).sum())


def short(spec: dict) -> str:
    channels = ", ".join(f"{c} {v:g}" for c, v in spec["channels"].items() if v)
    pairs = ", ".join(f"{a}-{b} {v:.3g}" for a, b, v in spec["pairs"] if v)
    return f"{channels or 'no channel'}; BM25 {spec['bm25']:g}; pairs {pairs}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a label-free model directory")
    parser.add_argument("--kb", choices=["seamonkey", "semeval"], required=True,
                        help="the tickets it was trained on, and the target: duplicates or dev")
    args = parser.parse_args(argv)
    import torch
    from scipy.stats import spearmanr

    torch.set_num_threads(os.cpu_count() or 1)
    started = time.time()
    model_dir = Path(args.model)
    model = TicketModel.load(model_dir)
    tickets = knowledge_base(args.kb)
    slices = mined_slices(model, model_dir, tickets)
    name, target = (duplicates_target(model, tickets) if args.kb == "seamonkey" else semeval_target(model))
    spec, grid = model.net.metric_spec(), model.siamese_config.grid
    condition = slices.pop(PASTED, None)
    ranking = GridRanking.of(list(slices.values()), spec, grid, condition=condition)  # the selection's own rule
    combos = [combination_spec(spec, c) for c in ranking.combinations]
    mined, scores = ranking.means, np.array([target(c) for c in combos])
    chosen, top, stderr = ranking.chosen, ranking.best, ranking.stderr
    near = ranking.near()
    bm25 = [i for i, c in enumerate(combos) if not any(c["channels"].values())]
    base = max(bm25, key=lambda i: mined[i]) if bm25 else None
    best_target = int(np.argmax(scores[:, 0]))
    recorded = model.meta["training"].get("weight_selection") or {}

    print(f"\n### Weight selection on mined queries against {name}\n")
    print(f"command: .venv/bin/python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"model {model_dir} ({model.version[:12]}); {len(combos):,} weight combinations; mined queries: "
          + ", ".join(f"{len(s.truth)} {k}" for k, s in slices.items())
          + f"; selection reproduced: {mined[chosen]:.4f} (training recorded {recorded.get('value', float('nan')):.4f}; "
          + ", ".join(f"{near_ties(s, combos[chosen])} {k}" for k, s in slices.items())
          + " queries tie within 1e-4 with another view under it, ties that float noise between the training run and "
            "this rebuild can break either way)\n")
    metrics = name.split(": ", 1)[1].split(", ")
    print("| combination | mined MRR@10 | " + " | ".join(metrics) + " | weights |")
    print("|---|---|" + "---|" * len(metrics) + "---|")
    rows = [("selected (simplest within one standard error)", chosen),
            ("best on the mined queries" + (" (eligible)" if condition is not None else ""), top)]
    rows += [("BM25 alone", base)] if base is not None else []
    rows += [("best on the target", best_target)]
    for label, i in rows:
        print(f"| {label} | {mined[i]:.3f} | " + " | ".join(f"{v:.3f}" for v in scores[i]) + f" | {short(combos[i])} |")
    if condition is not None:
        print(f"\nCondition: {int(ranking.eligible.sum()):,} of {len(combos):,} combinations rank the "
              f"{len(condition.truth)} held-out tickets pasted whole within one smoothed standard error "
              f"({ranking.condition_stderr:.4f}) of the best ({ranking.condition_means[ranking.condition_best]:.4f}); "
              f"the selected one {ranking.condition_means[chosen]:.4f}.")
    print(f"\nWithin one standard error ({stderr:.3f}) of the best mined MRR@10: {len(near)}"
          f"{' eligible' if condition is not None else ''} combinations; on the "
          f"target {scores[near, 0].min():.3f}–{scores[near, 0].max():.3f} (median {np.median(scores[near, 0]):.3f})"
          + (f", {int((scores[near, 0] > scores[base, 0]).sum())} of them above BM25 alone" if base is not None else "")
          + f". The best on the target is {(mined[top] - mined[best_target]) / stderr:.1f} standard errors below the "
            f"best mined MRR@10.")
    print("Each target figure at its best, over the grid / over the combinations within one standard error: "
          + ", ".join(f"{m} {scores[:, j].max():.3f} / {scores[near, j].max():.3f}" for j, m in enumerate(metrics))
          + ".")
    print(f"Spearman correlation of mined MRR@10 and the target over the grid: "
          f"{spearmanr(mined, scores[:, 0])[0]:.3f}.  ({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
