"""Label-free training over several seeds: how far one recipe's figures move with the seed alone (issue 12).

A change to the label-free recipe is judged by rules fixed before its figures are seen, and one seed's figure is one
draw: this trains the label-free configuration on a knowledge base's tickets (no labels) once per seed, in parallel
processes, and prints each seed's figures with their mean and range, so that a rule can compare means over seeds.

- `--kb semeval`: SemEval-2016 train-part2's tickets (its labels dropped), then `ticketrec evaluate --model DIR
  --test dev.xml`: dev's official MAP (rerank) and knowledge-base MRR@10;
- `--kb seamonkey`: SeaMonkey's 1,076 tickets, then `ticketrec evaluate --kb … --duplicates …`: the duplicates'
  MRR@10 and Acc@10 (report only: the recipe is never selected on them).

Both also print what training selects on, without labels: the mined held-out MRR@10 with the selected weights, and
the held-out MRR@10 of S packaged and adapted (when the model has S).

    .venv/bin/python benchmarks/label_free_seeds.py --kb semeval [--no-pretrained] [--seeds 0,1,2] [--jobs 2]
        [--mining '{"template_share": 0.01}'] [--config '{"e_unknown": "skip"}'] [--threads N] [--workdir DIR]

`--mining` overrides fields of `MiningConfig`, `--config` fields of the label-free `SiameseConfig` (a recipe change
that is an option), `--threads` the torch threads of each training's fine-tuning of S (`ticketrec train --threads`).
Models, reports and logs stay in `--workdir` (default: a new temporary directory, kept); a seed whose model is there
already is evaluated, not trained again (refused when it was trained with other options). The `--jobs` seeds at once
share the CPUs: each encodes its sentences on its share of them (OMP_NUM_THREADS, unless set).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tqdm import tqdm

from recommender.config import usable_cpus
from shared_data import SEAMONKEY, SEAMONKEY_LINKS, SEAMONKEY_MAP, SEMEVAL, seamonkey_tickets

ROOT = Path(__file__).resolve().parents[1]


def train_one(kb: str, pretrained: bool, seed: int, out: Path, mining: dict, overrides: dict, threads: int = 1) -> None:
    """Train the label-free configuration on `kb`'s tickets with `seed` into `out` on `threads` torch threads (run in
    a child process)."""
    from recommender.data.importers import load
    from recommender.model.unsupervised import label_free_config, train_without_labels

    tickets = (load(SEMEVAL / "train-part2.xml", progress=False).tickets if kb == "semeval"
               else seamonkey_tickets(SEAMONKEY))
    train_without_labels(tickets, label_free_config(pretrained=pretrained, **overrides), out, seed=seed,
                         mining=mining or None, progress=False, threads=threads)


def evaluate_one(kb: str, model: Path, env: dict) -> dict:
    """The labelled figures of a trained model: `ticketrec evaluate`'s results.json, read back."""
    report = model.parent / f"{model.name}-report"
    # `python -m` from the repository root: the code of this checkout, whatever the virtual environment installed
    command = [sys.executable, "-m", "recommender.cli", "evaluate", "--model", str(model), "--out", str(report)]
    if kb == "semeval":
        command += ["--test", str(SEMEVAL / "dev.xml")]
    else:
        command += ["--kb", str(SEAMONKEY), "--duplicates", str(SEAMONKEY_LINKS)]
        command += [a for field, column in SEAMONKEY_MAP.items() for a in ("--map", f"{field}={column}")]
    run_logged(command, env, model.parent / f"{model.name}-evaluate.log")
    rows = json.loads((report / "results.json").read_text())["rows"]
    if kb == "semeval":
        rerank = next(r for r in rows if r.get("protocol") == "rerank")
        kb_row = next(r for r in rows if r.get("protocol") == "kb")
        return {"dev official MAP": rerank["official_map"], "dev KB MRR@10": kb_row["MRR@10"]}
    return {"duplicates MRR@10": rows[0]["MRR@10"], "duplicates Acc@10": rows[0]["Acc@10"]}


def label_free_figures(model: Path) -> dict:
    """What label-free training recorded in the model: the selected weights' mined held-out MRR@10, S's held-out
    MRR@10 packaged and adapted, and the weights the model serves (channels, BM25; pairs)."""
    config = json.loads((model / "config.json").read_text())
    training = config["training"]
    out = {"mined held-out MRR@10": training["weight_selection"]["value"]}
    s = training.get("sentence_encoder") or {}
    if "adapted" in s:
        kept = "" if s["kept"] else " (not kept)"
        out["S held-out: packaged / adapted"] = f"{s['base']:.3f} / {s['adapted']:.3f}{kept}"
    spec = training["weight_selection"]["spec"]  # the grid's values; the model serves them rescaled
    served = {(a, b): v for a, b, v in config["metric"]["pairs"]}  # 0 for a pair against a field no ticket fills
    weights = [f"{c} {w:g}" for c, w in spec["channels"].items() if w]
    weights += [f"BM25 {spec['bm25']:g}"] if spec.get("bm25") else []
    pairs = [f"{a}–{b} {v:g}" for a, b, v in spec["pairs"] if v and served.get((a, b))]
    out["selected weights (channels; pairs)"] = ", ".join(weights) + "; " + ", ".join(pairs)
    return out


def run_logged(command: list[str], env: dict, log: Path) -> None:
    """Run `command` from the repository root, its output into `log`; SystemExit naming the log when it fails."""
    with log.open("w") as out:
        code = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    if code:
        raise SystemExit(f"{' '.join(command[:4])} … failed (exit {code}): see {log}")


