"""Training: determinism, held-out dev, the Table 2 grid, learned weights, calibration, measures."""
import numpy as np
import pytest
from sklearn.isotonic import IsotonicRegression

from recommender.model.calibration import Calibrator
from recommender.errors import InputError
from recommender.data.records import LabeledPair
from recommender.model.siamese import SiameseConfig
from recommender.data.store import Dataset
from recommender.lexical.bm25 import Bm25Scorer
from recommender.model.training import (PairSet, PreparedPairs, lexical_features, mean_average_precision, pair_scores,
                                        random_negatives, select_weights, split_queries, train_model)

TINY = dict(word_dim=16, hidden=8, char_dim=4, char_hidden=5, epochs=2, batch_size=8, min_count=1, w2v_epochs=2,
            channels={"h": 0.7, "E": 0.3})


def _pairs(data):
    qmap, tmap = data.query_map(), data.ticket_map()
    return [qmap[p.query_id] for p in data.pairs], [tmap[p.ticket_id] for p in data.pairs]


def test_same_seed_gives_the_same_model_and_another_seed_does_not(tiny_tickets):
    train, dev = tiny_tickets(0), tiny_tickets(1)
    config = SiameseConfig(**TINY)
    a = train_model(train, dev, config, None, seed=0, progress=False)
    b = train_model(train, dev, config, None, seed=0, progress=False)
    c = train_model(train, dev, config, None, seed=1, progress=False)
    qs, ts = _pairs(dev)
    assert np.array_equal(a.score_pairs(qs, ts), b.score_pairs(qs, ts))
    assert a.version == b.version != c.version
    assert not np.allclose(a.score_pairs(qs, ts), c.score_pairs(qs, ts))
    report = a.meta["training"]
    assert [h["epoch"] for h in report["history"]] == [1, 2]
    assert set(report["dev"]) == {"pearson", "spearman", "mse", "map"}
    assert report["dev_source"] == "dev file"


def test_training_learns_the_tiny_topics(tiny_tickets):
    """h+E on 4 clearly separated topics: dev pairs of the query's topic must score above the others."""
    train, dev = tiny_tickets(0, n_queries=12), tiny_tickets(1)
    model = train_model(train, dev, SiameseConfig(**{**TINY, "epochs": 3}), None, seed=0, progress=False)
    qs, ts = _pairs(dev)
    g = model.score_pairs(qs, ts)
    labels = np.array([p.score for p in dev.pairs])
    assert g[labels == 5].mean() > g[labels == 1].mean()
    assert model.meta["training"]["dev"]["pearson"] > 0.3


def test_without_dev_a_seeded_share_of_queries_is_held_out(tiny_tickets):
    data = tiny_tickets(0, n_queries=10)
    train, dev = split_queries(data, 0.2, seed=5)
    assert {p.query_id for p in train.pairs}.isdisjoint({p.query_id for p in dev.pairs})
    assert len({p.query_id for p in dev.pairs}) == 2 and len(train.pairs) + len(dev.pairs) == len(data.pairs)
    assert split_queries(data, 0.2, seed=5)[1].pairs == dev.pairs
    model = train_model(data, None, SiameseConfig(**{**TINY, "epochs": 1}), None, seed=0, progress=False)
    assert model.meta["training"]["dev_source"] == "held-out training queries"
    assert model.meta["training"]["dev_pairs"] == 8


def test_learned_weights_move_and_stay_positive(tiny_tickets):
    config = SiameseConfig(**{**TINY, "weights": "learn", "weight_lr": 0.2})
    model = train_model(tiny_tickets(0), tiny_tickets(1), config, None, seed=0, progress=False)
    spec = model.metric_spec()
    assert all(w > 0 for w in spec["channels"].values()) and all(v > 0 for *_, v in spec["pairs"])
    assert spec["channels"] != pytest.approx({"h": 0.7, "E": 0.3}, abs=1e-3)


def test_labelled_training_calibrates_without_ties_and_with_random_tickets_as_no(tiny_tickets):
    """The labelled path's calibrator is strictly increasing in g (results never tie at one score) and is fitted with
    random tickets of the knowledge base as NO pairs besides the labelled ones, so an unrelated ticket scores lower
    than a fit on the labelled pairs alone would score it."""
    train, dev = tiny_tickets(0), tiny_tickets(1)
    model = train_model(train, dev, SiameseConfig(**{**TINY, "bm25": 0.0}), None, seed=0, progress=False)
    assert np.all(np.diff(model.calibrate(np.linspace(0.0, 1.0, 201))) > 0)
    pairs = PairSet.from_dataset(train, "training")
    data = PreparedPairs.of(model, pairs, None)
    labelled_only = Calibrator.fit_centered(pair_scores(model, data), pairs.y)
    random_g, random_y = random_negatives(model, data, train.tickets, None, seed=0)
    assert len(random_g) >= len(pairs.queries) and set(random_y.tolist()) == {1.0}
    assert model.calibrate(random_g).mean() < labelled_only(random_g).mean() - 0.1
    report = model.meta["training"]["calibration"]  # what training prints and `ticketrec train --no-mined` reports
    assert report["labelled_pairs"] == len(pairs) and report["random_no"] == len(random_g)
    medians = report["median_score"]
    assert set(medians) == {"label 5", "label 1", "random tickets"}
    assert medians["label 5"] > medians["label 1"] and 1 <= medians["random tickets"] <= 5


