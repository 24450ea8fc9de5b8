"""Cross-validated weight selection: folds by query, the simplicity-prior rule, and a tiny end-to-end CV run."""
import json

import numpy as np
import pytest

from recommender.data import synthetic
from recommender.errors import InputError
from recommender.evaluation import crossval as CV
from recommender.evaluation import metrics as M
from recommender.model.bundle import TicketModel


def test_folds_are_disjoint_by_query_cover_all_and_are_seeded():
    ids = [f"q{i}" for i in range(23)] * 3  # repeated ids (one per pair) count once
    folds = CV.query_folds(ids, 5, seed=7)
    assert len(folds) == 5
    flat = [q for f in folds for q in f]
    assert sorted(flat) == sorted(set(ids)) and len(flat) == len(set(flat))
    assert max(map(len, folds)) - min(map(len, folds)) <= 1
    assert CV.query_folds(ids, 5, seed=7) == folds and CV.query_folds(ids, 5, seed=8) != folds
    with pytest.raises(InputError, match="more folds"):
        CV.query_folds(["a", "b"], 3)


def test_fold_subsets_keep_their_own_pairs_and_tickets():
    data = synthetic.generate(n_tickets=40, n_queries=10, seed=3)
    folds = CV.query_folds([p.query_id for p in data.pairs], 3, seed=0)
    seen_pairs = 0
    for f in folds:
        part = CV.subset(data, f, "fold")
        assert {q.id for q in part.queries} == set(f)
        assert {p.query_id for p in part.pairs} <= set(f)
        assert {p.ticket_id for p in part.pairs} == {t.id for t in part.tickets}
        seen_pairs += len(part.pairs)
    assert seen_pairs == len(data.pairs)


def test_pooling_prefixes_ids_only_when_they_collide():
    a = synthetic.generate(n_tickets=10, n_queries=3, seed=1)
    b = synthetic.generate(n_tickets=10, n_queries=3, seed=2)
    pooled = CV.pool_datasets([("train", a), ("dev", b)])
    assert len(pooled.tickets) == 20 and len(pooled.pairs) == len(a.pairs) + len(b.pairs)
    assert len({t.id for t in pooled.tickets}) == 20
    assert all(p.query_id.split(":")[0] in ("train", "dev") for p in pooled.pairs)


def test_the_rule_prefers_the_simpler_of_two_equally_good_weightings():
    combos = [{"h": 0.7, "E": 0.1, "S": 0.3, "p": 1.0}, {"h": 0.0, "E": 0.3, "S": 0.3, "p": 1.0},
              {"h": 0.0, "E": 0.1, "S": 1.0, "p": 1.0}]
    same = np.array([[80.0, 60.0, 70.0], [80.0, 60.0, 70.0], [80.0, 60.0, 70.0]])
    pick, how = CV.select_simplest(combos, same, ["h", "E", "S"], ["p"])
    assert pick == 1  # two channels beat three; equal weights beat 0.1 / 1.0
    assert how["eligible"] == 3
    # far worse simple weighting is not eligible: outside one standard error of the best
    worse = np.array([[80.0, 79.0, 81.0], [40.0, 41.0, 39.0], [40.0, 41.0, 39.0]])
    assert CV.select_simplest(combos, worse, ["h", "E", "S"], ["p"])[0] == 0
    # a fixed margin instead of the standard error
    close = np.array([[80.0, 80.0, 80.0], [79.0, 79.0, 79.0], [50.0, 50.0, 50.0]])
    assert CV.select_simplest(combos, close, ["h", "E", "S"], ["p"], margin=0.5)[0] == 0
    assert CV.select_simplest(combos, close, ["h", "E", "S"], ["p"], margin=2.0)[0] == 1


