"""The engine: validation, exhaustive and pre-filtered answers equal the model's own scores, explanations, the CLI,
following a new index version, and a dead broker answered in-process."""
import json
import logging

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import a_word_of_one_ticket, free_port

from recommender.cli import main
from recommender.config import Settings
from recommender.serving.engine import CHANNEL_LABELS, Recommender, share_percentages, shared_terms
from recommender.errors import IndexStateError, InputError
from recommender.serving.index import current_version
from recommender.serving.index_build import build_index
from recommender.data.records import Query, Ticket
from recommender.data.store import Dataset, Store
from recommender.lexical.analyzer import content_words, stem_key, tokenize
from recommender.lexical.bm25 import MIN_IDF


@pytest.fixture(scope="module")
def model(tiny_model):
    from recommender.model.bundle import TicketModel

    return TicketModel.load(tiny_model[0])


@pytest.fixture
def served(tmp_path, tiny_model, model):
    """(settings, store) of a home with the tiny knowledge base indexed."""
    env = {"TICKETREC_HOME": str(tmp_path / "home"), "TICKETREC_MODEL": str(tiny_model[0]),
           "TICKETREC_MAX_DESCRIPTION": "500", "TICKETREC_CANDIDATES": "20"}
    settings = Settings.from_env(env)
    store = Store(settings.db)
    store.import_dataset(Dataset(tiny_model[1].tickets, source="kb"))
    build_index(store, model, settings, progress=False)
    yield settings, store, env
    store.close()


def a_query(tiny_model) -> Query:
    q = tiny_model[1].queries[0]
    return Query(q.subject, q.description)


def test_whole_index_ranking_equals_the_model_scoring_every_ticket(served, model, tiny_model):
    settings, store, _ = served
    engine = Recommender(settings.replace(candidates=0), store=store, model=model)
    query = a_query(tiny_model)
    results = engine.recommend(query, k=7)
    tickets = store.get_tickets(store.ticket_ids())
    from recommender.lexical.bm25 import Bm25Scorer  # K = 0: the lexical feature over the whole index

    lexical = Bm25Scorer(tickets).lexical(f"{query.subject}\n{query.description}")
    assert model.metric_spec()["bm25"] > 0 and 0 < lexical.max() == 1.0
    g = model.score_pairs([query] * len(tickets), tickets, lexical=lexical)
    order = np.argsort(-g, kind="stable")[:7]
    assert [r.ticket.id for r in results] == [tickets[i].id for i in order]
    np.testing.assert_allclose([r.raw_score for r in results], g[order], atol=1e-5)
    assert [r.rank for r in results] == list(range(1, 8))
    np.testing.assert_allclose([r.score for r in results], model.calibrate(g[order]), atol=1e-4)
    assert all(1.0 <= r.score <= 5.0 for r in results)
    assert results.info.mode == "in-process" and results.info.candidates is None
    assert results.info.prefilter == "index"  # K = 0 with a BM25-weighing model: the postings score every ticket


def test_prefiltered_answers_score_only_bm25_candidates(served, model, tiny_model):
    from recommender.serving.searchers import make_searcher

    settings, store, _ = served
    engine = Recommender(settings, store=store, model=model)
    query = a_query(tiny_model)
    results = engine.recommend(query, k=5)
    hits = make_searcher(settings, store).search(f"{query.subject}\n{query.description}", 20)
    bm25 = dict(hits)
    assert 0 < len(hits) <= 20 and results.info.candidates == len(hits) and results.info.prefilter == "index"
    assert {r.ticket.id for r in results} <= set(bm25)
    cands = store.get_tickets([tid for tid, _ in hits])
    g = model.score_pairs([query] * len(cands), cands, lexical=[bm25[t.id] / hits[0][1] for t in cands])
    best = np.argsort(-g, kind="stable")[:5]
    assert [r.ticket.id for r in results] == [cands[i].id for i in best]
    np.testing.assert_allclose([r.raw_score for r in results], g[best], atol=1e-5)
    for r in results:
        assert r.bm25 == pytest.approx(bm25[r.ticket.id], rel=1e-6)


