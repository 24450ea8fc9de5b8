"""The BM25 postings of an index version: FTS5's scores, the in-memory scorer's scores, exact top K, incremental
reuse, clear errors."""

import numpy as np
import pytest

from recommender.lexical.postings import PostingsBuilder, ticket_terms
from recommender.serving.engine import Recommender
from recommender.errors import IndexStateError
from recommender.serving.index import TicketIndex, open_current
from recommender.serving.index_build import build_index
from recommender.lexical.bm25 import Bm25Scorer
from recommender.lexical.searchers import Fts5Searcher
from recommender.serving.searchers import IndexSearcher
from recommender.data.records import Query, Ticket
from recommender.data.store import Dataset

#: How close our scores are to FTS5's bm25() (the same formula in float64): each term's impact is stored as float32
#: (relative error ≤ 2⁻²⁴), and an impact below 2⁻¹⁸ (terms at the IDF floor) on a grid of 2⁻⁴¹ (`bm25.impacts`).
FTS5 = dict(rel=1e-7, abs=1e-11)
QUERIES = ["turbine vibration after restart", "Valve leaks at the seal; pressure drops", "oil filter pump hot",
           'NEAR("bearing" OR -temperature*) ^exhaust: spread', "the and of"]


def _fts5_scores(store, text):
    return dict(Fts5Searcher(store).search(text, 10_000))


def test_scores_are_fts5_bm25_scores(kb_home, tiny_ticket_model):
    (settings, store), model = kb_home, tiny_ticket_model
    build_index(store, model, settings, progress=False)
    idx = open_current(settings)
    for text in QUERIES:
        rows, scores = idx.bm25.scores(text)
        ours = {idx.ticket_ids[r]: s for r, s in zip(rows, scores)}
        theirs = _fts5_scores(store, text)
        assert ours.keys() == theirs.keys(), text  # the same tickets match
        for tid, s in theirs.items():
            assert ours[tid] == pytest.approx(s, **FTS5), (text, tid)
    assert idx.bm25.scores("the and of")[0].size == 0  # stop words only: nothing to search


def test_postings_and_the_in_memory_scorer_are_one_bm25(kb_home, tiny_ticket_model):
    (settings, store), model = kb_home, tiny_ticket_model
    build_index(store, model, settings, progress=False)
    idx = open_current(settings)
    scorer = Bm25Scorer(store.get_tickets(list(reversed(idx.ticket_ids))))  # another row order, same tickets
    long_query = " ".join(store.get_ticket(tid).description for tid in idx.ticket_ids[:12])  # > MAX_QUERY_TERMS words
    for text in QUERIES + [long_query]:
        rows, scores = idx.bm25.scores(text)
        ours = dict(zip((idx.ticket_ids[r] for r in rows), scores.tolist()))
        every = scorer.scores(text)
        theirs = {scorer.ids[r]: every[r] for r in np.flatnonzero(every)}
        assert ours.keys() == theirs.keys(), text
        assert ours == theirs, text  # bit for bit: the same float32 impacts, and their sums are exact
    top_rows, top_scores = scorer.top_k(QUERIES[0], 5)
    assert [scorer.ids[r] for r in top_rows] == [idx.ticket_ids[r] for r in idx.bm25.top_k(QUERIES[0], 5)[0]]


def test_top_k_is_exact_best_first_ties_by_row(kb_home, tiny_ticket_model):
    (settings, store), model = kb_home, tiny_ticket_model
    build_index(store, model, settings, progress=False)
    bm25 = open_current(settings).bm25
    rows, scores = bm25.scores(QUERIES[0])
    for k in (1, 5, len(rows), len(rows) + 10):
        top_rows, top_scores = bm25.top_k(QUERIES[0], k)
        expected = sorted(zip(rows.tolist(), scores.tolist()), key=lambda x: (-x[1], x[0]))[:k]
        assert list(zip(top_rows.tolist(), top_scores.tolist())) == expected
    assert bm25.top_k(QUERIES[0], 0)[0].size == 0
    assert bm25.top_k("zzzunknownword", 10)[0].size == 0


