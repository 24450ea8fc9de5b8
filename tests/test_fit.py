"""The public training API: `fit` returns a trained copy and never changes its input; feedback is built on it."""
import ast
from pathlib import Path

import numpy as np
import pytest
import torch

from recommender.model.siamese import SiameseConfig
from recommender.model.training import PairSet, PreparedPairs, evaluate, fit, pair_scores, train_model

TINY = dict(word_dim=16, hidden=8, char_dim=4, char_hidden=5, epochs=1, batch_size=8, min_count=1, w2v_epochs=2,
            channels={"h": 0.7, "E": 0.3})


def _state(model) -> dict[str, np.ndarray]:
    return {k: v.detach().clone().numpy() for k, v in model.net.state_dict().items()}


def _same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def base(tiny_tickets):
    """(model, train pairs, dev pairs): a one-epoch model of the tiny topics and more labelled pairs of them."""
    model = train_model(tiny_tickets(0), tiny_tickets(1), SiameseConfig(**TINY), None, seed=0, progress=False)
    more = tiny_tickets(2, n_queries=8)
    return model, PairSet.from_dataset(more, "training"), PairSet.from_dataset(tiny_tickets(3), "dev")


def test_fit_returns_a_trained_copy_and_leaves_its_input_untouched(base):
    model, train, dev = base
    weights, version, calibrator = _state(model), model.version, model.calibrator.to_dict()
    history: list[dict] = []
    tuned = fit(model, train, dev, epochs=2, seed=0, history=history)
    assert tuned is not model and tuned.net is not model.net
    assert _same_state(_state(model), weights) and model.calibrator.to_dict() == calibrator
    model.invalidate()  # recomputed from the weights, not the cached value
    assert model.version == version != tuned.version
    assert not _same_state(_state(tuned), weights)
    assert [row["epoch"] for row in history] == list(range(1, len(history) + 1)) and 1 <= len(history) <= 2
    assert {"train_mse", "dev_pearson", "dev_spearman", "dev_map"} <= set(history[0])


def test_fit_is_seeded_and_honours_lr_and_epochs(base):
    model, train, dev = base
    prepared = PreparedPairs.of(model, train)
    a, b = fit(model, prepared, seed=3), fit(model, prepared, seed=3)
    assert _same_state(_state(a), _state(b)) and a.version == b.version
    frozen = fit(model, prepared, lr=0.0, calibrate=False)  # Adadelta with a zero step moves nothing
    assert _same_state(_state(frozen), _state(model))
    none: list[dict] = []
    assert _same_state(_state(fit(model, prepared, epochs=0, history=none)), _state(model)) and none == []


def test_fit_recalibrates_on_its_training_pairs_unless_told_not_to(base):
    model, train, _ = base
    prepared = PreparedPairs.of(model, train)
    tuned = fit(model, prepared, epochs=1, seed=0)
    kept = fit(model, prepared, epochs=1, seed=0, calibrate=False)
    assert kept.calibrator.to_dict() == model.calibrator.to_dict() != tuned.calibrator.to_dict()
    g = pair_scores(tuned, prepared)
    report = evaluate(tuned, prepared)
    assert report["pairs"] == len(train) and np.isfinite(report["mse"])
    assert report["mse"] == pytest.approx(float(np.mean((tuned.calibrate(g) - train.y) ** 2)))


def test_fit_copies_the_frozen_parts(base):
    """The vocabulary, Punkt, DocNADE and word vectors of the copy are the input's (equal, not shared)."""
    model, train, _ = base
    tuned = fit(model, train, epochs=1)
    assert tuned.vocab.tokens == model.vocab.tokens and tuned.vocab is not model.vocab
    assert torch.equal(tuned.net.embedder.words.weight, model.net.embedder.words.weight)


def test_feedback_uses_only_public_names_of_training():
    import recommender.model.feedback as feedback

    tree = ast.parse(Path(feedback.__file__).read_text(encoding="utf-8"))
    imported = [a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
                and node.module.endswith("training") for a in node.names]
    assert imported and not [name for name in imported if name.startswith("_")]


def test_the_in_batch_ranking_loss_is_the_cross_entropy_of_the_own_ticket_among_the_batch(base):
    """Hand-computed on three pairs: rows 0 and 2 are relevant; row 1 holds row 0's ticket, so it is no negative
    of query 0; with no relevant pair the loss is 0."""
    from recommender.model.siamese import metric_distance
    from recommender.model.training import in_batch_ranking_loss

    model, train, _ = base
    net = model.net
    prepared = PreparedPairs.of(model, train)
    qb = model.featurizer.batch(*prepared.queries.rows(train.q[:3]))
    tb = model.featurizer.batch(*prepared.tickets.rows(train.t[:3]))
    with torch.no_grad():
        qv, tv = net.encode(qb), net.encode(tb)
        ids, relevant = np.array([7, 7, 9]), np.array([True, False, True])
        got = float(in_batch_ranking_loss(net, qv, tv, ids, relevant, scale=10.0))

        def d(i, j):
            one = lambda v, r: {k: x[r:r + 1] for k, x in v.items()}  # noqa: E731
            return float(metric_distance(net.distances(one(qv, i), one(tv, j)), net.pair_weights(),
                                         net.channel_weights())[0])

        ce0 = -(-10 * d(0, 0)) + np.log(np.exp(-10 * d(0, 0)) + np.exp(-10 * d(0, 2)))
        ce2 = -(-10 * d(2, 2)) + np.log(sum(np.exp(-10 * d(2, j)) for j in range(3)))
        assert got == pytest.approx((ce0 + ce2) / 2, rel=1e-5)
        assert float(in_batch_ranking_loss(net, qv, tv, ids, np.zeros(3, bool), scale=10.0)) == 0.0


def test_fit_with_the_ranking_loss_trains_and_stays_seeded(base):
    model, train, _ = base
    ranking = model.siamese_config.replace(rank_loss=1.0)
    model.siamese_config = ranking
    try:
        prepared = PreparedPairs.of(model, train)
        a, b = fit(model, prepared, epochs=1, seed=2), fit(model, prepared, epochs=1, seed=2)
        assert _same_state(_state(a), _state(b))
        plain = model.siamese_config.replace(rank_loss=0.0)
        model.siamese_config = plain
        assert not _same_state(_state(fit(model, prepared, epochs=1, seed=2)), _state(a))
    finally:
        model.siamese_config = model.net.config