def test_a_query_few_tickets_share_a_word_with_is_ranked_over_every_ticket(served, model, tiny_model):
    """When fewer tickets than the results asked for share a word with the query, every ticket is scored (those
    sharing none at lexical 0): the query gets its k results, ranked as with K = 0; one result asked for is the
    BM25 candidate's, as before."""
    from recommender.serving.engine import weighs_dense

    settings, store, _ = served
    query = Query(a_word_of_one_ticket(store.get_tickets(store.ticket_ids())), "")
    assert weighs_dense(model.metric_spec())
    few = Recommender(settings, store=store, model=model).recommend(query, k=5)
    every = Recommender(settings.replace(candidates=0), store=store, model=model).recommend(query, k=5)
    assert len(few) == 5 and few.info.candidates is None
    assert [r.ticket.id for r in few] == [r.ticket.id for r in every]
    np.testing.assert_allclose([r.raw_score for r in few], [r.raw_score for r in every], atol=1e-6)
    assert sorted(r.bm25 > 0 for r in few) == [False] * 4 + [True]
    one = Recommender(settings, store=store, model=model).recommend(query, k=1)
    assert one.info.candidates == 1 and one[0].bm25 > 0


def test_a_model_that_keeps_bm25_alone_is_served_by_bm25(tmp_path, tiny_model):
    """The label-free weight selection may give every channel weight 0 and keep BM25 (a knowledge base where no
    dense channel ranks its held-out queries better): such a model is indexed, ranks as BM25 does and says so."""
    from recommender.model.bundle import TicketModel

    alone = TicketModel.load(tiny_model[0])
    spec = alone.metric_spec()
    alone.net.set_weights([v for *_, v in spec["pairs"]], {c: 0.0 for c in spec["channels"]}, 1.0)
    alone.invalidate()
    alone.save(tmp_path / "bm25-alone")
    settings = Settings.from_env({"TICKETREC_HOME": str(tmp_path / "home"),
                                  "TICKETREC_MODEL": str(tmp_path / "bm25-alone"), "TICKETREC_CANDIDATES": "20"})
    store = Store(settings.db)
    try:
        store.import_dataset(Dataset(tiny_model[1].tickets, source="kb"))
        build_index(store, alone, settings, progress=False)
        engine = Recommender(settings, store=store)
        query = a_query(tiny_model)
        results = engine.recommend(query, k=5)
        hits = engine.searcher.search(f"{query.subject}\n{query.description}", 5)
        assert [r.ticket.id for r in results] == [tid for tid, _ in hits]
        np.testing.assert_allclose([r.raw_score for r in results], [np.exp(-(1 - s / hits[0][1])) for _, s in hits],
                                   atol=1e-6)
        assert results[0].channel_shares == {"bm25": 1.0}
        # nothing but BM25 to rank by: a word of one ticket gets that ticket alone, not tickets sharing no word
        rare = engine.recommend(Query(a_word_of_one_ticket(tiny_model[1].tickets), ""), k=5)
        assert len(rare) == 1 and rare.info.candidates == 1
    finally:
        store.close()


def test_topic_prefilter_scores_the_nearest_topic_vectors(served, model, tiny_model):
    """TICKETREC_PREFILTER=topics: the K candidates are the tickets nearest to the query in the model's DocNADE
    topic space (standardised hidden units, cosine), computed here from the model's own topic vectors, and they
    are scored like the BM25 candidates: the model's forward pass with their BM25 over the candidates."""
    from recommender.lexical.bm25 import Bm25Scorer

    settings, store, _ = served
    engine = Recommender(settings.replace(prefilter="topics", candidates=8), store=store, model=model)
    query = a_query(tiny_model)
    results = engine.recommend(query, k=5)
    assert results.info.prefilter == "topics" and results.info.candidates == 8
    tickets = store.get_tickets(engine.index.ticket_ids)
    raw = model.prepare(tickets, "ticket").extras["DESC.T"].astype(np.float64)  # Table 2 pairs: no ALL
    centre, scale = raw.mean(axis=0), raw.std(axis=0) + 1e-6
    q = model.prepare([query], "query").extras["DESC.T"][0].astype(np.float64)
    z_tickets, z_query = (raw - centre) / scale, (q - centre) / scale
    affinity = (z_tickets / np.linalg.norm(z_tickets, axis=1, keepdims=True)) @ (z_query / np.linalg.norm(z_query))
    nearest = np.lexsort((np.arange(len(tickets)), -affinity))[:8]
    cands = [tickets[i] for i in nearest]
    assert {r.ticket.id for r in results} <= {t.id for t in cands}
    bm25 = Bm25Scorer(tickets).scores(f"{query.subject}\n{query.description}")[nearest]
    g = model.score_pairs([query] * len(cands), cands, lexical=bm25 / bm25.max())
    best = np.argsort(-g, kind="stable")[:5]
    assert [r.ticket.id for r in results] == [cands[i].id for i in best]
    np.testing.assert_allclose([r.raw_score for r in results], g[best], atol=1e-5)


