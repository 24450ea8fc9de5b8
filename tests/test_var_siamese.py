"""The variational Siamese network (issue 13 §3): formulas by hand, shapes, training, save/load integrity, the topic
pre-filter, the `siamese` grid and `ticketrec train --arch var-siamese` — on tiny data, one torch thread."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from recommender.data import synthetic
from recommender.data.records import Query
from recommender.errors import InputError, ModelError
from recommender.model.var_siamese import (VarSiamese, VarSiameseConfig, VarSiameseNet, gaussian_kl, kl_weight,
                                           ranker, wasserstein2)
from recommender.model.vocab import Vocabulary

#: Small enough to train in seconds, large enough to learn the tiny topics.
TINY = {"word_dim": 16, "hidden": 16, "latent": 8, "mlp_hidden": 16, "decoder_hidden": 16, "decoder_vocab": 50,
        "pretrain_epochs": 1, "epochs": 6, "lr": 0.01, "batch_size": 8, "w2v_epochs": 5, "min_count": 1}


@pytest.fixture(scope="module")
def tiny_data(tiny_tickets):
    """8 queries × 6 labelled tickets over 4 fault topics (label 5 for the query's topic, else 1)."""
    return tiny_tickets(0, n_tickets=24, n_queries=8, per_query=6)


@pytest.fixture(scope="module")
def trained(tiny_data):
    """A model trained on the tiny labelled pairs (the epoch picked on the same pairs)."""
    torch.set_num_threads(1)
    return VarSiamese(VarSiameseConfig(**TINY)).fit(tiny_data.tickets, tiny_data, dev=tiny_data, seed=0)


def _hand_model(latent: int = 2) -> VarSiamese:
    """An untrained network whose MLP is set by hand: hidden = relu(features), logit = −w2₁ − w2₂ + ½ had₁ + ½ had₂."""
    config = VarSiameseConfig(word_dim=4, hidden=3, latent=latent, mlp_hidden=2 * latent)
    vocab = Vocabulary.build([["pump", "valve"]])
    net = VarSiameseNet(config, np.ones((len(vocab), 4), np.float32))
    with torch.no_grad():
        net.mlp[0].weight.copy_(torch.eye(2 * latent))
        net.mlp[0].bias.zero_()
        net.mlp[2].weight.copy_(torch.tensor([[-1.0] * latent + [0.5] * latent]))
        net.mlp[2].bias.zero_()
    return VarSiamese(config, vocab=vocab, net=net)


def test_w2_features_and_the_mlp_score_on_hand_computed_gaussians():
    mu1, s1 = np.array([1.0, 2.0]), np.array([1.0, 2.0])
    mu2, s2 = np.array([0.0, 1.0]), np.array([1.0, 0.5])
    # (1 − 0)² + (1 − 1)² = 1 ; (2 − 1)² + (2 − 0.5)² = 1 + 2.25 = 3.25
    assert np.allclose(wasserstein2(mu1, s1, mu2, s2), [1.0, 3.25])
    assert np.allclose(wasserstein2(mu1, s1, mu1, s1), 0.0)
    model = _hand_model()
    q = np.concatenate([mu1, s1]).astype(np.float32)
    t = np.concatenate([mu2, s2]).astype(np.float32)
    # features [1, 3.25 ; 1·0, 2·1] → logit = −1 − 3.25 + 0.5·0 + 0.5·2 = −3.25
    expected = 1.0 / (1.0 + math.exp(3.25))
    assert model.similarity(q, t[None]) == pytest.approx([expected], rel=1e-6)
    assert model.similarity(t, q[None]) == pytest.approx([expected], rel=1e-6)  # symmetric
    # the numpy score is the torch network's (log σ² = 2 log σ)
    def row(x):
        return torch.tensor(np.asarray([x]), dtype=torch.float32)

    with torch.no_grad():
        logit = model.net.logits(row(mu1), row(2 * np.log(s1)), row(mu2), row(2 * np.log(s2)))
    assert float(torch.sigmoid(logit)) == pytest.approx(expected, rel=1e-5)
    w2_only = VarSiamese(model.config.replace(head="w2"), vocab=model.vocab, net=model.net)
    assert w2_only.similarity(q, t[None]) == pytest.approx([math.exp(-(1.0 + 3.25) / 2)], rel=1e-6)


def test_kl_term_and_its_annealing():
    mu = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    logvar = torch.tensor([[0.0, math.log(4.0)], [0.0, 0.0]])
    # ½[(1 + 1 − 1 − 0) + (4 + 0 − 1 − ln 4)] = ½(4 − ln 4); a standard normal costs 0
    assert gaussian_kl(mu, logvar).tolist() == pytest.approx([0.5 * (4 - math.log(4.0)), 0.0])
    assert [kl_weight(s, 100, 0.5) for s in (0, 25, 50, 99)] == [0.0, 0.5, 1.0, 1.0]
    assert kl_weight(0, 100, 0.0) == 1.0


def test_encode_shapes_and_similarity_faces(trained, tiny_data):
    tickets = tiny_data.tickets
    vecs = trained.encode_tickets(tickets)
    assert vecs.shape == (len(tickets), 2 * TINY["latent"]) and vecs.dtype == np.float32
    assert (vecs[:, TINY["latent"]:] > 0).all()  # σ
    assert np.array_equal(trained.encode([trained.text_of(t) for t in tickets]), vecs)
    alone = trained.channel_vectors([trained.text_of(tickets[0])])  # another batch: equal up to float rounding
    assert np.allclose(alone, vecs[:1], atol=1e-5)
    one = trained.similarity(vecs[0], vecs)
    assert one.shape == (len(tickets),) and ((one > 0) & (one < 1)).all()
    assert np.allclose(trained.similarity(vecs[:1], vecs), one)
    aligned = trained.similarity(vecs, vecs[::-1])
    assert aligned.shape == (len(tickets),) and np.allclose(aligned, trained.similarity(vecs[::-1], vecs))
    with pytest.raises(ValueError, match="width"):
        trained.similarity(vecs[:2], vecs[:3])
    empty = trained.encode_queries([Query("", "", id="e")])  # no word: still one row
    assert empty.shape == (1, 2 * TINY["latent"]) and np.isfinite(empty).all()


def test_a_tiny_training_run_scores_paired_tickets_above_the_others(trained, tiny_data):
    tickets = {t.id: t for t in tiny_data.tickets}
    wins = 0
    for query in tiny_data.queries:
        pairs = [p for p in tiny_data.pairs if p.query_id == query.id]
        scores = trained.score(query, [tickets[p.ticket_id] for p in pairs])
        labels = np.array([p.score for p in pairs])
        wins += bool(scores[labels == 5].mean() > scores[labels == 1].mean())
    assert wins >= 7, f"the paired tickets scored above the others for only {wins} of 8 queries"
    report = trained.meta["training"]
    assert report["pairs"]["source"] == "labelled" and report["best_epoch"] >= 1
    assert [r["epoch"] for r in report["pretraining"]] == [1] and report["pretraining"][0]["beta"] == 1.0


def test_training_is_deterministic_for_a_seed(tiny_data):
    config = VarSiameseConfig(**{**TINY, "head": "w2"})
    a = VarSiamese(config).fit(tiny_data.tickets, tiny_data, seed=3)
    b = VarSiamese(config).fit(tiny_data.tickets, tiny_data, seed=3)
    assert a.version == b.version
    with pytest.raises(InputError, match="unknown var-siamese option"):
        VarSiameseConfig.from_dict({"latnet": 3})
    with pytest.raises(InputError, match="labelled pairs"):
        VarSiamese(config.replace(pairs="labelled")).fit(tiny_data.tickets, None)


def test_a_ticket_models_vocabulary_and_word_vectors_are_reused(tiny_ticket_model, tiny_data):
    model = VarSiamese(VarSiameseConfig(**{**TINY, "head": "w2"})).fit(tiny_data.tickets, tiny_data,
                                                                        base=tiny_ticket_model)
    words = tiny_ticket_model.net.embedder.words.weight.detach().numpy()
    assert model.vocab is tiny_ticket_model.vocab and model.config.word_dim == words.shape[1]
    assert model.meta["training"]["word_vectors"] == "base model"
    row = next(i for i, n in enumerate(np.linalg.norm(words, axis=1)) if n > 0)
    scaled = model.net.words.weight[row].numpy()  # the same direction, at length √dim
    assert np.allclose(scaled, words[row] / np.linalg.norm(words[row]) * math.sqrt(words.shape[1]), atol=1e-5)


def test_save_load_round_trip_and_damaged_files_refused(trained, tiny_data, tmp_path):
    out = tmp_path / "model"
    trained.save(out)
    loaded = VarSiamese.load(out)
    assert loaded.version == trained.version and loaded.config == trained.config
    vecs = trained.encode_tickets(tiny_data.tickets)
    assert np.array_equal(loaded.encode_tickets(tiny_data.tickets), vecs)
    assert np.array_equal(loaded.similarity(vecs[0], vecs), trained.similarity(vecs[0], vecs))
    recorded = json.loads((out / "config.json").read_text())["files"]
    assert set(recorded) == {"weights.pt", "vocab.json", "word_vectors.npy"}

    weights = out / "weights.pt"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=r"weights\.pt does not match the SHA-256.*ticketrec train --arch var-siamese"):
        VarSiamese.load(out)
    trained.save(out)  # replaced atomically: whole again
    (out / "vocab.json").unlink()
    with pytest.raises(ModelError, match=r"vocab\.json is missing"):
        VarSiamese.load(out)
    with pytest.raises(ModelError, match="no var-siamese model"):
        VarSiamese.load(tmp_path / "nothing")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"format_version": 1, "hyperparameters": {}}))
    with pytest.raises(ModelError, match="not a var-siamese one"):
        VarSiamese.load(tmp_path / "other")
    with pytest.raises(ModelError, match="not trained"):
        VarSiamese().encode(["pump"])