def test_incremental_postings_equal_a_full_build(kb_home, tiny_ticket_model):
    (settings, store), model = kb_home, tiny_ticket_model
    build_index(store, model, settings, progress=False)
    changed = store.get_ticket(store.ticket_ids()[5])
    changed.subject = "Turbine vibration after restart, seal replaced"
    store.clock = lambda: 4e9  # the update's timestamp differs from the first import's, without waiting
    store.import_dataset(Dataset([changed, Ticket("NEW-1", "Valve leaks", "Steam leaks at the valve stem.",
                                                  "Tighten the packing.")], source="update"))
    build_index(store, model, settings, progress=False)
    incremental = open_current(settings)
    assert incremental.manifest["reused"] > 0 and incremental.manifest["encoded"] == 2
    build_index(store, model, settings, incremental=False, progress=False)
    full = open_current(settings)
    assert full.manifest["reused"] == 0
    for text in QUERIES[:4]:
        a = dict(zip((incremental.ticket_ids[r] for r in incremental.bm25.scores(text)[0]), incremental.bm25.scores(text)[1]))
        b = dict(zip((full.ticket_ids[r] for r in full.bm25.scores(text)[0]), full.bm25.scores(text)[1]))
        assert a == b  # bit for bit
        assert a == pytest.approx(_fts5_scores(store, text), **FTS5)


def test_term_counts_weigh_the_subject_double_and_lengths_count_every_token():
    tickets = [Ticket("a", "pump", "pump leaks", ""), Ticket("b", "Valve", "valve stuck", "oil the valves")]
    chunk = ticket_terms(tickets)
    assert chunk.lengths.tolist() == [3.0, 6.0]  # stop words ("the") count in the length
    per_ticket = [{chunk.terms[t]: f for d, t, f in zip(chunk.docs, chunk.term_ids, chunk.tf.tolist()) if d == i}
                  for i in range(2)]
    assert per_ticket == [{"pump": 2 * 1 + 1, "leak": 1.0}, {"valv": 2 * 1 + 1 + 1, "stuck": 1.0, "oil": 1.0}]
    builder = PostingsBuilder(3)
    builder.add(np.array([2, 0]), chunk)  # chunk rows land on the index rows they are given
    assert builder.lengths.tolist() == [6.0, 0.0, 3.0]


def test_missing_or_corrupt_postings_say_to_rebuild(kb_home, tiny_ticket_model, unseal):
    (settings, store), model = kb_home, tiny_ticket_model
    version = build_index(store, model, settings, progress=False)
    path = settings.indexes_dir / version
    unseal(path)  # versions are sealed read-only; damage it as root could
    np.save(path / "bm25_length.npy", np.zeros(3, np.float32))
    with pytest.raises(IndexStateError, match="inconsistent.*ticketrec index --full"):
        TicketIndex.open(path).bm25
    (path / "bm25_tf.npy").unlink()
    with pytest.raises(IndexStateError, match="missing or corrupt.*ticketrec index --full"):
        TicketIndex.open(path).bm25


def test_engine_and_cli_search_use_the_index_postings_by_default(kb_home, tiny_ticket_model):
    (settings, store), model = kb_home, tiny_ticket_model
    assert settings.prefilter == "index"
    build_index(store, model, settings, progress=False)
    engine = Recommender(settings, store=store, model=model)
    results = engine.recommend(Query("turbine vibration", "high vibration on the turbine after restart"), k=5)
    assert len(results) == 5 and all(r.bm25 is not None and r.bm25 > 0 for r in results)
    fts5 = Recommender(settings.replace(prefilter="fts5"), store=store, model=model)
    same = fts5.recommend(Query("turbine vibration", "high vibration on the turbine after restart"), k=5)
    assert [r.ticket.id for r in same] == [r.ticket.id for r in results]  # same candidates, same answer
    assert [r.bm25 for r in same] == pytest.approx([r.bm25 for r in results], rel=1e-6)
    prefilter = IndexSearcher(open_current(settings))
    hits = prefilter.search(QUERIES[1], 3)
    assert [tid for tid, _ in hits] == [tid for tid, _ in Fts5Searcher(store).search(QUERIES[1], 3)]
    assert prefilter.score_tickets(QUERIES[1], [hits[0][0], "nope"]) == {hits[0][0]: pytest.approx(hits[0][1]), "nope": 0.0}
    assert prefilter.count() == len(store.ticket_ids()) and prefilter.params()["backend"] == "index"


