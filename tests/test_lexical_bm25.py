"""The one BM25 (`lexical/bm25.py`): the formula by hand, the lexical feature, the in-memory scorer and searcher,
and the whole-index lexical term of the scorer (K = 0)."""
import math

import numpy as np
import pytest

from recommender.data.records import Ticket
from recommender.lexical.bm25 import MIN_IDF, Bm25Scorer, idf, lexical_feature, select_terms
from recommender.lexical.analyzer import query_terms
from recommender.lexical.searchers import MemorySearcher

TICKETS = [
    Ticket("A", "Pump leak", "The pump leaks.", ""),            # 5 tokens: pump f = 2·1 + 1, leak f = 2·1 + 1
    Ticket("B", "Valve", "Valve stuck", "oil"),                 # 4 tokens
    Ticket("C", "Turbine", "Blade crack", "Replace the blade"),  # 6 tokens
]


def test_scores_are_the_formula_written_out():
    scorer = Bm25Scorer(TICKETS)
    avgdl = (5 + 4 + 6) / 3
    norm_a = 1.2 * (1 - 0.75 + 0.75 * 5 / avgdl)
    idf_pump = math.log((3 - 1 + 0.5) / (1 + 0.5))
    term = idf_pump * 3 * 2.2 / (3 + norm_a)
    expected_a = term + term  # "pump" and "leaking"→"leak"
    assert scorer.scores("pump leaking").tolist() == pytest.approx([expected_a, 0.0, 0.0], rel=2 ** -24)
    stored = float(np.float32(term))  # each term's share is used as its float32 impact (`bm25.impacts`)
    assert scorer.scores("pump leaking").tolist() == [stored + stored, 0.0, 0.0]
    assert scorer.scores("the of")[0] == 0.0  # stop words only
    assert idf(3, 4) == MIN_IDF and idf(0, 10) == pytest.approx(math.log(10.5 / 0.5))


def test_lexical_feature_divides_by_the_knowledge_base_maximum():
    scorer = Bm25Scorer(TICKETS)
    every = scorer.scores("valve blade crack")
    assert every.argmax() == 2 and every[1] > 0
    assert scorer.lexical("valve blade crack", [1, 0]).tolist() == [every[1] / every[2], 0.0]
    assert scorer.lexical("valve blade crack").max() == 1.0
    assert scorer.lexical("zzz unknown", [0, 1]).tolist() == [0.0, 0.0]  # no shared word: 0, not NaN
    assert lexical_feature([1.0, 2.0], 0.0).tolist() == [0.0, 0.0]
    assert lexical_feature(np.array([1.0, 2.0], np.float32), 4.0, np.float32).dtype == np.float32
    pairs = scorer.lexical_pairs(["valve blade crack", "pump"], np.array([0, 0, 1]), ["B", "C", "A"])
    assert pairs.tolist() == [every[1] / every[2], 1.0, 1.0]
    with pytest.raises(KeyError, match="nope"):
        scorer.lexical_pairs(["pump"], np.array([0]), ["nope"])


def test_top_k_is_best_first_ties_by_row_and_skips_non_matches():
    twins = [Ticket(f"t{i}", "pump seal", "pump seal leak", "") for i in range(4)] + [Ticket("x", "valve", "oil", "")]
    scorer = Bm25Scorer(twins)
    rows, scores = scorer.top_k("pump", 10)
    assert rows.tolist() == [0, 1, 2, 3] and len(set(scores.tolist())) == 1
    assert scorer.top_k("pump", 2)[0].tolist() == [0, 1] and scorer.top_k("pump", 0)[0].size == 0
    with pytest.raises(ValueError, match="distinct"):
        Bm25Scorer([twins[0], twins[0]])


def test_memory_searcher_is_the_face_over_the_scorer():
    searcher = MemorySearcher(TICKETS)
    hits = searcher.search("blade crack valve", 10)
    assert [t for t, _ in hits] == ["C", "B"] and hits[0][1] > hits[1][1] > 0
    assert searcher.score_tickets("blade crack valve", ["B", "A", "nope"]) == {"B": hits[1][1], "A": 0.0, "nope": 0.0}
    assert searcher.batch_search(["pump", "", "oil"], 2) == [searcher.search(t, 2) for t in ["pump", "", "oil"]]
    assert searcher.index([Ticket("D", "Blade crack", "blade crack", "")]) == 1 and searcher.count() == 4
    assert searcher.search("blade crack", 1)[0][0] == "D"  # statistics recomputed over all four
    assert searcher.rebuild(TICKETS[:1]) == 1 and searcher.search("blade", 5) == []
    assert searcher.params()["backend"] == "memory" and searcher.params()["weights"]["subject"] == 2.0


def test_long_queries_keep_the_terms_with_the_highest_count_times_idf():
    counts = query_terms("valve " * 3 + "pump seal")
    assert select_terms(counts, {"valve": 9, "pump": 1, "seal": 5}, 10, limit=1) == ["pump"]
    assert select_terms(counts, {"valve": 1, "pump": 1, "seal": 5}, 10, limit=1) == ["valve"]  # counts weigh in
    assert select_terms(counts, {"valve": 0, "pump": 0, "seal": 2}, 10, limit=2) == ["seal"]  # unknown words last
    assert select_terms(counts, None, 0, limit=1) == ["valve"]


def test_the_whole_index_lexical_term_equals_scoring_every_row_as_candidates():
    from recommender.serving.scoring import rank

    rng = np.random.default_rng(0)
    spec = {"pairs": [["SUB", "SUB", 1.0]], "channels": {"h": 1.0}, "bm25": 0.4}
    tickets = {"SUB.h": rng.normal(size=(50, 8)).astype(np.float32)}
    query = {"SUB.h": rng.normal(size=(1, 8)).astype(np.float32)}
    bm25 = np.where(rng.random(50) < 0.3, rng.uniform(0.5, 9.0, 50), 0.0).astype(np.float32)
    rows, g, b = rank(spec, query, tickets, 50, None, bm25)
    rows_c, g_c, b_c = rank(spec, query, tickets, 50, np.arange(50), bm25)
    assert rows.tolist() == rows_c.tolist() and b.tolist() == b_c.tolist() == bm25[rows].tolist()
    np.testing.assert_allclose(g, g_c, rtol=0, atol=1e-7)
    # one shard of the index normalises by the maximum over all rows, as the workers are told
    shard_rows, shard_g, _ = rank(spec, query, tickets, 50, None, bm25, row_range=(20, 50))
    assert shard_rows.min() >= 20 and len(shard_rows) == 30
    np.testing.assert_allclose(shard_g, [g[rows.tolist().index(r)] for r in shard_rows], rtol=0, atol=1e-7)