def test_topic_prefilter_returns_k_rows_with_the_query_topic_first(tiny_data):
    from recommender.model.topic_prefilter import CLUSTER_BONUS, TopicPrefilter

    tickets = tiny_data.tickets
    for method, epochs in (("lda", 5), ("docnade", 3)):
        prefilter = TopicPrefilter.fit(tickets, method, n_topics=4, vocab_size=100, seed=0, epochs=epochs)
        for query in tiny_data.queries[:4]:
            text = f"{query.subject}\n{query.description}"
            rows, scores = prefilter.search(text, 10)
            assert len(rows) == 10 == len(set(rows.tolist())) and np.all(np.diff(scores) <= 0)
            topic = prefilter.dominant_topic(text)
            same = prefilter.dominant[rows] == topic
            cluster = int((prefilter.dominant == topic).sum())
            assert same[: min(10, cluster)].all() and not same[min(10, cluster):].any(), method
            assert np.all((scores >= CLUSTER_BONUS - 1) == same)
        rows, _ = prefilter.search("zzz unknown words only", 5)  # no shared word: still k rows (unlike BM25)
        assert len(rows) == 5
        assert prefilter.search_ids(text, 3)[0][0] == tickets[int(prefilter.search(text, 1)[0][0])].id
    with pytest.raises(InputError, match="unknown topic pre-filter"):
        TopicPrefilter.fit(tickets, "nmf")