def test_per_query_ap_matches_the_metrics_module():
    from recommender.model.training import GroupTable

    groups = np.array([0, 0, 0, 1, 1, 1])
    labels = np.array([5.0, 1.0, 3.0, 1.0, 1.0, 5.0])
    scores = np.array([[0.9, 0.8, 0.1, 0.5, 0.4, 0.3]])
    table = GroupTable(groups, labels, 3.0)
    ap = table.per_query_ap(scores)[0]  # a row per weighting, as the selection scores them
    run = {"a": ["t0", "t1", "t2"], "b": ["t3", "t4", "t5"]}
    qrels = {"a": {"t0": 5.0, "t1": 1.0, "t2": 3.0}, "b": {"t3": 1.0, "t4": 1.0, "t5": 5.0}}
    per = M.per_query_values(run, qrels)
    assert ap == pytest.approx([per["a"]["official_map"], per["b"]["official_map"]])
    assert table.map(scores[0]) == pytest.approx(ap.mean())


def test_paired_bootstrap_difference():
    a, b = np.linspace(0, 1, 40), np.linspace(0, 1, 40) - 0.2
    d = M.paired_bootstrap_difference(a, b, n_boot=500, seed=1)
    assert d["diff"] == pytest.approx(0.2) and d["low"] == pytest.approx(0.2) and d["high"] == pytest.approx(0.2)
    noisy = M.paired_bootstrap_difference(np.random.default_rng(0).normal(size=50), np.zeros(50), n_boot=500)
    assert noisy["low"] < noisy["diff"] < noisy["high"]
    with pytest.raises(InputError):
        M.paired_bootstrap_difference([1.0], [1.0, 2.0])


#: Tiny model dimensions for the end-to-end CV runs.
TINY = {"hidden": 8, "word_dim": 16, "char_dim": 4, "char_hidden": 4, "topics": 5, "topic_vocab": 200,
        "topic_epochs": 1, "epochs": 1, "w2v_epochs": 1, "min_count": 1}


def _train_and_dev(tmp_path, train_size: tuple[int, int], dev_size: tuple[int, int]):
    """Two synthetic files (tickets, queries) to pool: (train path, dev path)."""
    train, dev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    synthetic.write_jsonl(synthetic.generate(n_tickets=train_size[0], n_queries=train_size[1], seed=1), train)
    synthetic.write_jsonl(synthetic.generate(n_tickets=dev_size[0], n_queries=dev_size[1], seed=2), dev)
    return train, dev


def test_tiny_cross_validation_end_to_end(tmp_path):
    train, dev = _train_and_dev(tmp_path, (40, 9), (30, 6))
    tiny = dict(TINY, grid={"h": [0.0, 0.5], "E": [0.0, 0.5], "bm25": [0.0, 0.3]})
    configs = [CV.CvConfig(CV.BM25_NAME, "bm25", kind="bm25"),
               CV.CvConfig(CV.ZERO_SHOT_NAME, "E only, untrained", preset="e_ml"),
               CV.CvConfig("h/E + BM25 simplest", "trained", preset="default", overrides={"channels": {"h": 0.7, "E": 0.3}},
                           select="simplest", trained=True)]
    out = tmp_path / "cv"
    results = CV.run_cv(train, dev, out, k=3, candidates=20, configs=configs, overrides=tiny, n_boot=200, progress=False)
    assert len(results["folds"]) == 3 and sum(f["queries"] for f in results["folds"]) == 15
    trained = results["rows"][-1]
    assert set(trained["weights"]) >= {"h", "E", "bm25"} and len(trained["weights"]["h"]["values"]) == 3
    for row in results["rows"]:
        for key in ("official_map", "kb_map@10", "kb_acc@10"):
            f = row["folds"][key]
            assert f["min"] <= row["cv"][key] + 1e-9 and row["cv"][key] <= f["max"] + 1e-9
    assert set(trained["vs"]) == {CV.BM25_NAME, CV.ZERO_SHOT_NAME}
    assert results["verdict"]["winner"] == "h/E + BM25 simplest"
    md = (out / "report.md").read_text()
    assert "## Verdict" in md and "Selected weights per fold" in md and results["command"] in md
    assert len(list((out / "predictions").glob("fold*/*.rerank.pred"))) == 9
    # each fold's saved model is the one evaluated: the weights its selection chose, and its training report says so
    # (the selection, and the calibration and figures of those weights, not of the fixed weights it trained with)
    for fold, h in enumerate(trained["weights"]["h"]["values"]):
        saved = TicketModel.load(out / "models" / f"fold{fold}-{CV.slug(trained['name'])}")
        assert saved.metric_spec()["channels"]["h"] == pytest.approx(h)
        report = saved.meta["training"]
        assert report["weight_selection"]["spec"] == saved.metric_spec()
        assert report["weight_selection"]["weights"]["h"] == pytest.approx(h)
        assert report["dev_source"].startswith("selection queries")
        assert report["calibration"]["labelled_pairs"] > 0
        assert 0.0 <= report["dev"]["map"] <= 100.0


