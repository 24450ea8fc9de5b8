"""Metrics: hand-computed cases, the SemEval IR-baseline reproduction, and a cross-check against ranx."""
import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import ranx

from recommender.errors import InputError
from recommender.evaluation import metrics as M


# -- hand-computed -------------------------------------------------------------------------------------------------
def test_hand_computed_ranking_metrics():
    # q1: relevant at ranks 1 and 3 of 4, a third relevant (c) never retrieved → R = 3
    # q2: nothing relevant retrieved, one relevant exists → all 0
    run = {"q1": ["a", "x", "b", "y"], "q2": ["x", "y"]}
    qrels = {"q1": {"a": 5, "b": 3, "c": 3, "x": 1}, "q2": {"z": 5, "x": 1}}
    m = M.ranking_metrics(run, qrels, ks=(1, 2, 3))
    assert m["acc@1"] == 0.5 and m["acc@3"] == 0.5
    assert m["p@1"] == 0.5 and m["p@3"] == pytest.approx((2 / 3) / 2)
    # AP@3(q1) = (1/1 + 2/3) / R=3
    assert m["map@3"] == pytest.approx(((1 + 2 / 3) / 3) / 2)
    assert m["map@2"] == pytest.approx((1 / 3) / 2)
    assert m["mrr@3"] == 0.5
    # YES only: only a is relevant
    yes = M.ranking_metrics(run, qrels, ks=(3,), threshold=M.YES_ONLY)
    assert yes["map@3"] == pytest.approx(0.5) and yes["p@3"] == pytest.approx(1 / 6)


def test_mrr_finds_first_relevant_only_within_k():
    flags = [0, 0, 1, 1]
    assert M.reciprocal_rank_at_k(flags, 2) == 0.0
    assert M.reciprocal_rank_at_k(flags, 3) == pytest.approx(1 / 3)


def test_official_ap_divides_by_relevant_retrieved_in_top_cutoff():
    # relevant at ranks 2 and 4 within the top 10, a third relevant at rank 11 is cut off
    flags = [0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1]
    assert M.official_average_precision(flags) == pytest.approx((1 / 2 + 2 / 4) / 2)
    assert M.average_precision_at_k(flags, 10, total_relevant=3) == pytest.approx((1 / 2 + 2 / 4) / 3)


def test_official_mode_counts_queries_without_relevant_as_zero():
    run = {"q1": ["a", "b"], "q2": ["c", "d"]}
    qrels = {"q1": {"a": 5, "b": 1}, "q2": {"c": 1, "d": 1}}
    o = M.official_semeval(run, qrels)
    assert o == {"official_map": 50.0, "official_mrr": 50.0, "official_p@1": 50.0}


def test_perfect_ranking_scores_one():
    # 3 YES + 1 REL + 8 NO per query: R = 4, so AP@1 = 1/4 by definition, AP@5 = AP@10 = 1
    qrels = {f"q{i}": {f"t{i}{j}": (5.0 if j < 3 else 3.0 if j < 4 else 1.0) for j in range(12)} for i in range(5)}
    run = {q: sorted(labels, key=lambda t: -labels[t]) for q, labels in qrels.items()}
    m = M.ranking_metrics(run, qrels)
    for k in (1, 5, 10):
        assert m[f"mrr@{k}"] == 1.0 and m[f"acc@{k}"] == 1.0
    assert m["map@5"] == 1.0 and m["map@10"] == 1.0 and m["map@1"] == 0.25 and m["p@1"] == 1.0
    assert M.official_semeval(run, qrels) == {"official_map": 100.0, "official_mrr": 100.0, "official_p@1": 100.0}
    s = M.success_rate(run, qrels)
    assert all(v == 1.0 for v in s.values())


def test_success_rate_counts_yes_and_rel_separately():
    run = {"q1": ["a", "b", "c"], "q2": ["d", "e", "f"]}
    qrels = {"q1": {"a": 5, "b": 3, "c": 3}, "q2": {"d": 1, "e": 5}}
    s = M.success_rate(run, qrels, k=10)
    assert s["yes>=1"] == 1.0 and s["yes>=2"] == 0.0
    assert s["yes+rel>=1"] == 1.0 and s["yes+rel>=2"] == 0.5 and s["yes+rel>=3"] == 0.5


def test_similarity_metrics_definitions():
    p, g = [1.0, 2.0, 3.0, 5.0], [1.0, 3.0, 2.0, 5.0]
    m = M.similarity_metrics(p, g)
    assert m["mse"] == pytest.approx(0.5)
    assert m["pearson"] == pytest.approx(np.corrcoef(p, g)[0, 1])
    assert m["spearman"] == pytest.approx(0.8)
    assert math.isnan(M.similarity_metrics([2.0, 2.0], [1.0, 5.0])["pearson"])
    with pytest.raises(InputError):
        M.similarity_metrics([1.0], [1.0, 2.0])