def test_rows_and_whole_index_scores_through_the_face_agree_for_every_backend(kb_home, tiny_ticket_model):
    (settings, store), model = kb_home, tiny_ticket_model
    build_index(store, model, settings, progress=False)
    index, other = open_current(settings), open_current(settings)  # `other`: not the searcher's own object
    searcher, fts5 = IndexSearcher(index), Fts5Searcher(store)
    for text in QUERIES:
        direct = searcher.search_rows(text, 5, index)  # straight from the postings
        assert [index.ticket_ids[r] for r in direct[0]] == [tid for tid, _ in searcher.search(text, 5)]
        for rows, scores in (searcher.search_rows(text, 5, other), fts5.search_rows(text, 5, index)):
            assert rows.tolist() == direct[0].tolist()
            np.testing.assert_allclose(scores, direct[1], rtol=FTS5["rel"], atol=FTS5["abs"])
        dense = searcher.score_index(text, index)
        assert dense.shape == (len(index),) and np.count_nonzero(dense) == len(index.bm25.scores(text)[0])
        np.testing.assert_allclose(fts5.score_index(text, index), dense, rtol=FTS5["rel"], atol=FTS5["abs"])
        np.testing.assert_allclose(searcher.score_index(text, other), dense, rtol=1e-12)


def test_ties_keep_the_lowest_rows_and_buffers_come_back_clean(tmp_path):
    from recommender.lexical.postings import Bm25Postings

    same = Ticket("x", "pump seal leak", "the pump seal leaks oil", "replace the seal")
    tickets = [Ticket(f"t{i}", same.subject, same.description, same.solution) if i % 3 else
               Ticket(f"t{i}", "valve", f"valve {'stuck ' * (i % 5)}open", "oil it") for i in range(60)]
    builder = PostingsBuilder(len(tickets))
    builder.add(np.arange(len(tickets)), ticket_terms(tickets))
    stats = builder.write(tmp_path)
    bm25 = Bm25Postings.open(tmp_path, stats, len(tickets))
    rows, scores = bm25.scores("pump seal oil")
    expected = sorted(zip(rows.tolist(), scores.tolist()), key=lambda x: (-x[1], x[0]))
    for k in (1, 7, 40, 100):
        top_rows, top_scores = bm25.top_k("pump seal oil", k)
        assert list(zip(top_rows.tolist(), top_scores.tolist())) == expected[:k]
    assert bm25.top_k("pump seal oil", 7)[0].tolist() == [1, 2, 4, 5, 7, 8, 10]  # 40 equal scores: lowest rows
    assert all(not acc.any() for acc, _ in bm25._spare)  # every accumulator went back zeroed


def test_word_idf_is_the_rarest_term_of_a_word_and_the_floor_for_common_ones(tmp_path):
    from recommender.lexical.bm25 import MIN_IDF, idf
    from recommender.lexical.postings import Bm25Postings

    tickets = [Ticket(f"t{i}", "SeaMonkey: steps to reproduce",
                      f"User agent mozilla/5.0 ({'bearing wear' if i == 3 else 'pump'})", "") for i in range(10)]
    builder = PostingsBuilder(len(tickets))
    builder.add(np.arange(len(tickets)), ticket_terms(tickets))
    bm25 = Bm25Postings.open(tmp_path, builder.write(tmp_path), len(tickets))
    assert bm25.word_idf("bearing") == pytest.approx(idf(1, 10))
    assert bm25.word_idf("pump") == MIN_IDF  # 9 of the 10 tickets
    assert bm25.word_idf("bearings") == bm25.word_idf("bearing")  # one stem
    assert bm25.word_idf("seamonkey") == bm25.word_idf("mozilla/5.0") == MIN_IDF  # every ticket's; 5 and 0 as well
    assert bm25.word_idf("the") == MIN_IDF  # a stop word is no term