def test_folds_in_worker_processes_give_the_figures_of_one_process(tmp_path):
    """`jobs` > 1 runs the folds in spawned workers (`_worker_init`: one thread, no bars of their own); the folds'
    figures are the ones a single process computes."""
    train, dev = _train_and_dev(tmp_path, (40, 9), (30, 6))
    configs = [CV.CvConfig(CV.BM25_NAME, "bm25", kind="bm25"),
               CV.CvConfig(CV.ZERO_SHOT_NAME, "E only, untrained", preset="e_ml")]
    runs = {jobs: CV.run_cv(train, dev, tmp_path / f"jobs{jobs}", k=3, candidates=20, configs=configs,
                            overrides=TINY, n_boot=50, progress=False, jobs=jobs) for jobs in (1, 2)}
    assert runs[2]["jobs"] == 2
    for one, two in zip(runs[1]["rows"], runs[2]["rows"]):
        assert one["name"] == two["name"] and one["cv"] == two["cv"] and one["folds"] == two["folds"]


def test_cli_cv_rejects_a_single_fold(tmp_path):
    from click.testing import CliRunner

    from recommender.cli import main

    data = synthetic.write_jsonl(synthetic.generate(n_tickets=20, n_queries=4, seed=1), tmp_path / "d.jsonl")
    result = CliRunner().invoke(main, ["evaluate", "--train", str(data), "--dev", str(data), "--cv", "1",
                                       "--out", str(tmp_path / "cv"), "--jobs", "1"])
    assert result.exit_code != 0
    assert "at least 2 folds" in (result.output + str(result.exception))


def test_cli_cv_rows_runs_only_the_rows_asked_for_and_names_what_it_left_out(tmp_path):
    from click.testing import CliRunner

    from recommender.cli import main

    train, dev = _train_and_dev(tmp_path, (40, 9), (30, 6))
    base = ["evaluate", "--train", str(train), "--dev", str(dev), "--cv", "3", "--jobs", "1", "--candidates", "20"]
    result = CliRunner().invoke(main, base + ["--out", str(tmp_path / "bad"), "--cv-rows", "bm25,default-no-label"])
    assert result.exit_code != 0
    message = result.output + str(result.exception)
    assert "unknown --cv-rows default-no-label" in message and "default-no-labels" in message
    assert not (tmp_path / "bad" / "results.json").exists()
    result = CliRunner().invoke(main, ["evaluate", "--train", str(train), "--dev", str(dev), "--out",
                                       str(tmp_path / "grid"), "--cv-rows", "bm25"])
    assert result.exit_code != 0 and "add --cv K" in (result.output + str(result.exception))

    for other in (["--kb", str(train), "--duplicates", str(tmp_path / "links.csv")], ["--model", str(tmp_path), "--test",
                                                                                      str(dev)]):
        result = CliRunner().invoke(main, ["evaluate", *other, "--cv", "3"])
        assert result.exit_code != 0 and "drop them to evaluate" in (result.output + str(result.exception))

    out = tmp_path / "cv"
    result = CliRunner().invoke(main, base + ["--out", str(out), "--cv-rows", "bm25"])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert [r["name"] for r in results["rows"]] == [CV.BM25_NAME]
    assert "--cv-rows bm25" in results["command"]
    assert results["verdict"] == {"winner": None, "beats": {}, "default": None}