def test_topic_prefilter_needs_the_topic_channel(served, model, tiny_model, tmp_path):
    """A model without T cannot place a query in topic space: a clear error naming the way out."""
    from recommender.serving.searchers import TopicSearcher

    settings, store, _ = served
    index = Recommender(settings, store=store, model=model).index
    saved = index.model.topic_model
    index.model.topic_model = None
    try:
        with pytest.raises(IndexStateError, match="TICKETREC_PREFILTER=index"):
            TopicSearcher(index)
    finally:
        index.model.topic_model = saved


def test_each_recommendation_explains_itself(served, model, tiny_model):
    settings, store, _ = served
    query = a_query(tiny_model)
    engine = Recommender(settings, store=store, model=model)
    results = engine.recommend(query, k=3)
    qwords = set(content_words(tokenize(f"{query.subject} {query.description}")))
    word_idf = engine.index.bm25.word_idf
    for r in results:
        t = r.ticket
        tkeys = {stem_key(w) for w in tokenize(f"{t.subject} {t.description} {t.solution}")}
        telling = {stem_key(w) for w in qwords if stem_key(w) in tkeys and word_idf(w) > MIN_IDF}
        assert sorted(map(stem_key, r.shared_terms)) == sorted(telling)  # the telling ones BM25 matched, once each
        weights = [word_idf(w) for w in r.shared_terms]
        assert weights == sorted(weights, reverse=True)  # rarest first
        assert len(r.topics) == (3 if "T" in r.channel_shares else 0)  # topics only when they weigh
        if r.topics:  # the engine's topic words (computed once per model) are the model's
            assert r.topics == model.top_topics(engine.index.vectors, engine.index.row_of[t.id], n=3)
        assert all({"id", "weight", "words"} <= set(tp) for tp in r.topics)
        assert t.solution  # the ticket comes from the store, solution included
    d = results[0].to_dict()
    json.dumps(d)
    assert d["rank"] == 1 and d["ticket"]["id"] == results[0].ticket.id


@pytest.mark.parametrize("w_topics", [0.0, 0.2])
def test_topics_are_shown_only_when_the_topic_channel_carries_weight(tmp_path, tiny_model, model, w_topics):
    spec = model.metric_spec()
    model.net.set_weights([v for *_, v in spec["pairs"]], dict(spec["channels"], T=w_topics), spec["bm25"])
    model.invalidate()
    settings = Settings.from_env({"TICKETREC_HOME": str(tmp_path / "home"), "TICKETREC_MODEL": str(tiny_model[0])})
    with Store(settings.db) as store:
        store.import_dataset(Dataset(tiny_model[1].tickets, source="kb"))
        build_index(store, model, settings, progress=False)
        results = Recommender(settings, store=store, model=model).recommend(a_query(tiny_model), k=3)
    assert results and all(len(r.topics) == (3 if w_topics else 0) for r in results)
    assert all(("T" in r.channel_shares) == bool(w_topics) for r in results)


def test_shared_terms_keep_query_order_without_stop_words():
    q = Query("Turbine vibration", "The turbine shows vibration at the bearing")
    t = Ticket("x", "bearing wear", "vibration on the bearing", "replace the bearing")
    assert shared_terms(q, t) == ["vibration", "bearing"]


