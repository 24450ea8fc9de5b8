"""The experiment grid and its report: rendering from a results dict, and a tiny synthetic end-to-end run."""
import csv
import json

import pytest

from recommender.data import synthetic
from recommender.errors import InputError
from recommender.evaluation import experiments as X
from recommender.evaluation import report as R


def _results():
    rows = []
    for name, off_map, kb in (("BM25", 64.7, 0.78), ("ML+CL h/E/T", 73.0, 0.80), ("best", 76.1, 0.83)):
        dev = {k: 0.5 for k, _, _ in R.COLUMNS}
        dev.update({"official_map": off_map, "kb_acc@10": kb, "acc@1": 0.4, "acc@5": 0.7, "acc@10": 0.9,
                    "kb_success_yes>=1": 0.5, "kb_success_yes+rel>=1": 0.8, "kb_success_yes+rel>=3": 0.3})
        rows.append({"name": name, "paper_row": "22" if name != "BM25" else "", "description": "d", "kind": "model",
                     "seeds": [0, 1, 2], "model_versions": ["abcdef0123456789"], "dev": dev,
                     "dev_spread": {"official_map": 0.4}})
    return {"name": "unit", "command": "ticketrec evaluate --train a --dev b --grid quick --out reports/unit",
            "date": "2025-01-01T00:00:00+00:00", "candidates": 1000, "threshold": 3.0,
            "data": {"train": {"path": "a", "sha256": "0" * 64, "tickets": 3, "queries": 1, "pairs": 3}},
            "versions": {"torch": "x"}, "rows": rows, "notes": ["a note"]}


