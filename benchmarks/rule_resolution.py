"""How large a change of the label-free recipe its decision rule can tell from training noise (issue 12).

Since the twenty-first session a change to the recipe is kept only if SemEval-2016 dev's official MAP, over seeds
0–2, rises by 0.30 on the mean and no seed falls more than 0.50 below today's (docs/results/label-free-tries.md).
This reads the per-seed figures of the changes to S's adaptation measured that way (each retrains the model, so each
seed's figure is a new draw of the training's noise), as their write-ups give them, from
docs/results/label-free-tries-seeds.csv (one row per change and seed; its last column says where each is written up),
and prints:

- each change's per-seed differences from today's recipe, beside its knowledge-base MRR@10 and SeaMonkey figures;
- the noise: how far one recipe's seeds spread, and how far a change's seed lies from today's on the same seed;
- the rule's chance to keep a change of a given true effect, against today's seeds 0–2 (simulated with that noise);
- the smallest effect that n paired seeds detect (80 % power, one-sided 5 %).

    .venv/bin/python benchmarks/rule_resolution.py [--csv PATH] [--draws 200000] [--seed 0]

It trains nothing and adds no figure of its own to the CSV: it is arithmetic on recorded figures (under a second).
"""
from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path
from statistics import NormalDist

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SEEDS_CSV = ROOT / "docs" / "results" / "label-free-tries-seeds.csv"
THRESHOLD, FLOOR = 0.30, 0.50  # the rule: mean gain at least THRESHOLD, no seed more than FLOOR below today's


def load(path: Path) -> dict[str, list[dict]]:
    """The CSV's rows grouped by change (in file order), numbers as floats (None where a cell is empty)."""
    changes: dict[str, list[dict]] = defaultdict(list)
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            for key in ("dev_map_today", "dev_map", "kb_today", "kb", "seamonkey_mrr10", "seamonkey_acc10"):
                row[key] = float(row[key]) if row[key] else None
            row["seed"] = int(row["seed"])
            changes[row["change"]].append(row)
    return dict(changes)


def pooled_sd(groups: list[list[float]]) -> tuple[float, int]:
    """The standard deviation pooled over groups (each group's deviations from its own mean) and its degrees of
    freedom."""
    squares = sum(float(np.sum((np.asarray(g) - np.mean(g)) ** 2)) for g in groups if len(g) > 1)
    dof = sum(len(g) - 1 for g in groups if len(g) > 1)
    return (squares / dof) ** 0.5, dof


def today_seeds(changes: dict[str, list[dict]]) -> dict[int, float]:
    """Today's recipe's dev official MAP per seed on the AMD machine (seeds 0–2 and 3–5): the first figure recorded
    for each seed among the rows not run on the Intel machine (those compare with that machine's own arm)."""
    seeds: dict[int, float] = {}
    for rows in changes.values():
        for row in rows:
            if row["dev_map_today"] is not None and row["machine"] != "Intel Xeon":
                seeds.setdefault(row["seed"], row["dev_map_today"])
    return dict(sorted(seeds.items()))


def seed_share(sd_seed: float, sd_difference: float) -> float:
    """λ, the share of one recipe's seed-to-seed variance that is not shared by other recipes on the same seed.

    The model: a recipe's figure on seed s is centre + a_s + e_s, with a_s common to every recipe trained on seed s
    (the same mined pairs, draws and order) and e_s its own; var(a + e) = sd_seed², var(e' − e) = sd_difference², so
    λ = var(e) / sd_seed² = sd_difference² / (2 sd_seed²), at most 1."""
    return min(1.0, sd_difference ** 2 / (2 * sd_seed ** 2))


def expected_gains(today: list[float], centre: float, sd_seed: float, sd_difference: float,
                   effect: float = 0.0) -> tuple[np.ndarray, float]:
    """The mean and standard deviation of a change's gain on each seed, given today's figures there: a seed where
    today's figure lay above the recipe's centre by δ takes λ·δ back on average (its own draw does not repeat)."""
    share = seed_share(sd_seed, sd_difference)
    own = share * sd_seed ** 2  # var(e)
    means = effect - share * (np.asarray(today) - centre)
    return means, float(np.sqrt(own + own * (1 - share)))


def keep_probability(today: list[float], centre: float, sd_seed: float, sd_difference: float, effect: float,
                     draws: int, rng: np.random.Generator) -> float:
    """The share of simulated changes of true effect `effect` that the rule keeps against today's fixed figures."""
    means, sd = expected_gains(today, centre, sd_seed, sd_difference, effect)
    gains = rng.normal(means, sd, size=(draws, len(today)))
    kept = (gains.mean(axis=1) >= THRESHOLD) & (gains.min(axis=1) >= -FLOOR)
    return float(kept.mean())