def test_shared_terms_are_the_words_bm25_matches_by_stem_each_stem_once():
    q = Query("Crash when attaching files", "It crashes on every attach; Mozilla/5.0 on Windows")
    t = Ticket("x", "attachments crash", "crashing with two files", "update mozilla/5.0")
    assert shared_terms(q, t) == ["crash", "attaching", "files", "mozilla/5.0"]  # not "crashes", "attach"
    # a word of several terms is shared whole, not by terms the ticket has apart; nor is a longer word's stem
    assert shared_terms(q, Ticket("y", "windowsill", "mozilla 5 0", "")) == []
    # a word of one term is shared with that term inside a longer word, which BM25 matches too (a path, a URL)
    log = Ticket("z", "spell check broken", "error: /usr/lib/seamonkey/dictionaries/en-US.aff: cannot open", "")
    assert shared_terms(Query("spellchecker dictionary", ""), log) == ["dictionary"]


def test_weighted_shared_terms_leave_out_words_in_half_the_tickets_and_come_rarest_first():
    q = Query("Turbine vibration", "The turbine shows vibration and noise at the bearing")
    t = Ticket("x", "turbine bearing wear", "vibration and noise on the bearing", "replace the bearing")
    word_idf = {"turbine": MIN_IDF, "vibration": 1.2, "noise": 1.2, "bearing": 2.5}.__getitem__
    assert shared_terms(q, t, word_idf) == ["bearing", "vibration", "noise"]  # equal weights keep the query's order


def test_bad_queries_get_clear_errors(served, model):
    settings, store, _ = served
    engine = Recommender(settings, store=store, model=model)
    with pytest.raises(InputError, match="empty"):
        engine.recommend(Query("  ", "\n"))
    with pytest.raises(InputError, match="500"):
        engine.recommend(Query("pump", "x" * 501))
    with pytest.raises(InputError, match="words"):
        engine.recommend(Query("?!", "..."))
    with pytest.raises(InputError, match="k must"):
        engine.recommend(Query("pump", "oil pump noise"), k=0)


def test_no_index_is_an_index_state_error(tmp_path, tiny_model, model):
    settings = Settings.from_env({"TICKETREC_HOME": str(tmp_path / "empty"), "TICKETREC_MODEL": str(tiny_model[0])})
    with pytest.raises(IndexStateError, match="ticketrec index"):
        Recommender(settings, model=model).recommend(Query("pump", "oil pump noise"))


def test_a_version_is_served_with_the_model_it_carries(tmp_path, served, model, tiny_model, another_model):
    settings, store, _ = served
    query = a_query(tiny_model)
    expected = Recommender(settings, store=store, model=model).recommend(query, k=5)
    other = another_model
    assert other.version != model.version
    # TICKETREC_MODEL only chooses the model of the next build; a model given for another version is not used
    elsewhere = settings.replace(model=tmp_path / "no-model-here")
    answer = Recommender(elsewhere, store=store, model=other).recommend(query, k=5)
    assert answer.info.model_version == model.version == expected.info.model_version
    assert [r.ticket.id for r in answer] == [r.ticket.id for r in expected]
    np.testing.assert_allclose([r.raw_score for r in answer], [r.raw_score for r in expected], rtol=1e-6)


def test_the_engine_follows_a_new_index_version(served, model):
    settings, store, _ = served
    engine = Recommender(settings, store=store, model=model)
    before = engine.index_version
    store.import_dataset(Dataset([Ticket("NEW-9", "Gearbox whine", "A loud gearbox whine at full load.",
                                         "Realign the coupling.")], source="new"))
    after = build_index(store, model, settings, progress=False)
    assert after != before
    results = engine.recommend(Query("gearbox whine", "loud whine from the gearbox at full load"), k=3)
    assert results.info.index_version == after
    assert "NEW-9" in [r.ticket.id for r in results]


