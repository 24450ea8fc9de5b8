"""Evaluation: `ticketrec evaluate` (the grid, cross-validation, a saved model, duplicate links)."""
from __future__ import annotations

import sys

import click

from .common import column_mapping, echo_json, html_option, main, settings, warn



@main.command()
@click.option("--train", "train_path", type=click.Path(dir_okay=False),
              help="grid: training data (JSONL, CSV or SemEval XML)")
@click.option("--dev", "dev_path", type=click.Path(dir_okay=False), help="grid: dev data, where weights are selected")
@click.option("--test", "test_path", type=click.Path(dir_okay=False),
              help="labelled test data: only reported, never tuned on (with --model alone: evaluate that saved model)")
@click.option("--grid", type=click.Choice(["table5", "core", "quick", "siamese"]), default="table5", show_default=True,
              help="grid: table5 (every row), core (its key rows), quick, or siamese (issue 13's networks alone)")
@click.option("--cv", "cv_folds", type=int, default=None, metavar="K",
              help="grid: pool --train and --dev, K-fold cross-validation by query (weights selected on the other "
                   "folds) of BM25, the zero-shot S channel, the labelled configuration and `ticketrec train`'s "
                   "default recipe (with the labels and without)")
@click.option("--cv-rows", "cv_rows", default=None, metavar="KEYS",
              help="--cv: only these rows, comma-separated, of bm25, s-zero-shot, labelled-simplest, labelled-argmax, "
                   "default, default-no-labels (default: all; each default row trains for minutes a fold)")