def detectable_effect(sd_difference: float, seeds: int, alpha: float = 0.05, power: float = 0.80) -> float:
    """The smallest true effect that `seeds` paired seeds detect with the given one-sided level and power."""
    z = NormalDist().inv_cdf
    return (z(1 - alpha) + z(power)) * sd_difference / seeds ** 0.5


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", type=Path, default=SEEDS_CSV, help="per-seed figures (default: %(default)s)")
    parser.add_argument("--draws", type=int, default=200_000, help="simulated changes per effect")
    parser.add_argument("--seed", type=int, default=0, help="the simulation's seed")
    args = parser.parse_args(argv)
    if not args.csv.is_file():
        parser.error(f"{args.csv} not found: pass --csv with the per-seed figures")
    changes = load(args.csv)

    print("## Per-seed differences from today's recipe (SemEval-2016 dev official MAP)\n")
    print("| change (session) | seeds | change − today's, per seed | mean | seeds > 0.50 below | KB MRR@10 mean "
          "change − today's | SeaMonkey seed 0 MRR@10 / Acc@10 |")
    print("|---|---|---|---|---|---|---|")
    differences, spreads, by_seed, change_means = [], [], defaultdict(list), []
    for change, rows in changes.items():
        gains = [r["dev_map"] - r["dev_map_today"] for r in rows]
        differences.append(gains)
        spreads.append([r["dev_map"] for r in rows])
        if rows[0]["kind"] != "same recipe":
            change_means.append(float(np.mean(gains)))
            for r, gain in zip(rows, gains):
                by_seed[r["seed"], r["dev_map_today"]].append(gain)
        kb = [r["kb"] - r["kb_today"] for r in rows if r["kb"] is not None]
        seamonkey = next((f"{r['seamonkey_mrr10']:.3f} / {r['seamonkey_acc10']:.3f}" for r in rows
                          if r["seamonkey_mrr10"] is not None), "")
        print(f"| {change} ({rows[0]['session']}) | {', '.join(str(r['seed']) for r in rows)} | "
              f"{' / '.join(f'{g:+.2f}' for g in gains)} | {np.mean(gains):+.2f} | "
              f"{sum(g < -FLOOR for g in gains)} | {f'{np.mean(kb):+.3f}' if kb else ''} | {seamonkey} |")

    today = today_seeds(changes)
    first = [today[s] for s in (0, 1, 2)]
    recipe = list(today.values())
    centre = float(np.mean(recipe))
    sd_difference, dof_difference = pooled_sd(differences)
    sd_seed, dof_seed = pooled_sd(spreads + [recipe])
    predicted, _ = expected_gains(first, centre, sd_seed, sd_difference)
    print("\n## The noise\n")
    print("| figure | value |")
    print("|---|---|")
    print(f"| today's recipe over seeds {', '.join(map(str, today))} (AMD) | mean {centre:.2f}, "
          f"range {min(recipe):.2f}–{max(recipe):.2f} |")
    print(f"| today's seeds 0–2, the rule's comparison | {' / '.join(f'{x:.2f}' for x in first)}, mean "
          f"{np.mean(first):.2f} ({np.mean(first) - centre:+.2f} against the six) |")
    print(f"| one recipe's seeds: standard deviation (pooled over the rows' recipes and today's six, {dof_seed} df) | "
          f"{sd_seed:.2f} |")
    print(f"| a change's seed against today's same seed: standard deviation of the difference (pooled within "
          f"the rows, {dof_difference} df) | {sd_difference:.2f} |")
    print(f"| the share of a seed's variance that other recipes on that seed do not share, λ | "
          f"{seed_share(sd_seed, sd_difference):.2f} |")
    for seed, mean in zip((0, 1, 2), predicted):
        gains = by_seed[seed, today[seed]]  # the changes compared with the rule's figure for this seed
        print(f"| seed {seed} ({today[seed]:.2f}): the mean difference of the {len(gains)} changes compared with it, "
              f"what λ predicts for no effect; how many fell more than 0.50 | {np.mean(gains):+.2f}, {mean:+.2f}; "
              f"{sum(g < -FLOOR for g in gains)} |")
    print(f"| the changes' mean differences: mean, range ({len(change_means)} comparisons) | "
          f"{np.mean(change_means):+.2f}, {min(change_means):+.2f} to {max(change_means):+.2f} |")

    rng = np.random.default_rng(args.seed)
    print("\n## The rule's chance to keep a change, against today's seeds 0–2\n")
    print(f"{args.draws:,} simulated changes a row, each seed's gain drawn as the noise above makes it given "
          "today's figure on that seed; the knowledge-base condition left out (it only lowers these).\n")
    print("| true effect (official MAP) | kept |")
    print("|---|---|")
    for effect in (0.0, 0.3, 0.5, 1.0, 1.5):
        kept = keep_probability(first, centre, sd_seed, sd_difference, effect, args.draws, rng)
        print(f"| {effect:+.1f} | {kept:.2f} |")

    print("\n## The smallest effect n paired seeds detect (80 % power, one-sided 5 %, "
          f"difference standard deviation {sd_difference:.2f})\n")
    print("| seeds | standard error of the mean difference | detectable effect |")
    print("|---|---|---|")
    for n in (3, 6, 10, 20):
        print(f"| {n} | {sd_difference / n ** 0.5:.2f} | {detectable_effect(sd_difference, n):.2f} |")
    print("\n.venv/bin/python benchmarks/rule_resolution.py" + ("" if args.csv == SEEDS_CSV else f" --csv {args.csv}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