def test_a_dead_broker_is_answered_in_process_and_logged(served, model, tiny_model, caplog, monkeypatch):
    from recommender.serving import engine as engine_mod

    now = [1000.0]
    monkeypatch.setattr(engine_mod, "monotonic", lambda: now[0])  # the back-off's clock, advanced by hand
    settings, store, _ = served
    query = a_query(tiny_model)
    expected = Recommender(settings, store=store, model=model).recommend(query, k=5)
    dead = settings.replace(broker_url=f"redis://127.0.0.1:{free_port()}/0", query_deadline=3.0,
                            broker_retry_after=7.0)  # TICKETREC_BROKER_RETRY_AFTER, not its default 30
    engine = Recommender(dead, store=store, model=model)
    with caplog.at_level(logging.WARNING, logger="recommender.serving.engine"):
        results = engine.recommend(query, k=5)
        assert [r.ticket.id for r in results] == [r.ticket.id for r in expected]
        assert results.info.mode == "in-process" and results.info.fallback_reason
        # within the back-off the broker is not tried again, the reason still says why
        now[0] += dead.broker_retry_after - 1
        assert "retrying" in engine.recommend(query, k=5).info.fallback_reason
        now[0] += 2  # the back-off is over: the workers are tried (and fail) again
        last = engine.recommend(query, k=5).info
    assert last.mode == "in-process" and "retrying" not in last.fallback_reason
    assert sum("answering in-process" in rec.getMessage() for rec in caplog.records) == 2


def test_cli_recommend_prints_json_and_text(served):
    settings, store, env = served
    runner = CliRunner()
    out = runner.invoke(main, ["recommend", "--subject", "oil pressure", "--description",
                               "low oil pressure on the lube pump", "-k", "4", "--json"], env=env)
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert len(data["results"]) == 4 and [r["rank"] for r in data["results"]] == [1, 2, 3, 4]
    assert {"score", "raw_score", "bm25", "shared_terms", "topics", "ticket"} <= set(data["results"][0])
    text = runner.invoke(main, ["recommend", "--subject", "oil pressure", "--description",
                                "low oil pressure on the lube pump", "-k", "4"], env=env)
    assert text.exit_code == 0 and text.output.count("solution:") == 4
    whys = [line.split("why: ", 1)[1] for line in text.output.splitlines() if line.startswith("    why: ")]
    assert whys == [", ".join(f"{CHANNEL_LABELS[c][0]} {p} %" for c, p in share_percentages(r["channel_shares"]))
                    or "no channel sets it apart from the typical candidate" for r in data["results"]]
    assert all(sum(int(p.rsplit(" ", 2)[1]) for p in why.split(", ")) == 100 for why in whys if "%" in why)
    empty = runner.invoke(main, ["recommend"], env=env)
    assert empty.exit_code == 1 and "empty" in empty.output and "Traceback" not in empty.output


def test_cli_index_builds_and_reports(tmp_path, tiny_model):
    env = {"TICKETREC_HOME": str(tmp_path / "home"), "TICKETREC_MODEL": str(tiny_model[0])}
    runner = CliRunner()
    missing = runner.invoke(main, ["recommend", "--subject", "pump"], env=env)
    assert missing.exit_code == 1 and "ticketrec index" in missing.output
    with Store(tmp_path / "home" / "ticketrec.sqlite3") as store:
        store.import_dataset(Dataset(tiny_model[1].tickets, source="kb"))
    out = runner.invoke(main, ["index"], env=env)
    assert out.exit_code == 0, out.output
    info = json.loads(out.output[out.output.index("{"):])
    assert info["n_tickets"] == 80 and info["encoded"] == 80
    again = runner.invoke(main, ["reindex"], env=env)  # no broker: in-process, nothing changed
    assert again.exit_code == 0 and json.loads(again.output[again.output.index("{"):])["version"] == info["version"]
    assert current_version(Settings.from_env(env)) == info["version"]
    full = runner.invoke(main, ["index", "--full", "--workers", "2"], env=env)  # 80 tickets: one batch, no fork
    assert full.exit_code == 0, full.output
    rebuilt = json.loads(full.output[full.output.index("{"):])
    assert rebuilt["version"] != info["version"] and rebuilt["encoded"] == 80
    refused = runner.invoke(main, ["index", "--workers", "0"], env=env)
    assert refused.exit_code == 2 and "--workers" in refused.output
