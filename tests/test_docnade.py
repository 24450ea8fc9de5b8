"""DocNADE: a proper distribution at every position, exact NLL, training, determinism, persistence."""
import math

import numpy as np
import pytest
import torch

from topic_models.docnade import DocNADE, DocNADEConfig, TopicModelError, fit


def _toy_corpus(n_docs: int = 40, seed: int = 0) -> list[list[int]]:
    """Two clear topics over 12 words: documents draw from words 0-5 or from words 6-11."""
    rng = np.random.default_rng(seed)
    docs = []
    for n in range(n_docs):
        base = 0 if n % 2 == 0 else 6
        docs.append((base + rng.integers(0, 6, size=rng.integers(5, 15))).tolist())
    return docs


@pytest.mark.parametrize("softmax,vocab", [("full", 7), ("tree", 7), ("tree", 8), ("tree", 2), ("full", 2)])
def test_probabilities_sum_to_one_at_every_position(softmax, vocab):
    torch.manual_seed(1)
    model = DocNADE(DocNADEConfig(vocab_size=vocab, n_topics=5, softmax=softmax))
    with torch.no_grad():  # random, non-trivial weights so every tree decision matters
        for p in model.parameters():
            p.normal_(0, 1.0)
    doc = [0, vocab - 1, 1, 1, vocab - 1, 0]
    probs = np.exp(model.position_log_probs(doc))
    assert probs.shape == (len(doc), vocab)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-6)
    assert (probs > 0).all()


def test_perplexity_matches_hand_computation():
    W = np.array([[0.5, -1.0, 2.0], [1.5, 0.3, -0.7]])  # [H=2, V=3]: column w = word w's weights
    c = np.array([0.1, -0.2])
    U = np.array([[1.0, -0.5], [0.2, 0.8], [-1.2, 0.4]])  # [V, H]
    b = np.array([0.3, -0.1, 0.05])
    model = DocNADE(DocNADEConfig(vocab_size=3, n_topics=2, softmax="full"))
    with torch.no_grad():
        model.W.weight.copy_(torch.tensor(W.T, dtype=torch.float32))
        model.c.copy_(torch.tensor(c, dtype=torch.float32))
        model.U.copy_(torch.tensor(U, dtype=torch.float32))
        model.b.copy_(torch.tensor(b, dtype=torch.float32))
    docs = [[2, 0, 0, 1], [1], [0, 2]]
    nll, words = 0.0, 0
    for doc in docs:
        acc = c.copy()
        for v in doc:
            h = 1.0 / (1.0 + np.exp(-acc))
            logits = b + U @ h
            nll -= logits[v] - np.log(np.exp(logits).sum())
            acc = acc + W[:, v]
            words += 1
    total, counted = model.total_nll(docs)
    assert counted == words == 7
    assert total == pytest.approx(nll, rel=1e-5)
    assert model.perplexity(docs) == pytest.approx(math.exp(nll / words), rel=1e-5)
    # T = the hidden layer after the last word.
    expected_T = [1.0 / (1.0 + np.exp(-(c + W[:, d].sum(axis=1)))) for d in docs]
    np.testing.assert_allclose(model.transform(docs), np.array(expected_T), rtol=1e-5)


def test_tree_nll_is_the_sum_of_its_position_probabilities():
    torch.manual_seed(3)
    model = DocNADE(DocNADEConfig(vocab_size=11, n_topics=4, softmax="tree"))
    docs = [[3, 10, 0, 5, 5], [7, 2]]
    expected = -sum(model.position_log_probs(d)[np.arange(len(d)), d].sum() for d in docs)
    total, words = model.total_nll(docs)
    assert words == 7
    assert total == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("softmax", ["full", "tree"])
def test_gradients_reach_every_parameter(softmax):
    torch.manual_seed(0)
    model = DocNADE(DocNADEConfig(vocab_size=9, n_topics=4, softmax=softmax))
    from topic_models.docnade import _pad

    ids, mask = _pad([[1, 2, 3, 8], [4, 5]])
    model.nll(ids, mask).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    # Padding and words after the last one never receive input gradient.
    assert model.W.weight.grad[[0, 6, 7]].abs().sum() == 0