def test_a_verdict_without_a_baseline_names_no_default():
    from recommender.evaluation.report import render_cv_markdown

    def row(name, trained, low):
        vs = {CV.BM25_NAME: {k: {"diff": 1.0, "low": low, "high": 2.0} for k in ("official_map", "kb_map@10")}}
        return {"name": name, "trained": trained, "cv": {"official_map": 80.0 if trained else 70.0},
                "vs": vs if trained else {}}

    rows = [row(CV.BM25_NAME, False, 0), row("trained", True, 0.5)]
    v = CV.verdict(rows)
    assert v == {"winner": "trained", "beats": {CV.BM25_NAME: True}, "default": None}
    md = render_cv_markdown({"rows": [], "verdict": v, "data": {}, "folds": [], "k": 3, "seed": 0, "candidates": 20,
                             "bootstrap": 200, "date": "d", "command": "c"})
    assert "Not compared with S zero-shot (MiniLM)" in md and "can stay the default" not in md
    assert "should not be the default" not in md
    both = [row(CV.BM25_NAME, False, 0), row(CV.ZERO_SHOT_NAME, False, 0), row("trained", True, 0.5)]
    both[-1]["vs"][CV.ZERO_SHOT_NAME] = both[-1]["vs"][CV.BM25_NAME]
    assert CV.verdict(both)["default"] == "trained"


def test_the_default_recipe_is_cross_validated_on_the_training_folds_alone(tmp_path):
    from recommender.data.importers import load
    from recommender.model.mining import require_minable

    train, dev = _train_and_dev(tmp_path, (80, 12), (60, 9))
    paper = {"channels": {"h": 0.7, "E": 0.1, "T": 0.2}}  # the recipe without S: no MiniLM in a unit test
    configs = [CV.CvConfig(CV.BM25_NAME, "bm25", kind="bm25"),
               CV.CvConfig(CV.ZERO_SHOT_NAME, "E only, untrained", preset="e_ml"),
               CV.CvConfig("with labels", "mined + labelled", kind="mined", labels=True, trained=True, overrides=paper),
               CV.CvConfig("labels dropped", "mined only", kind="mined", trained=True, overrides=paper)]
    out = tmp_path / "cv"
    results = CV.run_cv(train, dev, out, k=3, candidates=20, configs=configs, overrides=TINY, n_boot=200, progress=False)
    pooled = CV.pool_datasets([("train", load(train)), ("dev", load(dev))])
    folds = CV.query_folds([p.query_id for p in pooled.pairs], 3, seed=0)
    rows = {r["name"]: r for r in results["rows"]}
    for name, labels in (("with labels", True), ("labels dropped", False)):
        row = rows[name]
        assert row["kind"] == "mined" and set(row["vs"]) == {CV.BM25_NAME, CV.ZERO_SHOT_NAME}
        assert set(row["weights"]) >= {"h", "E", "T", "bm25"}
        for fold, held_out in enumerate(folds):
            others = CV.subset(pooled, [q for f in folds if f is not held_out for q in f], "others")
            saved = TicketModel.load(out / "models" / f"fold{fold}-{CV.slug(name)}")
            report = saved.meta["training"]
            assert report["mode"] == "label-free"
            # mined from the other folds' tickets only, with their labelled pairs exactly when asked to
            assert report["mining"]["minable_tickets"] == require_minable(others.tickets)
            assert report["labelled_pairs"] == (len(others.pairs) if labels else 0)
            assert row["weights"]["h"]["values"][fold] == pytest.approx(saved.metric_spec()["channels"]["h"])
    assert "The default recipe" in (out / "report.md").read_text()
