"""Feedback that measurably helps? Simulated engineers on real duplicate links.

Half of the duplicate pairs (seeded; `--half 1`: the other half) become engineers' feedback: each ticket of a
pair, asked as a query, gets YES on its partner (and, with --no N, NO on the N best-ranked tickets that are not its
partner, as an engineer who reads the list would give). `ticketrec train --with-feedback` then fine-tunes the
model, and both models are evaluated on the OTHER half of the pairs with the knowledge-base protocol (`ticketrec
evaluate --duplicates`). Also prints what fine-tuning decided: S adapted or not, weights re-selected or not.

    .venv/bin/python benchmarks/feedback_seamonkey.py --model M \
        [--kb ../shared/data/seamonkey/SeaMonkey_bugs.csv --links ../shared/data/seamonkey/SeaMonkey_bugs-combined.csv]
        [--no 3] [--seed 0] [--half 1] [--keep DIR] [--threads 2]

M is a model trained on the same knowledge base (e.g. `ticketrec train` label-free after importing it).
Prints a markdown table (before / after, 95 % bootstrap intervals), the paired difference after − before
(query by query, 95 % paired bootstrap interval) and the commands it ran.
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from shared_data import SEAMONKEY, SEAMONKEY_LINKS, SEAMONKEY_MAP, feedback_split


@dataclass
class TemporaryHome:
    """A temporary TICKETREC_HOME (removed at exit) where `run(*args)` runs the ticketrec CLI quietly, keeping each
    command line in `commands`; `env` is its environment (no broker, no model or database of the caller's)."""

    path: Path
    env: dict
    commands: list = field(default_factory=list)

    @classmethod
    def create(cls, **extra_env: str) -> "TemporaryHome":
        path = Path(tempfile.mkdtemp(prefix="ticketrec-feedback-"))
        atexit.register(shutil.rmtree, path, True)
        env = dict(os.environ, TICKETREC_HOME=str(path / "home"), TICKETREC_MODEL=str(path / "unused"),
                   TICKETREC_BROKER_URL="", **extra_env)
        env.pop("TICKETREC_DB", None)
        return cls(path, env)

    def run(self, *cmd: str) -> None:
        self.commands.append(" ".join(cmd))
        ticketrec = str(Path(sys.executable).parent / "ticketrec")
        subprocess.run([ticketrec, *cmd], env=self.env, check=True, stdout=subprocess.DEVNULL)


def print_outcome(gain: dict, after, commands: list) -> None:
    """The end of a feedback benchmark's report: after − before per query (`gain`, {metric: paired difference}), what
    fine-tuning decided (`print_decisions`), the benchmark's command line and the ticketrec commands it ran."""
    from recommender.evaluation.duplicates import paired_line

    print(f"\nafter − before, per query [95 % paired bootstrap interval]: {paired_line(gain)}")
    print_decisions(after)
    print("\ncommand: .venv/bin/python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]))
    print("ran: " + " ; ".join(f"ticketrec {c}" for c in commands))


def print_decisions(after) -> None:
    """What fine-tuning decided, from the tuned model's record: S adapted and kept or not, weights re-selected or
    not, each with the judged queries' MRR@10 before and cross-validated."""
    tuning = after.meta["fine_tuning"][-1]
    for what, key, verb in (("S adapted on the judgements", "sentence_encoder", "kept"),
                            ("weights re-selected on the judgements", "weight_selection", "changed")):
        d = tuning.get(key)
        if d:
            print(f"\n{what}: MRR@10 on {d['queries']} judged queries {d['current']:.3f} before, "
                  f"{d['cross_validated']:.3f} cross-validated (standard error of the difference {d['stderr']:.3f}): "
                  f"{verb if d[verb] else 'not ' + verb}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the model before feedback (a model directory)")
    ap.add_argument("--kb", default=str(SEAMONKEY))
    ap.add_argument("--links", default=str(SEAMONKEY_LINKS))
    ap.add_argument("--no", type=int, default=0, help="NO feedback on the N best non-partner results of each query")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--half", type=int, choices=(0, 1), default=0,
                    help="which half of the shuffled pairs gives the feedback (the other is evaluated)")
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of S's adaptation to the feedback (`ticketrec train --threads`)")
    ap.add_argument("--keep", default=None, help="save the tuned model in this directory (e.g. for score_promises.py)")
    args = ap.parse_args()

    from recommender.config import Settings
    from recommender.data.importers import load, load_links
    from recommender.data.store import Feedback, Store
    from recommender.evaluation.duplicates import EngineRanker, evaluate_duplicates, paired_against_first, query_of
    from recommender.model.bundle import TicketModel

    if not Path(args.kb).exists():
        sys.exit(f"no knowledge base at {args.kb}: pass --kb (and --links)")
    tickets = load(args.kb, mapping=SEAMONKEY_MAP, progress=False).tickets
    links = load_links(args.links, known_ids=[t.id for t in tickets])
    by_id = {t.id: t for t in tickets}
    given, held_out = feedback_split(links, args.seed, args.half)

    home = TemporaryHome.create(OMP_NUM_THREADS="1")  # its store and the retrained model: about 120 MB
    tmp, env, run, commands = home.path, home.env, home.run, home.commands
    maps = [a for f, c in SEAMONKEY_MAP.items() for a in ("--map", f"{f}={c}")]
    run("import", args.kb, *maps, "--quiet")
    before = TicketModel.load(args.model)
    settings = Settings.from_env(env)
    n_yes = n_no = 0
    with Store(settings.db) as store, EngineRanker(before, tickets, settings, progress=False) as ranker:
        for a, b in given:
            for query_id, partner in ((a, b), (b, a)):
                q = query_of(by_id[query_id])
                store.add_feedback(Feedback(q.subject, q.description, partner, "YES", before.version))
                n_yes += 1
                if args.no:
                    wrong = [t for t in ranker(by_id[query_id], args.no + 2) if t not in (query_id, partner)]
                    for tid in wrong[:args.no]:
                        store.add_feedback(Feedback(q.subject, q.description, tid, "NO", before.version))
                        n_no += 1
    after_dir = tmp / "after"
    run("train", "--with-feedback", "--base", args.model, "--out", str(after_dir),
        *(["--epochs", str(args.epochs)] if args.epochs else []),
        *(["--threads", str(args.threads)] if args.threads != 1 else []))
    after = TicketModel.load(after_dir)
    if args.keep:
        shutil.copytree(after_dir, args.keep)

    with EngineRanker(before, tickets, settings, progress=False) as r0, \
            EngineRanker(after, tickets, settings, progress=False) as r1:
        rows = evaluate_duplicates(tickets, held_out, {"before feedback": r0, "after feedback": r1},
                                   seed=args.seed, progress=False)
    print(f"# Feedback on {len(given)} of {len(links)} duplicate pairs ({n_yes} YES, {n_no} NO judgements); "
          f"evaluated on the other {len(held_out)} pairs ({2 * len(held_out)} queries)\n")
    print("| model | MRR@10 | Acc@1 | Acc@5 | Acc@10 |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['system']} | {row['MRR@10']:.3f} [{row['MRR@10_low']:.3f}, {row['MRR@10_high']:.3f}] | "
              f"{row['Acc@1']:.3f} | {row['Acc@5']:.3f} | {row['Acc@10']:.3f} |")
    [gain] = paired_against_first(rows[::-1], seed=args.seed).values()  # after − before, query by query
    print_outcome(gain, after, commands)


if __name__ == "__main__":
    main()
