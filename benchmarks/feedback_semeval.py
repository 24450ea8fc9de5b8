"""Feedback with more judgements than SeaMonkey's links give: SemEval-2016 train-part2's labels as engineers' feedback.

SeaMonkey's simulation (`feedback_seamonkey.py`) gives at most 23 duplicate pairs as feedback. Here a label-free model
trained on SemEval-2016 train-part2's tickets (`label_free_seeds.py --kb semeval`, labels dropped) gets train-part2's
670 labelled pairs (67 queries; PerfectMatch as YES, Relevant as REL, Irrelevant as NO) as judgements:
`ticketrec train --with-feedback --train train-part2.xml --base M` over a home that holds train-part2's tickets (the
judgements fine-tune the model exactly as stored feedback does). Both models are then evaluated on SemEval-2016 dev,
50 queries and 500 tickets that neither saw, under the rerank and knowledge-base protocols (`ticketrec evaluate
--model --test`'s systems), and the script prints the paired difference after − before, query by query.

    .venv/bin/python benchmarks/feedback_semeval.py --model M [--seed 0] [--keep DIR]

M is a model trained label-free on train-part2's tickets.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from feedback_seamonkey import TemporaryHome, print_outcome
from shared_data import SEMEVAL

#: (label, protocol, key of `metrics.per_query_values`) of the table.
FIGURES = (("official MAP", "rerank", "official_map"), ("official MRR", "rerank", "official_mrr"),
           ("KB MAP@10", "kb", "map@10"), ("KB Acc@10", "kb", "acc@10"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the model before feedback (trained on train-part2's tickets)")
    ap.add_argument("--train", default=str(SEMEVAL / "train-part2.xml"), help="the labelled pairs given as feedback")
    ap.add_argument("--test", default=str(SEMEVAL / "dev.xml"), help="where both models are evaluated")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", default=None, help="copy the fine-tuned model here")
    args = ap.parse_args()
    import numpy as np
    import torch

    from recommender.evaluation import experiments as X
    from recommender.evaluation import metrics as M
    from recommender.evaluation.saved_model import aligned_per_query
    from recommender.model.bundle import TicketModel

    for path in (args.train, args.test):
        if not Path(path).exists():
            sys.exit(f"no file at {path}: pass --train and --test")
    home = TemporaryHome.create()
    run, commands = home.run, home.commands
    run("import", args.train, "--quiet")
    after_dir = home.path / "after"
    run("train", "--with-feedback", "--train", args.train, "--base", args.model, "--out", str(after_dir),
        "--seed", str(args.seed))
    before, after = TicketModel.load(args.model), TicketModel.load(after_dir)
    if args.keep:
        shutil.copytree(after_dir, args.keep)

    torch.set_num_threads(1)
    split = X._open_split("test", Path(args.test), None)  # in memory: no store to close
    per_query, means = {}, {}
    for name, model in (("before feedback", before), ("after feedback", after)):
        _, rr, kb = X._evaluate_system(X.ModelSystem(model, split, 1000), split, 10, False)
        per_query[name] = {"rerank": M.per_query_values(rr.run(), rr.qrels),
                           "kb": M.per_query_values(kb.run(), kb.qrels)}
        means[name] = {label: float(np.mean([v[key] for v in per_query[name][protocol].values()]))
                       for label, protocol, key in FIGURES}
    data = split.describe()
    print(f"# Feedback: {args.train}'s labelled pairs as judgements; evaluated on {args.test} "
          f"({data['queries']} queries, {data['tickets']} tickets)\n")
    print("| model | " + " | ".join(label for label, *_ in FIGURES) + " |")
    print("|---|" + "---|" * len(FIGURES))
    for name, row in means.items():
        print(f"| {name} ({(before if name.startswith('before') else after).version[:12]}) | "
              + " | ".join(f"{row[label]:.2f}" if protocol == "rerank" else f"{row[label]:.3f}"
                           for label, protocol, _ in FIGURES) + " |")
    gains = {label: M.paired_bootstrap_difference(
        *aligned_per_query(per_query, "after feedback", "before feedback", protocol, key), seed=args.seed)
        for label, protocol, key in FIGURES}
    print_outcome(gains, after, commands)


if __name__ == "__main__":
    main()