def test_ties_keep_given_order_and_bad_runs_are_rejected():
    assert M.rank_by_score([("a", 1.0), ("b", 2.0), ("c", 1.0)]) == ["b", "a", "c"]
    with pytest.raises(InputError, match="twice"):
        M.ranking_metrics({"q": ["a", "a"]}, {"q": {"a": 5}})
    with pytest.raises(InputError, match="empty"):
        M.ranking_metrics({}, {})


def test_read_semeval_file_rejects_malformed_lines(tmp_path):
    bad = tmp_path / "bad.pred"
    bad.write_text("Q1 Q1_R1 0 0.5 maybe\n")
    with pytest.raises(InputError, match="bad.pred:1"):
        M.read_semeval_file(bad)


# -- the SemEval-2016 dev IR baseline ------------------------------------------------------------------------------
def test_ir_baseline_reproduces_official_dev_scores_from_relevancy_file(semeval_dir):
    run, qrels = M.read_semeval_file(semeval_dir / "dev.subtaskB.relevancy")
    scores = {k: round(v, 2) for k, v in M.official_semeval(run, qrels).items()}
    assert scores == {"official_map": 71.35, "official_mrr": 76.67, "official_p@1": 70.00}


def test_ir_baseline_reproduces_official_dev_scores_from_xml(semeval_dir):
    """The IR order (RELQ_RANKING_ORDER) and graded labels read from dev.xml give the same official scores."""
    grade = {"PerfectMatch": 5.0, "Relevant": 3.0, "Irrelevant": 1.0}
    run: dict[str, list[str]] = {}
    qrels: dict[str, dict[str, float]] = {}
    for org in ET.parse(semeval_dir / "dev.xml").getroot().iter("OrgQuestion"):
        rel = org.find("Thread/RelQuestion")
        qid, tid = org.get("ORGQ_ID"), rel.get("RELQ_ID")
        qrels.setdefault(qid, {})[tid] = grade[rel.get("RELQ_RELEVANCE2ORGQ")]
        run.setdefault(qid, []).append((tid, -int(rel.get("RELQ_RANKING_ORDER"))))
    run = {q: M.rank_by_score(pairs) for q, pairs in run.items()}
    scores = {k: round(v, 2) for k, v in M.official_semeval(run, qrels).items()}
    assert scores == {"official_map": 71.35, "official_mrr": 76.67, "official_p@1": 70.00}


# -- cross-check against ranx ----------------------------------------------------------------------------------------
# ranx's own numba kernel warns about a cast inside it (NumbaTypeSafetyWarning); nothing of ours, and it was the one
# warning of the whole suite
@pytest.mark.filterwarnings("ignore:unsafe cast from uint64 to int64")
def test_ranking_metrics_agree_with_ranx_on_random_rankings():
    """Our map@k ↔ ranx `map@k` (AP divides by all relevant R), mrr@k ↔ `mrr@k`, p@k ↔ `precision@k`,
    acc@k ↔ `hit_rate@k`. Random graded labels, relevance = label ≥ 3; every query has ≥ 1 relevant ticket
    (ranx needs one), distinct scores (no tie-order ambiguity), 15 retrieved of 20 labelled (some relevant unretrieved)."""
    rng = np.random.default_rng(7)
    run, qrels, ranx_run, ranx_qrels = {}, {}, {}, {}
    for q in range(40):
        qid = f"q{q}"
        labels = {f"d{j}": float(rng.choice([1.0, 3.0, 5.0], p=[0.6, 0.25, 0.15])) for j in range(20)}
        labels["d0"] = 5.0
        scores = rng.permutation(20)[:15].astype(float) + rng.random(15) * 0.1
        ids = [f"d{j}" for j in rng.permutation(20)[:15]]
        qrels[qid] = labels
        ranx_qrels[qid] = {d: 1 for d, v in labels.items() if v >= 3}
        ranx_run[qid] = {d: float(s) for d, s in zip(ids, scores)}
        run[qid] = M.rank_by_score(list(zip(ids, scores)))
    names = {f"{ours}@{k}": f"{theirs}@{k}" for k in (1, 5, 10)
             for ours, theirs in (("map", "map"), ("mrr", "mrr"), ("p", "precision"), ("acc", "hit_rate"))}
    theirs = ranx.evaluate(ranx.Qrels(ranx_qrels), ranx.Run(ranx_run), list(names.values()))
    ours = M.ranking_metrics(run, qrels)
    for our_name, their_name in names.items():
        assert ours[our_name] == pytest.approx(theirs[their_name], abs=1e-9), our_name
    # and the metrics are not trivially equal to each other on this data
    assert len({round(v, 6) for v in ours.values()}) > 6