def test_duplicates_ranker_over_every_ticket_bm25_or_topics(trained, tiny_data):
    from recommender.evaluation.duplicates import evaluate_duplicates
    from recommender.lexical.bm25 import Bm25Scorer
    from recommender.model.topic_prefilter import TopicPrefilter

    tickets = tiny_data.tickets
    scan = ranker(trained, tickets)
    first = scan(tickets[0], 5)
    assert len(first) == 5 and len(set(first)) == 5
    bm25 = ranker(trained, tickets, Bm25Scorer(tickets).top_k, candidates=3)
    assert 1 <= len(bm25(tickets[0], 10)) <= 4
    topics = TopicPrefilter.fit(tickets, "lda", n_topics=4, vocab_size=100, epochs=3)
    assert len(ranker(trained, tickets, topics.search, candidates=6)(tickets[0], 10)) == 7
    links = [(tickets[i].id, tickets[i + 4].id) for i in range(4)]  # same topic (i and i + 4)
    rows = evaluate_duplicates(tickets, links, {"var": scan}, n_boot=50)
    assert rows[0]["queries"] == 8 and 0.0 <= rows[0]["MRR@10"] <= 1.0


def test_siamese_grid_row_end_to_end(tmp_path):
    from recommender.evaluation import experiments as X

    rows = X.grid_rows("siamese")
    assert [r.kind for r in rows][0] == "bm25" and {r.preset for r in rows if r.kind == "encoder"} >= {"var-siamese"}
    train, dev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    synthetic.write_jsonl(synthetic.generate(n_tickets=40, n_queries=8, seed=1), train)
    synthetic.write_jsonl(synthetic.generate(n_tickets=30, n_queries=6, seed=2), dev)
    row = X.Row("VarSiamese tiny", "", "tiny", kind="encoder", preset="var-siamese",
                overrides={**TINY, "pairs": "labelled", "epochs": 2})
    out = tmp_path / "report"
    results = X.run_experiment(train, dev, out, rows=[rows[0], row], seeds=1, candidates=20, progress=False)
    assert not results["notes"], results["notes"]
    got = results["rows"][1]
    assert got["kind"] == "encoder" and len(got["model_versions"][0]) == 16
    assert 0.0 <= got["dev"]["official_map"] <= 100.0 and "kb_acc@10" in got["dev"]
    assert (out / "models" / "varsiamese-tiny-seed0" / "config.json").exists()
    again = X.run_experiment(train, dev, out, rows=[row], seeds=1, candidates=20, progress=False)  # reused
    assert again["rows"][0]["model_versions"] == got["model_versions"]


def test_cli_trains_a_var_siamese_model_from_the_store(tmp_path, monkeypatch):
    from recommender.cli import main

    monkeypatch.setenv("TICKETREC_HOME", str(tmp_path / "home"))
    kb = tmp_path / "kb.jsonl"
    synthetic.write_jsonl(synthetic.generate(n_tickets=40, n_queries=4, seed=3), kb)
    runner = CliRunner()
    assert runner.invoke(main, ["import", str(kb), "--quiet"]).exit_code == 0
    config = tmp_path / "vs.json"
    config.write_text(json.dumps({**TINY, "epochs": 1}))
    out = tmp_path / "model"
    result = runner.invoke(main, ["train", "--arch", "var-siamese", "--config", str(config), "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["arch"] == "var-siamese" and report["pairs"]["source"] == "mined"
    assert VarSiamese.load(out).version == report["version"]
    refused = runner.invoke(main, ["train", "--arch", "var-siamese", "--preset", "ml", "--out", str(out)])
    assert refused.exit_code != 0 and "replicated Siamese LSTM only" in refused.output