@click.option("--jobs", type=int, default=None, help="grid/--cv: worker processes (default: the number of cores)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="report directory, e.g. reports/NAME (required for the grid)")
@click.option("--seeds", type=int, default=3, show_default=True,
              help="grid: seeds of the headline rows (mean ± spread)")
@click.option("--seed", type=int, default=0, show_default=True,
              help="first seed (duplicates and --model --test: the bootstrap's seed)")
@click.option("--candidates", type=int, default=None,
              help="BM25 candidates K in the KB protocol (default: TICKETREC_CANDIDATES)")
@click.option("--model", "model_dir", type=click.Path(file_okay=False), default=None,
              help="a saved model to evaluate (duplicates: default TICKETREC_MODEL)")
@click.option("--kb", "kb_path", type=click.Path(dir_okay=False), default=None,
              help="duplicates: the knowledge base (tickets; CSV, Excel .xlsx or JSONL; --map for its own columns)")
@click.option("--map", "maps", multiple=True, metavar="FIELD=COLUMN",
              help="column mapping of --kb, as in `ticketrec import`")
@click.option("--mapping", "mapping_file", type=click.Path(dir_okay=False), default=None,
              help="column mapping of --kb in a file, as in `ticketrec import`")
@html_option
@click.option("--duplicates", "links_path", type=click.Path(dir_okay=False), default=None,
              help="duplicates: CSV of duplicate links (two ticket-id columns, header optional)")
@click.option("--link-columns", nargs=2, default=None, metavar="A B",
              help="duplicates: the two id columns of the links file, by header name (default: the first two)")
@click.option("--baselines/--no-baselines", default=True, show_default=True,
              help="duplicates and --model --test: also BM25, MiniLM and their reciprocal-rank fusion")
@click.option("--json", "as_json", is_flag=True, help="print the rows as JSON")
def evaluate(train_path, dev_path, test_path, grid, out_dir, seeds, seed, candidates, model_dir, kb_path, maps,
             mapping_file, html, links_path, link_columns, baselines, as_json, cv_folds=None, jobs=None, cv_rows=None) -> None:
    """Evaluate: the Table 5 grid (--train --dev --out), its cross-validation (--cv K), a saved model on labelled
    data (--model --test), or a model against BM25 and MiniLM on real duplicate links (--kb --duplicates)."""
    from pathlib import Path

    from ..errors import InputError

    cfg = settings()
    if candidates is not None:
        cfg = cfg.replace(candidates=candidates)
    other = "duplicate links (--kb --duplicates)" if kb_path or links_path else \
        "a saved model (--model --test)" if model_dir and not train_path else None
    if other and (cv_folds is not None or cv_rows is not None):
        raise InputError(f"--cv and --cv-rows cross-validate --train and --dev; drop them to evaluate {other}")
    if kb_path or links_path:
        if not (kb_path and links_path):
            raise InputError("the duplicates protocol needs both --kb FILE (the tickets) and --duplicates FILE (the "
                             "links)")
        from ..evaluation.duplicates import public_rows, run_duplicates

        command = _command_line(["evaluate", "--kb", kb_path] + [a for m in maps for a in ("--map", m)]
                                + (["--mapping", mapping_file] if mapping_file else [])
                                + (["--html", html] if html != "auto" else []) + ["--duplicates", links_path]
                                + (["--link-columns", *link_columns] if link_columns else [])
                                + (["--model", model_dir] if model_dir else [])
                                + (["--out", out_dir] if out_dir else [])
                                + (["--candidates", str(candidates)] if candidates is not None else [])
                                + ([] if baselines else ["--no-baselines"]) + ["--seed", str(seed)]
                                + (["--grid", grid] if grid == "siamese" else []))
        if grid == "siamese":  # the grid's networks, trained on --kb alone, beside BM25
            if model_dir:
                raise InputError("--grid siamese trains its own networks on the --kb tickets: drop --model")
            from ..evaluation.siamese_duplicates import run_siamese_duplicates

            results = run_siamese_duplicates(kb_path, links_path, mapping=column_mapping(maps, mapping_file),
                                             html=html, link_columns=link_columns, out=out_dir, seed=seed,
                                             command=command, progress=_progress(as_json), warn=warn)
        else:
            results = run_duplicates(kb_path, links_path, mapping=column_mapping(maps, mapping_file), html=html,
                                     link_columns=link_columns, model_dir=model_dir, settings=cfg, baselines=baselines,
                                     out=out_dir, seed=seed, command=command, progress=_progress(as_json), warn=warn)
        rows = public_rows(results["rows"])
        for note in results["notes"]:
            warn(note)
        if as_json:
            echo_json(rows)
        else:
            _print_rows(rows, f"{results['data']['links']['queries']} duplicate queries over "
                              f"{results['data']['kb']['tickets']} tickets; [95 % bootstrap interval]")
            _print_paired(rows[0]["system"], results.get("paired", {}))
            if out_dir:
                click.echo(f"report: {Path(out_dir) / 'report.md'}")
        return
    if model_dir and not train_path:
        if not test_path:
            raise InputError("give labelled data to evaluate the model on: --model DIR --test FILE")
        from ..evaluation.saved_model import evaluate_saved_model

        command = _command_line(["evaluate", "--model", model_dir, "--test", test_path]
                                + (["--out", out_dir] if out_dir else [])
                                + (["--candidates", str(candidates)] if candidates is not None else [])
                                + ([] if baselines else ["--no-baselines"]) + (["--seed", str(seed)] if seed else []))
        results = evaluate_saved_model(model_dir, test_path, candidates=cfg.candidates, out=out_dir, command=command,
                                       progress=_progress(as_json), baselines=baselines, seed=seed)
        for note in results["notes"]:
            warn(note)
        if as_json:
            echo_json(results["rows"])
        else:
            _print_rows(results["rows"], f"model {results['model']['version']} on {test_path} "
                                         f"(knowledge-base protocol: K = {cfg.candidates} for the model)")
            _print_paired(results["rows"][0]["system"], results["paired"])
        return
    if not (train_path and dev_path and out_dir):
        raise InputError("say what to evaluate: --train FILE --dev FILE --out DIR (the grid), --model DIR --test FILE "
                         "(a saved model), or --kb FILE --duplicates FILE (duplicate links)")
    from ..evaluation.experiments import default_jobs, run_experiment

    jobs = default_jobs() if jobs is None else jobs
    if cv_rows is not None and cv_folds is None:
        raise InputError("--cv-rows chooses rows of the cross-validation: add --cv K")
    if cv_folds is not None:
        from ..evaluation.crossval import chosen_configs, run_cv

        keys = [k.strip() for k in (cv_rows or "").split(",") if k.strip()]
        configs = chosen_configs(keys)
        command = _command_line(["evaluate", "--train", train_path, "--dev", dev_path, "--cv", str(cv_folds),
                                 "--out", out_dir, "--seed", str(seed), "--jobs", str(jobs)]
                                + (["--cv-rows", ",".join(keys)] if keys else [])
                                + (["--candidates", str(candidates)] if candidates is not None else []))
        results = run_cv(train_path, dev_path, out_dir, k=cv_folds, seed=seed, candidates=cfg.candidates, jobs=jobs,
                         configs=configs, command=command, progress=_progress(as_json))
        echo_json({"report": str(Path(out_dir) / "report.md"), "verdict": results["verdict"],
                   "cv": {r["name"]: {k: r["cv"][k] for k in ("official_map", "kb_map@10")} for r in results["rows"]}})
        return
    command = _command_line(["evaluate", "--train", train_path, "--dev", dev_path]
                            + (["--test", test_path] if test_path else [])
                            + ["--grid", grid, "--out", out_dir, "--seeds", str(seeds), "--seed", str(seed),
                               "--jobs", str(jobs)]
                            + (["--candidates", str(candidates)] if candidates is not None else []))
    results = run_experiment(train_path, dev_path, out_dir, test=test_path, grid=grid, seeds=seeds, seed=seed,
                             candidates=cfg.candidates, command=command, jobs=jobs)
    from ..evaluation.report import best_row

    best = best_row(results["rows"], "dev")
    echo_json({"report": str(Path(out_dir) / "report.md"), "rows": len(results["rows"]), "notes": results["notes"],
               "best": None if best is None else {"name": best["name"], **{k: best["dev"].get(k) for k in
                                                  ("official_map", "official_mrr", "official_p@1", "kb_acc@10")}}})


def _progress(as_json: bool) -> bool:
    """Whether to show progress bars: always for a printed table; with `--json` only where stderr is a terminal (the
    bars go to stderr, the JSON to stdout, so a script reading stdout still gets JSON alone, and a user waiting on a
    large knowledge base is not left in silence)."""
    return not as_json or sys.stderr.isatty()


def _command_line(args: list[str]) -> str:
    """The command that produced a report: this process's own arguments when run as `ticketrec`, else `args`."""
    import shlex

    if sys.argv and sys.argv[0].endswith("ticketrec") and len(sys.argv) > 1 and sys.argv[1] == "evaluate":
        return "ticketrec " + shlex.join(sys.argv[1:])
    return "ticketrec " + shlex.join(str(a) for a in args)


def _print_paired(first: str, paired: dict) -> None:
    """The first system minus each other one, per query: one "Δ against X:" line each (nothing when alone)."""
    from ..evaluation.duplicates import paired_line

    if paired:
        click.echo(f"{first} minus each other system, per query [95 % paired bootstrap interval]:")
    for system, by_metric in paired.items():
        click.echo(f"  Δ against {system}: {paired_line(by_metric)}")


def _print_rows(rows: list[dict], caption: str) -> None:
    """An evaluation table: one line per row, MRR@10 and Acc@k (with intervals when the rows have them)."""
    metrics = ("MRR@10", "Acc@1", "Acc@5", "Acc@10") + (("MAP@10",) if any("MAP@10" in r for r in rows) else ())
    click.echo(caption)
    width = max([len(r["system"]) + len(r.get("protocol", "")) + 3 for r in rows] + [6])
    click.echo(f"{'system':<{width}}  " + "  ".join(f"{m:>21}" for m in metrics))
    for r in rows:
        name = r["system"] + (f" [{r['protocol']}]" if r.get("protocol") else "")
        cells = []
        for m in metrics:
            value = r.get(m)
            text = "–" if value is None else f"{value:.3f}"
            if f"{m}_low" in r:
                text += f" [{r[m + '_low']:.2f}, {r[m + '_high']:.2f}]"
            cells.append(f"{text:>21}")
        click.echo(f"{name:<{width}}  " + "  ".join(cells))
