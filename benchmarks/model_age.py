"""How a model ages: trained on a knowledge base's oldest tickets, serving all of them (issue 12).

A help desk trains once and keeps adding tickets (`ticketrec import`, the API). The nightly reindex brings every new
ticket into the index, but the model stays as it was trained: its word vectors and vocabulary, topics, LSTM, adapted
S, weights and calibration. This trains the label-free model on the oldest FRACTION of SeaMonkey's tickets (by the
export's Created column), one child process per model, then evaluates each on the duplicates over all 1,076 tickets
(`ticketrec evaluate --kb … --duplicates …`, the index built from every ticket, as a reindex would) and prints:

- the tickets it was trained on and the date of the newest;
- the share of word occurrences without a word vector (out-of-vocabulary), in the tickets it was trained on and in
  the newer ones it never saw;
- the duplicates' MRR@10 / Acc@10 over all 92 queries, then split at one date for every row, the newest ticket of
  the smallest share: the queries whose ticket or partner is newer (unseen by that share's models), and the rest.

    .venv/bin/python benchmarks/model_age.py [--fractions 0.5,0.75,1] [--seeds 0] [--no-pretrained] [--jobs 2]
        [--workdir DIR]

Models and reports stay in `--workdir` (default: a new temporary directory, kept); a model or report already there
is read, not made again. About 13 minutes a model with S on 2 cores, 5 without.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tqdm import tqdm

from label_free_seeds import run_logged
from shared_data import SEAMONKEY, SEAMONKEY_LINKS, SEAMONKEY_MAP, seamonkey_tickets

CREATED = "Created"


def created_dates(path: Path = SEAMONKEY) -> dict[str, str]:
    """Ticket id → its Created value (ISO 8601, so text order is time order)."""
    with path.open(newline="", encoding="utf-8") as f:
        return {row[SEAMONKEY_MAP["id"]]: row[CREATED] for row in csv.DictReader(f)}


def oldest(tickets: list, created: dict[str, str], fraction: float) -> list:
    """The oldest `fraction` of `tickets` (at least one), oldest first."""
    ordered = sorted(tickets, key=lambda t: (created[t.id], t.id))
    return ordered[:max(1, round(len(ordered) * fraction))]


def train_one(fraction: float, seed: int, pretrained: bool, out: Path) -> None:
    """Train the label-free model on the oldest `fraction` of the tickets into `out` (run in a child process)."""
    from recommender.model.unsupervised import label_free_config, train_without_labels

    tickets = oldest(seamonkey_tickets(SEAMONKEY), created_dates(), fraction)
    train_without_labels(tickets, label_free_config(pretrained=pretrained), out, seed=seed, progress=False)


def by_age(ranks: list, queries: list, created: dict[str, str], split: str) -> dict:
    """MRR@10 / Acc@10 (queries) of a system's duplicate `ranks` over every query, over those with a ticket created
    after `split`, and over the others."""
    from recommender.evaluation.duplicates import rank_metrics

    per_query = rank_metrics(ranks, ks=(10,))  # the evaluation's own per-query MRR@10 and Acc@10
    newer = [created[a] > split or created[b] > split for a, b in queries]

    def mrr_acc(selected: list[bool]) -> str:
        keep = np.array(selected, dtype=bool)
        if not keep.any():
            return "–"
        return (f"{per_query['MRR@10'][keep].mean():.3f} / {per_query['Acc@10'][keep].mean():.3f} "
                f"({int(keep.sum())})")

    return {"duplicates MRR@10 / Acc@10 (queries)": mrr_acc([True] * len(ranks)),
            f"a ticket after {split[:10]}": mrr_acc(newer), "both before": mrr_acc([not x for x in newer])}


def figures(model: Path, report: Path, created: dict[str, str], tickets: list, split: str) -> dict:
    """The aged model's figures: its training cut, out-of-vocabulary shares, and the duplicates split by age."""
    from recommender.model.bundle import TicketModel
    from recommender.model.unsupervised import oov_rate

    trained_on = TicketModel.load(model)
    n = trained_on.meta["training"]["mining"]["tickets"]
    ordered = oldest(tickets, created, 1.0)
    result = json.loads((report / "results.json").read_text())
    unseen = oov_rate(trained_on, ordered[n:])["rate"] if n < len(ordered) else None
    return {"trained on": f"{n:,}", "newest trained on": created[ordered[n - 1].id][:10],
            "OOV: trained on / newer": f"{oov_rate(trained_on, ordered[:n])['rate']:.1%} / "
                                       + (f"{unseen:.1%}" if unseen is not None else "–"),
            **by_age(result["rows"][0]["ranks"], result["queries"], created, split)}