def test_select_weights_finds_the_informative_channel():
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(10), 5)
    labels = rng.choice([1.0, 3.0, 5.0], size=50)
    dist = np.zeros((50, 2, 2))
    dist[:, :, 0] = rng.random((50, 2)) * 5  # channel "h": noise
    dist[:, :, 1] = (5 - labels)[:, None] / 2  # channel "E": distance falls with the label
    current = {"pairs": [["SUB", "SUB", 0.5], ["DESC", "DESC", 0.5]], "channels": {"h": 0.5, "E": 0.5}, "bm25": 0.0}
    grid = {"h": [0.0, 1.0], "E": [0.0, 1.0], "SUB|SUB": [0.3, 0.4]}
    spec, best = select_weights(dist, labels, groups, current["pairs"], ["h", "E"], grid, current)
    assert spec["channels"] == {"h": 0.0, "E": 1.0}
    assert best == pytest.approx(mean_average_precision(groups, labels, labels))  # the perfect order
    assert spec["pairs"][1] == ["DESC", "DESC", 0.5]  # not in the grid: kept


def test_mean_average_precision_by_hand():
    groups = np.array([0, 0, 0, 1, 1])
    scores = np.array([0.9, 0.8, 0.1, 0.5, 0.4])
    labels = np.array([1.0, 5.0, 3.0, 1.0, 1.0])  # query 1 has no relevant ticket: counts 0
    ap0 = (1 / 2 + 2 / 3) / 2
    assert mean_average_precision(groups, scores, labels) == pytest.approx(100 * ap0 / 2)


def test_calibrator_is_sklearn_isotonic_and_roundtrips_json(tmp_path):
    rng = np.random.default_rng(0)
    g = rng.random(60)
    y = np.clip(1 + 4 * g + rng.normal(0, 0.8, 60), 1, 5)
    cal = Calibrator.fit(g, y)
    iso = IsotonicRegression(out_of_bounds="clip", y_min=1, y_max=5).fit(g, y)
    probe = np.linspace(-0.5, 1.5, 41)
    assert np.allclose(cal(probe), iso.predict(probe))
    assert cal(probe).min() >= 1 and cal(probe).max() <= 5 and np.all(np.diff(cal(probe)) >= 0)
    cal.save(tmp_path / "c.json")
    assert np.array_equal(Calibrator.load(tmp_path / "c.json")(probe), cal(probe))
    assert "X_thresholds_" in (tmp_path / "c.json").read_text()


def test_lexical_features_divide_by_the_knowledge_base_maximum():
    from recommender.data.records import Query, Ticket

    tickets = [Ticket("a", "Valve leak", "The seal is worn.", "Replace the seal."),
               Ticket("b", "Turbine blade", "Blade crack.", "Swap it."),
               Ticket("c", "Valve leak at the seal", "Valve seal worn, leak at the valve.", "New valve seal.")]
    data = Dataset(tickets, [Query("Valve leak", "worn seal", id="q")], [LabeledPair("q", "a", 5.0), LabeledPair("q", "b", 1.0)])
    pairs = PairSet.from_dataset(data, "training")
    lexical = lexical_features(pairs, tickets)  # "c" is not labelled but is in the knowledge base
    every = Bm25Scorer(tickets).scores("Valve leak\nworn seal")
    assert every.argmax() == 2 and lexical.tolist() == [every[0] / every[2], 0.0]
    assert 0 < lexical[0] < 1  # normalised by the knowledge base's best ticket, not by the labelled ones
    with pytest.raises(InputError, match="outside the knowledge base"):
        lexical_features(pairs, tickets[1:])


def test_pairs_naming_unknown_tickets_are_refused(tiny_tickets):
    data = tiny_tickets(0)
    broken = Dataset(data.tickets, data.queries, data.pairs + [LabeledPair("q0", "nope", 5.0)])
    with pytest.raises(InputError, match="nope"):
        PairSet.from_dataset(broken, "training")
    with pytest.raises(InputError, match="no labelled pairs"):
        train_model(Dataset(data.tickets, data.queries, []), None, SiameseConfig(**TINY), None, progress=False)
