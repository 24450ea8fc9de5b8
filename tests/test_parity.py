"""Issue 11's acceptance test: the model that is trained is the model that is evaluated and the model that serves.

One small synthetic knowledge base, one tiny model with the BM25 channel on (fixed weights, so W_bm25 stays > 0),
trained by `ticketrec evaluate`'s own runner, then indexed and served. For the same (query, ticket) the lexical
feature lexical = bm25 / max over the knowledge base of bm25 and the raw score g must agree within 1e-6 between
(a) training (the features `train_model` fits and calibrates on), (b) `ticketrec evaluate` (its predictions files
and its `ModelSystem`) and (c) the served engine (`Recommendation.raw_score`), with K candidates and exhaustively.
"""
import json

import numpy as np
import pytest

TOL = 1e-6
#: The tiny model of tests/conftest.py (`tiny_model`), with fixed weights so the BM25 weight cannot be selected away.
TINY = dict(hidden=8, word_dim=16, char_dim=4, char_hidden=4, topics=6, topic_vocab=80, topic_epochs=2, epochs=1,
            w2v_epochs=1, min_count=1, channels={"h": 0.7, "E": 0.1, "T": 0.2}, bm25=0.3, weights="fixed")


def _jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(data file, loaded dataset, evaluate's output directory, the model it trained, candidates K)."""
    import torch

    from recommender.data.importers import load
    from recommender.data.synthetic import generate, write_jsonl
    from recommender.evaluation.experiments import Row, run_experiment
    from recommender.model.bundle import TicketModel

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("parity")
    path = write_jsonl(generate(n_tickets=240, n_queries=16, seed=3), tmp / "kb.jsonl")
    k = 1000  # more than the tickets: every ticket sharing a word is a candidate
    out = tmp / "report"
    run_experiment(path, path, out, rows=[Row("parity", "", "tiny model, BM25 channel on", preset="default",
                                              overrides=TINY)], seeds=1, candidates=k, progress=False)
    model = TicketModel.load(out / "models" / "parity-seed0")
    return path, load(path), out, model, k


def test_lexical_feature_and_g_agree_in_training_evaluation_and_serving(trained, tmp_path):
    from recommender.config import Settings
    from recommender.data.records import Query
    from recommender.data.store import Dataset, Store
    from recommender.evaluation.experiments import ModelSystem, _open_split
    from recommender.model.training import PairSet, PreparedPairs, lexical_features, pair_scores
    from recommender.serving.engine import Recommender
    from recommender.serving.index_build import build_index

    path, data, out, model, k = trained
    assert model.metric_spec()["bm25"] > 0.05  # the lexical channel is on and weighs in

    # (a) training: the labelled pairs' features and g exactly as train_model computes them (knowledge base =
    # the training and dev tickets, here one file's)
    pairs = PairSet.from_dataset(data, "training")
    lex_a = lexical_features(pairs, data.tickets)
    g_a = pair_scores(model, PreparedPairs.of(model, pairs, lex_a))
    key = [(pairs.queries[q].id, pairs.tickets[t].id) for q, t in zip(pairs.q, pairs.t)]
    lexical = dict(zip(key, lex_a))
    g_train = dict(zip(key, g_a))
    partial = [x for x in lex_a if 0.05 < x < 0.95]
    assert len(partial) >= 10 and (lex_a == 1.0).sum() >= 3  # a non-trivial feature on many pairs

    # (b) ticketrec evaluate: the rerank predictions it wrote, and its lexical feature
    written = {(p["query_id"], p["ticket_id"]): p["raw_score"] for p in _jsonl(out / "predictions" / "dev" / "parity-seed0.rerank.jsonl")}
    assert written.keys() == g_train.keys()
    for pair, g in g_train.items():
        assert written[pair] == pytest.approx(g, abs=TOL), pair
    split = _open_split("dev", path, tmp_path / "evaluate")
    system = ModelSystem(model, split, k)
    queries = data.query_map()
    for qid in {q for q, _ in key}:
        ids = [t for q, t in key if q == qid]
        np.testing.assert_allclose(system.lexical(queries[qid], ids), [lexical[(qid, t)] for t in ids], atol=TOL, rtol=0)
    split.store.close()

    # (c) the served engine over an index of the same knowledge base, with K candidates and exhaustively (K = 0)
    settings = Settings.from_env({"TICKETREC_HOME": str(tmp_path / "home"), "TICKETREC_MODEL": str(out / "models" / "parity-seed0"),
                                  "TICKETREC_MAX_DESCRIPTION": "100000", "TICKETREC_CANDIDATES": str(k)})
    store = Store(settings.db)
    store.import_dataset(Dataset(data.tickets, source="kb"))
    build_index(store, model, settings, progress=False)
    served_pairs = 0
    kb_written = _jsonl(out / "predictions" / "dev" / "parity-seed0.kb.jsonl")
    for candidates in (k, 0):
        engine = Recommender(settings.replace(candidates=candidates), store=store, model=model)
        for qid in {q for q, _ in key}:
            query = queries[qid]
            results = engine.recommend(Query(query.subject, query.description), k=len(data.tickets))
            top = max(r.bm25 for r in results)
            for r in results:
                if (qid, r.ticket.id) in g_train:
                    served_pairs += 1
                    assert r.raw_score == pytest.approx(g_train[(qid, r.ticket.id)], abs=TOL), (candidates, qid, r.ticket.id)
                    assert r.bm25 / top == pytest.approx(lexical[(qid, r.ticket.id)], abs=TOL)
            if candidates == k:  # evaluate's knowledge-base protocol retrieved the engine's top 10
                retrieved = [(p["ticket_id"], p["raw_score"]) for p in kb_written if p["query_id"] == qid]
                assert [t for t, _ in retrieved] == [r.ticket.id for r in results[: len(retrieved)]]
                np.testing.assert_allclose([g for _, g in retrieved], [r.raw_score for r in results[: len(retrieved)]],
                                           atol=TOL, rtol=0)
    assert served_pairs >= len(g_train)  # K = 0 serves every labelled pair (K candidates, those sharing a word)
    store.close()