def baselines(report: Path, created: dict[str, str], split: str) -> list[dict]:
    """The rows of the systems no training touches (BM25, MiniLM, their fusion), from one of the reports."""
    result = json.loads((report / "results.json").read_text())
    return [{"trained on the oldest": row["system"], "seed": "", "trained on": "", "newest trained on": "",
             "OOV: trained on / newer": "", **by_age(row["ranks"], result["queries"], created, split)}
            for row in result["rows"][1:]]


def run_one(args, fraction: float, seed: int, workdir: Path, created: dict[str, str], tickets: list,
            split: str) -> dict:
    """Train and evaluate (unless already there) the model of `fraction` and `seed`; its row of the table."""
    name = f"oldest-{fraction:g}-seed-{seed}"
    model, report = workdir / name, workdir / f"{name}-report"
    env = dict(os.environ, TICKETREC_HOME=str(workdir / "home"), TICKETREC_BROKER_URL="")
    if not (model / "config.json").exists():
        child = [sys.executable, str(Path(__file__).resolve()), "--train-one", f"{fraction:g},{seed}",
                 "--workdir", str(workdir)] + (["--no-pretrained"] if args.no_pretrained else [])
        run_logged(child, env, workdir / f"{name}-train.log")
    if not (report / "results.json").exists():
        command = [sys.executable, "-m", "recommender.cli", "evaluate", "--model", str(model), "--out", str(report),
                   "--kb", str(SEAMONKEY), "--duplicates", str(SEAMONKEY_LINKS)]
        command += [a for field, column in SEAMONKEY_MAP.items() for a in ("--map", f"{field}={column}")]
        run_logged(command, env, workdir / f"{name}-evaluate.log")
    return {"trained on the oldest": f"{fraction:.0%}", "seed": seed,
            **figures(model, report, created, tickets, split)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fractions", default="0.5,0.75,1", help="comma-separated shares of the oldest tickets")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    ap.add_argument("--no-pretrained", action="store_true", help="the paper's channels (h, E, T) + BM25, without S")
    ap.add_argument("--jobs", type=int, default=2, help="models trained at once (each about 5 GB with S)")
    ap.add_argument("--workdir", default=None, help="where the models and reports go (default: a new temp dir)")
    ap.add_argument("--train-one", default=None, help=argparse.SUPPRESS)  # the child process's "fraction,seed"
    args = ap.parse_args()
    try:
        fractions = [float(f) for f in args.fractions.split(",") if f.strip()]
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        fractions = seeds = []
    if not fractions or not seeds or not all(0 < f <= 1 for f in fractions):
        sys.exit("--fractions takes shares in (0, 1] such as 0.5,0.75,1, and --seeds integers such as 0,1,2")
    missing = [str(p) for p in (SEAMONKEY, SEAMONKEY_LINKS) if not p.exists()]
    if missing:
        sys.exit(f"missing data: {', '.join(missing)} (see ../shared/data/README.md)")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="model-age-"))
    if args.train_one is not None:
        fraction, seed = args.train_one.split(",")
        out = workdir / f"oldest-{float(fraction):g}-seed-{seed}"
        train_one(float(fraction), int(seed), not args.no_pretrained, out)
        return
    workdir.mkdir(parents=True, exist_ok=True)
    created, tickets = created_dates(), seamonkey_tickets(SEAMONKEY)
    split = created[oldest(tickets, created, min(fractions))[-1].id]
    runs = [(f, s) for f in fractions for s in seeds]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool, tqdm(total=len(runs), desc="models", unit="model") as bar:
        futures = [pool.submit(run_one, args, f, s, workdir, created, tickets, split) for f, s in runs]
        rows = []
        for future in futures:
            rows.append(future.result())
            bar.update()
    first = f"oldest-{fractions[0]:g}-seed-{seeds[0]}-report"
    rows += baselines(workdir / first, created, split)
    kind = "the paper's channels (--no-pretrained)" if args.no_pretrained else "the default (with S)"
    print(f"label-free {kind}, trained on SeaMonkey's oldest tickets, evaluated on the duplicates over all of them; "
          f"models in {workdir}\n")
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
