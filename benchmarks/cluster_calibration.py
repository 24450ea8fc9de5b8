"""Do the 1-5 scores undersell true matches on a help desk whose tickets recur in large clusters?

Label-free calibration takes, for each mined calibration query, a ticket it ranks 5th to 20th as NO
(`mined_calibration.band_negatives`): when a query has few related tickets these are its closest unrelated ones,
which is what an off-topic query's best result looks like (docs/internals.md, "The score promises"). When one
problem recurs fifty times they are the same problem, and training leaves them out where their raw scores lie nearer
the queries' own tickets' than the random tickets' and the model ranks with S (`mined_calibration.band_is_no`). This
trains a label-free model on a synthetic knowledge base of CLASSES problem classes (`synthetic.generate(...,
classes=CLASSES)`: about TICKETS / CLASSES tickets each), serves it as `ticketrec serve` would (`EngineRanker`) to
the generator's queries, and gives the calibrated scores of the top-10 results of each query's own class (true
matches: same archetype and cause) and of the other results, with the model's calibrator and with ones refitted on
the same mined pairs with and without the 5th-20th NO pairs (`mined_calibration.mined_calibration`; the refit that
training's rule picks is checked to be the model's own). It also pastes the first PASTED tickets whole (subject and
description) and says how many come first and score 4.5 or more, the promise `benchmarks/score_promises.py` checks
on SeaMonkey, whose tickets have no solution, and scores the best result of its off-topic queries that are off-topic
here (all but the turbine one), which should score 2.5 or less. With --feedback N, N more of the generator's queries
each get YES on one ticket of their own problem, as engineers would judge, the model is tuned on them as `ticketrec
train --with-feedback` tunes it (`feedback.fine_tune`, into W/feedback-N), and the tuned model is served and scored
the same way (its last row): whether a few dozen judgements of different tickets of one problem put true matches
where they belong. With --labelled N the same N judgements are instead labelled pairs of a second label-free training
(into W/labelled-N), as `ticketrec train` trains with engineers' feedback in the store, and that model is served and
scored with its own calibrator and with the one training's mined decision alone would have fitted (its band as
training decided without the labelled YES pairs).

    .venv/bin/python benchmarks/cluster_calibration.py --workdir W [--classes 30] [--tickets 1500] [--queries 200]
                                                       [--pasted 100] [--feedback 50] [--labelled 50]

The model is trained into W/model and reused when it is there (the whole run took 32 minutes on 2 cores with the
training; 55 minutes since the selection's pasted-ticket condition, on 2 cores shared with two other trainings; with
--classes 100 --feedback 50 and the model already trained, 15 minutes beside another run; --classes 100 --labelled
50 with it, 28 minutes with the second training, beside two other runs).
Prints markdown.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass
class Served:
    """One model served to the evaluated queries: each top-10 result's rank, whether it is of the query's own class
    (a true match) and its raw g; the pasted tickets (came first, own raw g) and the off-topic queries' best raw g."""
    ranks: np.ndarray
    true: np.ndarray
    g: np.ndarray
    pasted_first: int
    pasted_g: np.ndarray
    off_topic: list

    def row(self, name: str, calibrate) -> str:
        """The table's row of this model's results scored by `calibrate`."""
        s, own = np.asarray(calibrate(self.g)), np.asarray(calibrate(self.pasted_g))
        other = f"{np.median(s[~self.true]):.2f}" if (~self.true).any() else "–"
        off = ", ".join(f"{float(np.asarray(calibrate(np.array([raw])))[0]):.2f}" for _, raw in self.off_topic)
        return (f"| {name} | {np.percentile(s[self.true], 25):.2f} / {np.median(s[self.true]):.2f} | "
                f"{np.median(s[self.ranks == 1]):.2f} | {other} | {self.pasted_first} / {int((own >= 4.5).sum())} / "
                f"{own.min():.2f} | {off} |")


def serve(model, tickets, queries, query_class: dict, cls: dict, n_pasted: int) -> Served:
    """`model` served as `ticketrec serve` would (`EngineRanker`) to `queries` (true matches: `query_class`), the
    first `n_pasted` tickets pasted whole, and the off-topic queries that are off-topic here (all but the turbine
    one)."""
    from recommender.data.records import Query, Ticket
    from recommender.evaluation.duplicates import EngineRanker
    from score_promises import OFF_TOPIC, paste_whole

    ranks, true, g = [], [], []
    with EngineRanker(model, tickets) as ranker:
        for q in queries:
            for rank, (tid, raw) in enumerate(ranker.scored(Ticket(q.id, q.subject, q.description), 10), 1):
                ranks.append(rank)
                true.append(cls[tid] == query_class[q.id])
                g.append(raw)
        pasted = paste_whole(ranker.engine, tickets[:n_pasted])  # the pasted-ticket promise: first, >= 4.5
        off_topic = [(subject, ranker.engine.recommend(Query(subject, description), k=1)[0].raw_score)
                     for subject, description in OFF_TOPIC if "turbine" not in subject.lower()]
    return Served(np.array(ranks), np.array(true), np.array(g), sum(p.first for p in pasted),
                  np.array([p.own.raw_score if p.own else 0.0 for p in pasted]), off_topic)