def require_trained_as_asked(model: Path, mining: dict, overrides: dict, pretrained: bool, threads: int = 1) -> None:
    """SystemExit when the model already in the work directory was trained with other mining options, configuration,
    channels or thread count than those asked for (it would be evaluated in their place)."""
    from recommender.model.mining import MiningConfig
    from recommender.model.siamese import SiameseConfig

    config = json.loads((model / "config.json").read_text())
    saved = MiningConfig.from_saved(config["training"]["mining"]["config"])
    hyper = SiameseConfig.from_saved(config["hyperparameters"])
    with_s = "S" in hyper.channels
    other = {k: getattr(hyper, k) for k, v in overrides.items() if getattr(hyper, k, None) != v}
    # the threads S's fine-tuning ran on (models from before the option, and models without S: one)
    trained_threads = (config["training"].get("sentence_encoder") or {}).get("threads", 1)
    if trained_threads != threads:
        other["threads"] = trained_threads
    if saved.to_dict() != MiningConfig.from_dict(mining).to_dict() or with_s != pretrained or other:
        raise SystemExit(f"{model} was trained with other options (mining {saved.to_dict()}, S {with_s}"
                         f"{', ' + str(other) if other else ''}); give another --workdir")


def run_seed(args, mining: dict, overrides: dict, seed: int, workdir: Path) -> dict:
    """Train (in a child process, one per seed) and evaluate one seed (`mining`, `overrides`: `--mining` and
    `--config`, parsed); its figures."""
    model = workdir / f"seed-{seed}"
    env = dict(os.environ, TICKETREC_HOME=str(workdir / "home"), TICKETREC_BROKER_URL="")
    # the seeds trained at once share the CPUs: each encodes on its share (the same vectors, one text a thread)
    env.setdefault("OMP_NUM_THREADS", str(max(1, usable_cpus() // max(1, args.jobs))))
    if (model / "config.json").exists():
        require_trained_as_asked(model, mining, overrides, not args.no_pretrained, args.threads)
    else:
        child = [sys.executable, str(Path(__file__).resolve()), "--kb", args.kb, "--train-one", str(seed),
                 "--workdir", str(workdir), "--mining", args.mining, "--config", args.config,
                 "--threads", str(args.threads)]
        child += ["--no-pretrained"] if args.no_pretrained else []
        run_logged(child, env, workdir / f"seed-{seed}-train.log")
    return {"seed": seed, **label_free_figures(model), **evaluate_one(args.kb, model, env)}


def table(rows: list[dict]) -> str:
    """A markdown table of the seeds' figures, with the mean (range) of every numeric column."""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        lines.append("| " + " | ".join(f"{row[k]:.3f}" if isinstance(row[k], float) else str(row[k]) for k in keys)
                     + " |")
    summary = ["mean (range)"]
    for k in keys[1:]:
        values = [r[k] for r in rows]
        summary.append(f"{np.mean(values):.3f} ({min(values):.3f}–{max(values):.3f})"
                       if all(isinstance(v, float) for v in values) else "")
    lines.append("| " + " | ".join(summary) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kb", choices=("semeval", "seamonkey"), required=True)
    ap.add_argument("--no-pretrained", action="store_true", help="the paper's channels (h, E, T) + BM25, without S")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    ap.add_argument("--jobs", type=int, default=2, help="seeds trained at once (each about 5 GB with S)")
    ap.add_argument("--mining", default="{}", help="JSON object of MiningConfig fields to override")
    ap.add_argument("--config", default="{}", help="JSON object of label-free SiameseConfig fields to override")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of each training's fine-tuning of S (ticketrec train --threads; default 1)")
    ap.add_argument("--workdir", default=None, help="where the models and reports go (default: a new temp dir)")
    ap.add_argument("--train-one", type=int, default=None, help=argparse.SUPPRESS)  # the child process's seed
    args = ap.parse_args()
    mining, overrides = json.loads(args.mining), json.loads(args.config)
    if not isinstance(mining, dict):
        sys.exit("--mining takes a JSON object, e.g. '{\"template_share\": 0.01}'")
    if not isinstance(overrides, dict):
        sys.exit("--config takes a JSON object, e.g. '{\"e_unknown\": \"skip\"}'")
    needed = ([SEMEVAL / "train-part2.xml", SEMEVAL / "dev.xml"] if args.kb == "semeval"
              else [SEAMONKEY, SEAMONKEY_LINKS])
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        sys.exit(f"missing data: {', '.join(missing)} (see ../shared/data/README.md)")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="label-free-seeds-"))
    if args.train_one is not None:
        train_one(args.kb, not args.no_pretrained, args.train_one, workdir / f"seed-{args.train_one}", mining,
                  overrides, args.threads)
        return
    workdir.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool, tqdm(total=len(seeds), desc="seeds", unit="seed") as bar:
        futures = [pool.submit(run_seed, args, mining, overrides, seed, workdir) for seed in seeds]
        rows = []
        for future in futures:
            rows.append(future.result())
            bar.update()
    kind = "the paper's channels (--no-pretrained)" if args.no_pretrained else "the default (with S)"
    print(f"label-free {kind} on {args.kb}, seeds {', '.join(map(str, seeds))}; mining overrides {mining or 'none'}; "
          f"config overrides {overrides or 'none'}; S fine-tuned on {args.threads} torch thread(s); "
          f"models in {workdir}\n")
    print(table(rows))


if __name__ == "__main__":
    main()
