"""Is re-selecting the weights on a few dozen judgements worth it? Feedback's gate, measured on labels nobody tuned on.

`train --with-feedback` re-selects the channel and pair weights on the judged queries only when the weights selected
on other folds rank each fold better than the model's, by more than `--gates` standard errors of the paired difference
(`feedback.cross_validated_selection`; today one). Here SemEval-2016 train-part2's labelled pairs play the judgements:
each draw takes N of its query texts at random with all their relevant judgements (one query judged relevant to
several questions is several judged queries, as stored feedback makes them), decides as feedback does, and scores the
weights it would re-select on dev's 50 queries (rerank MAP, `selection_agreement.semeval_target`; the model's own
weights give its official MAP). A gate's expected change is the mean over the draws of the dev change where it
re-selects and 0 where it keeps the weights; "always" re-selects in every draw.

    .venv/bin/python benchmarks/feedback_gate.py --model M [--sizes 10,20,40] [--draws 25] [--json OUT]
        [--train ../shared/data/semeval2016/train-part2.xml --test ../shared/data/semeval2016/dev.xml]

M is a model trained label-free on train-part2's tickets (`label_free_seeds.py --kb semeval`); every draw ranks
against those tickets with the model as it is (no adaptation of S, no further training of the network: only the
weights' decision is measured). A draw of N query texts is seeded by (N, draw), the same for every model and gate.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shared_data import SEMEVAL  # noqa: E402


def draw_query_texts(query_ids: np.ndarray, n: int, draw: int) -> np.ndarray:
    """[len(query_ids)] bool: the judged queries of `n` distinct query texts, drawn with seed (n, draw)."""
    distinct = np.unique(query_ids)
    if n > len(distinct):
        raise SystemExit(f"--sizes: {n} query texts asked, the judgements have {len(distinct)}")
    chosen = np.random.default_rng(1000 * n + draw).choice(distinct, n, replace=False)
    return np.isin(query_ids, chosen)


def expected_change(z: np.ndarray, change: np.ndarray, gate: float) -> tuple[int, float]:
    """(draws that re-select, mean change over all draws) for a gate of `gate` standard errors: a draw re-selects
    when its cross-validated gain is more than `gate` standard errors (z > gate), and changes nothing otherwise."""
    passes = np.asarray(z) > gate
    return int(passes.sum()), float(np.where(passes, change, 0.0).mean()) if len(passes) else 0.0


def gate_table(rows: list[dict], gates: list[float]) -> str:
    """The markdown table of `rows` (one per draw) by size: each gate's re-selections and expected dev change."""
    names = ["always"] + [f"{g:g} SE" for g in gates]
    lines = ["| N query texts | judged queries (mean) | draws | " + " | ".join(
        f"{name}: re-selects, expected change" for name in names) + " |", "|---|---|---|" + "---|" * len(names)]
    for n in sorted({r["n"] for r in rows}):
        of_n = [r for r in rows if r["n"] == n]
        z = np.array([r["z"] for r in of_n])
        change = np.array([r["dev_change"] for r in of_n])
        cells = []
        for gate in [-np.inf, *gates]:
            passes, mean = expected_change(z, change, gate)
            cells.append(f"{passes}/{len(of_n)}, {mean:+.3f}")
        lines.append(f"| {n} | {np.mean([r['judged'] for r in of_n]):.0f} | {len(of_n)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a model trained label-free on train-part2's tickets")
    ap.add_argument("--sizes", default="10,20,40", help="query texts per draw, comma-separated")
    ap.add_argument("--draws", type=int, default=25, help="draws per size")
    ap.add_argument("--gates", default="1,2", help="gates in standard errors, comma-separated (today's: 1)")
    ap.add_argument("--train", default=str(SEMEVAL / "train-part2.xml"), help="the labelled pairs given as judgements")
    ap.add_argument("--test", default=str(SEMEVAL / "dev.xml"), help="where the weights are scored")
    ap.add_argument("--json", default=None, help="write every draw's figures here")
    args = ap.parse_args(argv)

    from recommender.data.importers import load
    from recommender.model.bundle import TicketModel
    from recommender.model.feedback import cross_validated_selection
    from recommender.model.judged import judged_queries
    from recommender.model.weight_selection import on_filled_fields
    from selection_agreement import semeval_target

    for path in (args.train, args.test):
        if not Path(path).is_file():
            sys.exit(f"no file at {path}: pass --train and --test")
    started = time.time()
    model = TicketModel.load(args.model)
    train = load(args.train)
    judged = judged_queries(train.queries, [(p.query_id, p.ticket_id, p.score) for p in train.pairs], train.tickets,
                            train.tickets, model.siamese_config.relevant_min, 0)
    ranked = judged.ranked_slice(model)
    spec, grid = model.metric_spec(), model.siamese_config.grid
    _, dev_map = semeval_target(model, Path(args.test))
    model_dev = dev_map(spec)[0]
    query_ids = np.array([q.id for q in judged.queries])
    print(f"{len(judged)} judged queries over {len(np.unique(query_ids))} query texts; dev MAP with the model's "
          f"weights {model_dev:.2f}", file=sys.stderr)
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        for draw in range(args.draws):
            mask = draw_query_texts(query_ids, n, draw)
            decision = cross_validated_selection(ranked.queries(mask), judged.subset(mask), spec, grid, draw)
            chosen, _ = on_filled_fields(decision["chosen"], judged.kb)  # as `reselect_weights` sets them
            gain, stderr, reselected = decision["gain"], decision["stderr"], dev_map(chosen)[0]
            rows.append({"n": n, "draw": draw, "judged": int(mask.sum()), "gain": gain, "se": stderr,
                         "z": gain / stderr if stderr > 0 else 0.0, "dev_model": model_dev,
                         "dev_reselected": reselected, "dev_change": reselected - model_dev})
            print(f"N {n} draw {draw}: gain {gain:+.3f} ({rows[-1]['z']:+.2f} SE), dev change "
                  f"{rows[-1]['dev_change']:+.2f}", file=sys.stderr, flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"# Feedback's weight re-selection gate: {args.model} (dev MAP {model_dev:.2f} with its weights)\n")
    print(gate_table(rows, [float(g) for g in args.gates.split(",")]))
    print(f"\n{time.time() - started:.0f} s. `.venv/bin/python benchmarks/feedback_gate.py --model {args.model} "
          f"--sizes {args.sizes} --draws {args.draws} --gates {args.gates} --train {args.train} --test {args.test}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