def test_report_files_table_best_row_and_plots(tmp_path):
    results = _results()
    calib = {"best": ([1.5, 2.5, 4.0, 4.5], [1.0, 3.0, 5.0, 5.0])}
    paths = R.write_report(results, tmp_path, calib)
    md = paths["md"].read_text()
    assert results["command"] in md and "0" * 16 in md and "abcdef012345" in md
    best_line = next(line for line in md.splitlines() if "76.10" in line)
    assert best_line.startswith("| **") and "76.10 ± 0.40" in best_line
    assert not next(line for line in md.splitlines() if "64.70" in line).startswith("| **")
    for png in ("acc_map_at_k.png", "calibration.png", "success_rate.png"):
        data = (tmp_path / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
        assert f"]({png})" in md
    table = list(csv.DictReader(paths["csv"].open()))
    assert [r["row"] for r in table] == ["BM25", "ML+CL h/E/T", "best"]
    assert float(table[2]["official_map"]) == 76.1
    assert json.loads(paths["json"].read_text())["rows"][0]["name"] == "BM25"


def test_grids_name_every_table5_row_and_reject_unknown():
    rows = X.grid_rows("table5")
    papers = {r.paper_row for r in rows}
    assert {str(i) for i in range(1, 10)} | {"11", "12", "13", "14", "15", "18", "19", "20", "21", "22"} <= papers
    names = [r.name for r in rows]
    assert len(names) == len(set(names))
    assert any(r.kind == "bm25" for r in rows) and any("S zero-shot" == r.name for r in rows)
    assert not any(r.trained for r in rows if r.paper_row in {str(i) for i in range(1, 15)})
    assert 2 <= len(X.grid_rows("quick")) <= 3
    with pytest.raises(InputError, match="table5, core or quick"):
        X.grid_rows("nope")


def test_missing_data_file_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        X.run_experiment(tmp_path / "none.jsonl", tmp_path / "none2.jsonl", tmp_path / "out", grid="quick", progress=False)


def test_quick_grid_end_to_end_on_tiny_synthetic_data(tmp_path):
    """The whole path on generated data with tiny model dimensions: report.md, results.csv, plots, predictions."""
    train, dev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    synthetic.write_jsonl(synthetic.generate(n_tickets=40, n_queries=8, seed=1), train)
    synthetic.write_jsonl(synthetic.generate(n_tickets=30, n_queries=6, seed=2), dev)
    tiny = {"hidden": 8, "word_dim": 16, "char_dim": 4, "char_hidden": 4, "topics": 5, "topic_vocab": 200,
            "topic_epochs": 1, "epochs": 1, "w2v_epochs": 1, "min_count": 1}
    out = tmp_path / "report"
    results = X.run_experiment(train, dev, out, grid="quick", seeds=2, overrides=tiny, candidates=20, progress=False)
    assert not results["notes"], results["notes"]
    assert len(results["rows"]) == 3
    for name in ("report.md", "results.csv", "results.json", "acc_map_at_k.png", "calibration.png", "success_rate.png"):
        assert (out / name).stat().st_size > 0, name
    headline = results["rows"][-1]
    assert headline["seeds"] == [0, 1] and "official_map" in headline["dev_spread"]
    for row in results["rows"]:
        for key in ("official_map", "map@10", "acc@10", "kb_acc@10", "mse"):
            assert key in row["dev"], (row["name"], key)
        assert 0.0 <= row["dev"]["acc@10"] <= 1.0
    preds = sorted((out / "predictions" / "dev").glob("*.rerank.pred"))
    assert len(preds) == 4  # every seed of the headline row, one seed of the others
    assert {p.name for p in preds if "paper-weights" in p.name} == {
        "ml-cl-h-e-t--paper-weights-seed0.rerank.pred", "ml-cl-h-e-t--paper-weights-seed1.rerank.pred"}
    assert len(headline["dev_per_seed"]) == 2 and "## Per-seed figures on dev" in (out / "report.md").read_text()
    first = preds[0].read_text().splitlines()[0].split("\t")
    assert len(first) == 5 and first[2] == "0" and first[4] in ("true", "false")


def test_a_row_that_cannot_be_configured_fails_before_any_training(tmp_path):
    from recommender.errors import InputError
    from recommender.evaluation.experiments import Row, run_experiment
    from recommender.data.synthetic import generate, write_jsonl

    data = write_jsonl(generate(n_tickets=30, n_queries=4, seed=2), tmp_path / "d.jsonl")
    rows = [Row("fine", "", "", preset="e_ml"), Row("broken", "", "", preset="no_such_preset")]
    with pytest.raises(InputError, match="no_such_preset"):
        run_experiment(data, data, tmp_path / "out", rows=rows, progress=False)
    assert not (tmp_path / "out" / "models").exists()


def test_parallel_grid_equals_serial_and_writes_every_seed(tmp_path):
    """Rows in worker processes give exactly the serial figures and predictions."""
    train, dev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    synthetic.write_jsonl(synthetic.generate(n_tickets=30, n_queries=6, seed=1), train)
    synthetic.write_jsonl(synthetic.generate(n_tickets=25, n_queries=5, seed=2), dev)
    tiny = {"hidden": 8, "word_dim": 16, "char_dim": 4, "char_hidden": 4, "topics": 5, "topic_vocab": 200,
            "topic_epochs": 1, "epochs": 1, "w2v_epochs": 1, "min_count": 1}
    rows = [X.Row("BM25", "", "", kind="bm25"), X.Row("E ML", "", "", preset="e_ml"),
            X.Row("h/E", "", "", preset="ml_cl_hE", headline=True), X.Row("h", "", "", preset="ml")]
    runs = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        runs[jobs] = (out, X.run_experiment(train, dev, out, rows=rows, seeds=2, overrides=tiny, candidates=10,
                                            progress=False, jobs=jobs))
    (serial_out, serial), (parallel_out, parallel) = runs[1], runs[2]
    assert [r["name"] for r in parallel["rows"]] == [r.name for r in rows]
    for a, b in zip(serial["rows"], parallel["rows"]):
        assert a["dev"] == pytest.approx(b["dev"], nan_ok=True), a["name"]
        assert a["seeds"] == b["seeds"]
    files = sorted(p.relative_to(serial_out) for p in (serial_out / "predictions").rglob("*.pred"))
    assert len(files) == 10  # rerank and kb of h/E seeds 0 and 1, of the others seed 0
    for f in files:
        assert (serial_out / f).read_text() == (parallel_out / f).read_text(), f
    with pytest.raises(InputError, match="--jobs"):
        X.run_experiment(train, dev, tmp_path / "x", rows=rows, jobs=0, progress=False)
