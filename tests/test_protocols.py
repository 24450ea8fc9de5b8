"""The rerank and knowledge-base protocols on a tiny hand-made data set, and their prediction files."""
import json

import numpy as np
import pytest

from recommender.errors import InputError
from recommender.evaluation import metrics as M
from recommender.evaluation import protocols as P
from recommender.data.records import LabeledPair, Query, Recommendation, Ticket
from recommender.data.store import Dataset


def _dataset() -> Dataset:
    tickets = [
        Ticket("t1", "pump leak", "the pump leaks oil", "replace seal"),
        Ticket("t2", "valve stuck", "valve does not open", "clean valve"),
        Ticket("t3", "pump noise", "pump makes noise", "check bearing"),
        Ticket("t4", "login", "cannot log in", "reset password"),
    ]
    queries = [Query("pump", "oil leak at pump", "q1"), Query("valve", "valve blocked", "q2"), Query("x", "nothing", "q3")]
    pairs = [
        LabeledPair("q1", "t4", 1.0), LabeledPair("q1", "t1", 5.0), LabeledPair("q1", "t3", 3.0),
        LabeledPair("q2", "t2", 5.0), LabeledPair("q2", "t1", 1.0),
    ]
    return Dataset(tickets, queries, pairs, source="tiny")


def _overlap(ds: Dataset):
    """A real (if simple) scorer: shared words between the query and the ticket's subject + description."""
    tickets = ds.ticket_map()

    def score(query, ids):
        q = set((query.subject + " " + query.description).split())
        return np.array([len(q & set((tickets[t].subject + " " + tickets[t].description).split())) for t in ids], float)

    return score


def test_rerank_ranks_each_query_own_candidates_and_scores_them():
    ds = _dataset()
    res = P.rerank(ds, _overlap(ds), calibrate=lambda g: 1 + np.minimum(g, 4), progress=False)
    assert res.run() == {"q1": ["t1", "t3", "t4"], "q2": ["t2", "t1"]}
    assert [(p.query_id, p.ticket_id) for p in res.predictions] == [(p.query_id, p.ticket_id) for p in ds.pairs]
    m = res.metrics()
    assert m["official_map"] == 100.0 and m["acc@1"] == 1.0 and m["map@10"] == 1.0
    assert {"pearson", "spearman", "mse"} <= set(m)
    assert res.predictions[1].score == 1 + min(res.predictions[1].raw_score, 4)


def test_rerank_worst_order_scores_lower():
    ds = _dataset()
    inverse = _overlap(ds)
    res = P.rerank(ds, lambda q, ids: -inverse(q, ids), progress=False)
    assert res.run()["q1"] == ["t4", "t3", "t1"]
    assert res.metrics()["official_map"] < 100.0


def test_knowledge_base_counts_unlabelled_as_not_relevant_and_keeps_silent_queries():
    ds = _dataset()
    score = _overlap(ds)
    ids = [t.id for t in ds.tickets]

    def retrieve(query, k):
        s = score(query, ids)
        return [(ids[i], float(s[i]), float(s[i])) for i in np.argsort(-s, kind="stable")[:k] if s[i] > 0]

    res = P.knowledge_base(ds, retrieve, k=2, progress=False)
    run = res.run()
    assert set(run) == {"q1", "q2"}  # q3 has no labels: not a query of the protocol
    assert run["q1"] == ["t1", "t3"]
    assert all(p.label is None for p in res.predictions if (p.query_id, p.ticket_id) not in
               {(x.query_id, x.ticket_id) for x in ds.pairs})
    m = res.metrics(ks=(1, 2))
    assert m["acc@1"] == 1.0 and m["map@2"] == pytest.approx(1.0)


def test_from_engine_adapts_recommendations():
    ds = _dataset()

    class Engine:
        def recommend(self, query, k=10):
            return [Recommendation(ds.tickets[1], 1, 0.9, 4.5), Recommendation(ds.tickets[0], 2, 0.5, 2.0)][:k]

    res = P.knowledge_base(ds, P.from_engine(Engine()), k=10, progress=False)
    assert res.run() == {"q1": ["t2", "t1"], "q2": ["t2", "t1"]}
    assert res.predictions[0].score == 4.5 and res.predictions[0].raw_score == 0.9
    # q1: relevant t1 at rank 2, t3 never retrieved → AP@10 = (1/2) / R=2; q2: t2 at rank 1 → 1
    assert res.metrics()["map@10"] == pytest.approx((0.25 + 1.0) / 2)


def test_prediction_files_follow_semeval_format_and_score_like_in_memory(tmp_path):
    ds = _dataset()
    res = P.rerank(ds, _overlap(ds), calibrate=lambda g: 1 + np.minimum(g, 4), progress=False)
    paths = res.write(tmp_path, "overlap")
    lines = paths["pred"].read_text().splitlines()
    assert len(lines) == len(ds.pairs)
    for line, pair, pred in zip(lines, ds.pairs, res.predictions):
        q, t, zero, score, label = line.split("\t")
        assert (q, t, zero) == (pair.query_id, pair.ticket_id, "0")
        assert float(score) == pytest.approx(pred.raw_score)
        assert label == ("true" if pred.score >= 3 else "false")
    gold = tmp_path / "gold.relevancy"
    gold.write_text("".join(f"{p.query_id} {p.ticket_id} {i} {1 / (i + 1)} {'true' if p.score >= 3 else 'false'}\n"
                            for i, p in enumerate(ds.pairs)))
    assert M.score_semeval_files(gold, paths["pred"]) == pytest.approx(
        {k: v for k, v in res.metrics().items() if k.startswith("official_")})
    rows = [json.loads(x) for x in paths["jsonl"].read_text().splitlines()]
    assert rows[0] == {"query_id": "q1", "ticket_id": "t4", "rank": 3, "raw_score": 0.0, "score": 1.0, "label": 1.0}


def test_bad_inputs_raise_clear_errors(tmp_path):
    ds = _dataset()
    with pytest.raises(InputError, match="no labelled pair"):
        P.rerank(Dataset(ds.tickets, ds.queries, []), _overlap(ds), progress=False)
    bad = P.ProtocolResult("rerank", [P.Prediction("q 1", "t1", 1, 0.5, 0.5, 5.0)], {"q 1": {"t1": 5.0}})
    with pytest.raises(InputError, match="white space"):
        bad.write(tmp_path, "bad")
    assert not list(tmp_path.glob("bad*.pred"))