def feedback_tuned(model, tickets, judged, out: Path):
    """`model` tuned as `ticketrec train --with-feedback` tunes it (`feedback.fine_tune`, seed 0, into `out`) on the
    simulated engineers' judgements `judged` (`judged_dataset`)."""
    from recommender.model.feedback import fine_tune

    return fine_tune(model, judged, None, out, seed=0, progress=False, knowledge_base=tickets)


def judged_dataset(tickets, judged_queries, first_yes: dict):
    """Simulated engineers' feedback: each of `judged_queries` answered YES on one ticket of its own class
    (`first_yes`: the generator's first YES pair of each query)."""
    from recommender.data.store import Dataset

    by_id = {t.id: t for t in tickets}
    pairs = [first_yes[q.id] for q in judged_queries]
    return Dataset([by_id[p.ticket_id] for p in pairs], list(judged_queries), pairs, source="simulated feedback")


def labelled_trained(tickets, judged, out: Path):
    """A label-free model trained (seed 0, into `out`, reused when there) with `judged` as labelled pairs, as
    `ticketrec train` trains with engineers' feedback in the store; and the calibrator its training would have fitted
    by the mined band decision alone (the band's pairs NO as that decision says, the labelled pairs as they are)."""
    from recommender.lexical.bm25 import Bm25Scorer
    from recommender.model.bundle import TicketModel
    from recommender.model.calibration import Calibrator
    from recommender.model.mined_calibration import MINED_BAND, band_is_no, mined_band_position, mined_calibration
    from recommender.model.mining import MiningConfig
    from recommender.model.pairs import PairSet
    from recommender.model.training import PreparedPairs, lexical_features, pair_scores
    from recommender.model.unsupervised import label_free_config, train_without_labels

    if not (out / "config.json").exists():
        train_without_labels(tickets, label_free_config(pretrained=True), out, seed=0, labelled=judged)
    model = TicketModel.load(out)
    kb = Bm25Scorer(tickets) if model.metric_spec().get("bm25") else None
    parts = mined_calibration(model, tickets, kb)
    mining = MiningConfig.from_saved(model.meta["training"]["mining"]["config"])
    mined_as_no = band_is_no(mined_band_position(parts), model, mining.band_as_no)
    pairs = PairSet.from_dataset(judged, "labelled")
    lab_g = pair_scores(model, PreparedPairs.of(model, pairs, lexical_features(pairs, kb) if kb else None, False))
    kept = [part for name, part in parts.items() if mined_as_no or name != MINED_BAND] + [(lab_g, pairs.y)]
    by_mined = Calibrator.fit_centered(np.concatenate([g for g, _ in kept]), np.concatenate([y for _, y in kept]))
    return model, by_mined, mined_as_no


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True, help="where the model is trained (W/model) or found")
    ap.add_argument("--classes", type=int, default=30, help="problem classes the tickets are drawn from")
    ap.add_argument("--tickets", type=int, default=1500)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--seed", type=int, default=3, help="the synthetic data's seed (the model trains with seed 0)")
    ap.add_argument("--pasted", type=int, default=100, help="how many tickets (the first ones) to paste whole")
    ap.add_argument("--feedback", type=int, default=0,
                    help="also tune the model on YES feedback for this many more of the generator's queries "
                         "(train --with-feedback) and score the tuned model")
    ap.add_argument("--labelled", type=int, default=0,
                    help="also train a label-free model with YES labels for this many more of the generator's queries "
                         "(ticketrec train with that feedback in the store) and score it")
    args = ap.parse_args(argv)

    from recommender.data.records import YES
    from recommender.data.synthetic import generate
    from recommender.lexical.bm25 import Bm25Scorer
    from recommender.model.bundle import TicketModel
    from recommender.model.calibration import Calibrator
    from recommender.model.feedback import band_decision_words
    from recommender.model.mined_calibration import (MINED_BAND, mined_band_position, mined_calibration,
                                                     trained_band_is_no)
    from recommender.model.unsupervised import label_free_config, train_without_labels

    started = time.time()
    # the tickets do not depend on the number of queries: the first QUERIES queries are the same with feedback
    extra = max(args.feedback, args.labelled)  # the same judged queries for both
    data = generate(args.tickets, args.queries + extra, seed=args.seed, classes=args.classes)
    tickets, queries, judged_queries = data.tickets, data.queries[:args.queries], data.queries[args.queries:]
    out = Path(args.workdir) / "model"
    if not (out / "config.json").exists():
        train_without_labels(tickets, label_free_config(pretrained=True), out, seed=0)
    model = TicketModel.load(out)
    parts = mined_calibration(model, tickets, Bm25Scorer(tickets) if model.metric_spec().get("bm25") else None)
    position = mined_band_position(parts)  # where the band lies from random (0) to own tickets (1)

    def refit(names) -> Calibrator:
        return Calibrator.fit_centered(np.concatenate([parts[n][0] for n in names]),
                                       np.concatenate([parts[n][1] for n in names]))

    probe = np.linspace(0.0, 1.0, 201)
    as_no = trained_band_is_no(model, parts)
    same = np.allclose(refit([n for n in parts if as_no or n != MINED_BAND])(probe), model.calibrate(probe))
    own_kinds = "own ticket YES, random NO" + (", 5th-20th NO" if as_no else "")
    calibrators = {f"the model's ({own_kinds})": model.calibrate,
                   "refitted with the 5th-20th NO pairs": refit(list(parts)),
                   "refitted without the 5th-20th NO pairs": refit([n for n in parts if n != MINED_BAND])}

    cls = {t.id: (t.metadata["archetype"], t.metadata["cause"]) for t in tickets}
    first_yes = {}  # each query's first YES pair: a ticket of its own class
    for pair in data.pairs:
        if pair.score == YES:
            first_yes.setdefault(pair.query_id, pair)
    query_class = {qid: cls[pair.ticket_id] for qid, pair in first_yes.items()}
    served = serve(model, tickets, queries, query_class, cls, args.pasted)
    tuned = None
    if args.feedback:
        judged = judged_dataset(tickets, judged_queries[:args.feedback], first_yes)
        tuned, report = feedback_tuned(model, tickets, judged, Path(args.workdir) / f"feedback-{args.feedback}")
        tuned_served = serve(tuned, tickets, queries, query_class, cls, args.pasted)
    labelled = None
    if args.labelled:
        labelled, by_mined, mined_as_no = labelled_trained(
            tickets, judged_dataset(tickets, judged_queries[:args.labelled], first_yes),
            Path(args.workdir) / f"labelled-{args.labelled}")
        labelled_served = serve(labelled, tickets, queries, query_class, cls, args.pasted)

    sizes = Counter(cls.values())
    true, g = served.true, served.g
    print(f"command: .venv/bin/python benchmarks/cluster_calibration.py {' '.join(sys.argv[1:])}")
    print(f"knowledge base: synthetic, {len(tickets):,} tickets in {len(sizes)} problem classes "
          f"({min(sizes.values())}-{max(sizes.values())} tickets each), {len(queries)} queries (seed {args.seed}); "
          f"model {out} ({model.version}); the refit on the parts training's rule keeps equals the model's "
          f"calibrator: {same}\n")
    print("raw g medians of the calibration pairs: " + ", ".join(f"{n} {np.median(parts[n][0]):.3f}" for n in parts)
          + f"; of the top-10 results: true matches {np.median(g[true]):.3f}, others "
          + (f"{np.median(g[~true]):.3f}" if (~true).any() else "–")
          + f"; the band lies {position:.2f} of the way from the random tickets to the own ones "
          + f"(training {'took them as NO pairs' if as_no else 'left them out of the NO pairs'})\n")
    if tuned is not None:
        tuning = report["calibration"]
        print(f"tuned on YES feedback for {args.feedback} more queries of the generator (one ticket of the query's own "
              f"problem each) into {Path(args.workdir) / f'feedback-{args.feedback}'} ({tuned.version}); its "
              "calibrator refitted on " + ", ".join(f"{c['pairs']} {name}" for name, c in tuning.items() if c["pairs"])
              + band_decision_words(report.get("calibration_band")) + "\n")
    if labelled is not None:
        band = labelled.meta["training"]["calibration_band"]
        print(f"trained with YES labels for {args.labelled} more queries of the generator into "
              f"{Path(args.workdir) / f'labelled-{args.labelled}'} ({labelled.version}): the band's decision "
              f"{band}; by the mined band alone it would {'' if mined_as_no else 'not '}have been NO (that refit "
              f"equals the model's calibrator: {np.allclose(by_mined(probe), labelled.calibrate(probe))})\n")
    print(f"| calibrator | true matches in the top 10 ({true.sum()} of {len(true)}): score 25th pct / median | "
          f"rank-1 results: median | other results: median | {len(served.pasted_g)} tickets pasted whole: first / own "
          f"score >= 4.5 / min | off-topic best ({', '.join(s for s, _ in served.off_topic)}) |")
    print("|---|---|---|---|---|---|")
    for name, calibrate in calibrators.items():
        print(served.row(name, calibrate))
    if tuned is not None:
        print(tuned_served.row(f"after feedback: the tuned model's (true matches {tuned_served.true.sum()})",
                               tuned.calibrate))
    if labelled is not None:
        print(labelled_served.row(f"trained with {args.labelled} YES labels: by the mined decision alone (before) "
                                  f"(true matches {labelled_served.true.sum()})", by_mined))
        print(labelled_served.row(f"trained with {args.labelled} YES labels: the model's ({band['by']})",
                                  labelled.calibrate))
    print(f"\n({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