@pytest.mark.parametrize("softmax", ["full", "tree"])
def test_training_lowers_nll_and_learns_the_topics(softmax):
    docs = _toy_corpus()
    untrained = fit(docs, 12, n_topics=4, epochs=0, seed=0, progress=False, softmax=softmax)
    trained = fit(docs, 12, n_topics=4, epochs=40, lr=0.05, batch_size=8, seed=0, progress=False, softmax=softmax)
    before, after = untrained.perplexity(docs), trained.perplexity(docs)
    assert after < before * 0.8
    # After a few words of topic A, the model expects topic A's words far more than topic B's.
    probs = np.exp(trained.position_log_probs([0, 1, 2, 3, 4]))[-1]
    assert probs[:6].sum() > 0.8


def test_same_seed_same_model_and_other_seed_differs():
    docs = _toy_corpus(20)
    a = fit(docs, 12, n_topics=3, epochs=2, seed=7, progress=False)
    b = fit(docs, 12, n_topics=3, epochs=2, seed=7, progress=False)
    c = fit(docs, 12, n_topics=3, epochs=2, seed=8, progress=False)
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    assert not torch.equal(a.W.weight, c.W.weight)


def test_early_stopping_keeps_the_best_dev_epoch():
    docs = _toy_corpus(30)
    dev = _toy_corpus(10, seed=5)
    model = fit(docs, 12, n_topics=3, epochs=6, lr=0.05, seed=0, dev_docs=dev, progress=False, patience=2)
    assert model.perplexity(dev) < 12  # better than the uniform distribution over the vocabulary


@pytest.mark.parametrize("softmax", ["full", "tree"])
def test_save_load_round_trip(tmp_path, softmax):
    docs = _toy_corpus(10)
    model = fit(docs, 12, n_topics=3, epochs=1, seed=0, progress=False, softmax=softmax, max_doc_len=50)
    model.save(tmp_path / "docnade")
    again = DocNADE.load(tmp_path / "docnade")
    assert again.config == model.config
    np.testing.assert_array_equal(again.transform(docs), model.transform(docs))
    assert again.top_words(4) == model.top_words(4)
    assert again.perplexity(docs) == model.perplexity(docs)


def test_corrupt_or_missing_artifacts_give_a_clear_error(tmp_path):
    model = fit(_toy_corpus(6), 12, n_topics=2, epochs=1, seed=0, progress=False)
    model.save(tmp_path)
    (tmp_path / "weights.pt").write_bytes(b"not a torch file")
    with pytest.raises(TopicModelError, match="weights.pt.*corrupt"):
        DocNADE.load(tmp_path)
    (tmp_path / "weights.pt").unlink()
    with pytest.raises(TopicModelError, match="weights.pt.*missing"):
        DocNADE.load(tmp_path)
    (tmp_path / "config.json").write_text("{ not json")
    with pytest.raises(TopicModelError, match="config.json"):
        DocNADE.load(tmp_path)


def test_weights_of_another_shape_are_refused(tmp_path):
    fit(_toy_corpus(6), 12, n_topics=2, epochs=1, seed=0, progress=False).save(tmp_path / "a")
    fit(_toy_corpus(6), 12, n_topics=3, epochs=1, seed=0, progress=False).save(tmp_path / "b")
    (tmp_path / "b" / "weights.pt").replace(tmp_path / "a" / "weights.pt")
    with pytest.raises(TopicModelError, match="weights.pt"):
        DocNADE.load(tmp_path / "a")


def test_top_words_are_the_largest_input_weights():
    model = DocNADE(DocNADEConfig(vocab_size=5, n_topics=2))
    with torch.no_grad():
        model.W.weight.copy_(torch.tensor([[0.0, 1.0], [3.0, -1.0], [1.0, 2.0], [2.0, 0.5], [-1.0, 3.0]]))
    assert model.top_words(2) == [[1, 3], [4, 2]]


def test_bad_ids_and_empty_input_are_refused():
    model = DocNADE(DocNADEConfig(vocab_size=5, n_topics=2))
    with pytest.raises(TopicModelError, match="outside 0..4"):
        model.perplexity([[1, 5]])
    with pytest.raises(TopicModelError, match="without any word"):
        model.perplexity([[]])
    with pytest.raises(TopicModelError, match="no training document"):
        fit([[], []], 5, n_topics=2, epochs=1, progress=False)
    with pytest.raises(TopicModelError, match="softmax"):
        DocNADEConfig(vocab_size=5, softmax="hierarchical")
    assert model.transform([[]]).shape == (1, 2)  # an empty text gets the bias-only vector
