"""benchmarks/cv_label_selection.py: a cross-validation's default-recipe fold models, their channel weights re-selected
on the training folds' labels and scored as the cross-validation scores them. Its labels-dropped row must be what
`ticketrec train` with the mining option `select_on_labelled` trains on the same folds, or its figures say nothing
about the option."""
import pytest

from cv_label_selection import ROWS, ZERO_SHOT, run_fold, table
from recommender.data import synthetic
from recommender.data.importers import load
from recommender.evaluation import crossval as CV
from recommender.evaluation.experiments import ModelSystem, _evaluate_system
from recommender.model.unsupervised import label_free_config, train_without_labels

TINY = {"hidden": 8, "word_dim": 16, "char_dim": 4, "char_hidden": 4, "topics": 5, "topic_vocab": 200,
        "topic_epochs": 1, "epochs": 1, "w2v_epochs": 1, "min_count": 1}
PAPER = {"channels": {"h": 0.7, "E": 0.1, "T": 0.2}}  # the recipe without S: no MiniLM in a unit test


def test_the_labels_dropped_row_re_selected_is_the_option_trained(tmp_path, monkeypatch):
    import recommender.model.unsupervised as unsupervised
    import recommender.model.weight_selection as weight_selection

    for module in (weight_selection, unsupervised):  # a training fold of this tiny set holds 14 labelled queries
        monkeypatch.setattr(module, "MIN_LABELLED_QUERIES", 5)
    train, dev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    synthetic.write_jsonl(synthetic.generate(n_tickets=80, n_queries=12, seed=1), train)
    synthetic.write_jsonl(synthetic.generate(n_tickets=60, n_queries=9, seed=2), dev)
    configs = [CV.CvConfig(CV.BM25_NAME, "bm25", kind="bm25"),
               CV.CvConfig(ZERO_SHOT, "E only, untrained", preset="e_ml"),
               CV.CvConfig(ROWS[0], "mined + labelled", kind="mined", labels=True, trained=True, overrides=PAPER),
               CV.CvConfig(ROWS[1], "mined only", kind="mined", trained=True, overrides=PAPER)]
    out = tmp_path / "cv"
    CV.run_cv(train, dev, out, k=3, candidates=20, configs=configs, overrides=TINY, n_boot=200, progress=False)

    folds = [run_fold(str(out), fold) for fold in range(3)]  # each saved row must score as the run recorded it
    for fold in folds:
        for name in ROWS:
            assert fold[f"{name}, re-selected on the labels"]["report"]["applied"]

    pooled = CV.pool_datasets([("train", load(train)), ("dev", load(dev))])
    held_out = CV.query_folds([p.query_id for p in pooled.pairs], 3, seed=0)[0]
    others, test = CV.fold_split(pooled, held_out, 0)
    model = train_without_labels(others.tickets, label_free_config(**PAPER, **TINY), None, seed=0, labelled=others,
                                 mining={"select_on_labelled": True}, progress=False, echo=lambda _: None)
    assert model.meta["training"]["labelled_use"] == "weight selection"
    metrics = _evaluate_system(ModelSystem(model, test, 20), test, 10, False)[0]
    benchmark = folds[0][f"{ROWS[1]}, re-selected on the labels"]
    assert metrics["official_map"] == pytest.approx(benchmark["metrics"]["official_map"])
    assert metrics["kb_map@10"] == pytest.approx(benchmark["metrics"]["kb_map@10"])
    assert {c: w for c, w in model.metric_spec()["channels"].items() if w} == pytest.approx(
        {c: w for c, w in benchmark["weights"].items() if c != "bm25"})
    assert f"| {ROWS[1]}, re-selected on the labels |" in table(folds)
