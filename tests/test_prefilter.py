"""The FTS5 searcher: user text is never FTS5 syntax, ranking is BM25, scores agree, the index follows the store."""
import json
import random

import pytest
from click.testing import CliRunner

from recommender.config import Settings
from recommender.errors import IndexStateError, TicketrecError
from recommender.lexical.analyzer import MAX_QUERY_TERMS, query_terms
from recommender.lexical.searchers import ElasticsearchSearcher, Fts5Searcher, fts5_match_expression
from recommender.serving.searchers import IndexSearcher, make_searcher
from recommender.data.records import Ticket
from recommender.data.store import Dataset, Store

TICKETS = [
    Ticket("GT-1", "Gas turbine trips on startup", "The gas turbine trips during startup with a flame loss alarm.",
           "Replace the igniter and clean the fuel nozzle."),
    Ticket("CP-2", "Compressor surge at load", "High vibration and surge of the axial compressor at base load.",
           "Clean the inlet filter and recalibrate the anti-surge valve."),
    Ticket("VL-3", "Oil leak near the valve", "Lube oil leaks near the control valve stem; puddle under the skid.",
           "Tighten the valve packing and replace the gasket."),
    Ticket("LB-4", "Lube oil temperature high", "Bearing oil temperature rises above the limit after one hour.",
           "Clean the oil cooler and check the thermostatic valve."),
    Ticket("CB-5", "Combustion dynamics alarm", "Humming noise in the combustor; pulsation readings exceed limits.",
           "Retune the combustion system and inspect the liners for cracks."),
    Ticket("AUX-6", "Generator excitation fault", "The exciter reports a fault and the unit load is reduced.",
           "Replace the diode bridge of the brushless exciter."),
]


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "kb.sqlite3") as s:
        s.import_dataset(Dataset(list(TICKETS), source="test"))
        yield s


@pytest.fixture
def fts(store):
    return Fts5Searcher(store)


HOSTILE = ['"', '""', '*', 'NEAR(', 'NEAR', 'OR', 'AND', 'NOT', '-', '^', '(', ')', 'a:b', 'subject:', ':', '+',
           '{subject description}:', "'", 'valve"', '"valve', 'NEAR(valve oil, 2)', 'valve AND', 'OR valve OR',
           '^valve', '-valve', 'subject:valve', 'valve*', '((valve', 'oil NOT valve', '\x00', 'ü ß 漢字', '\\', '%_']


@pytest.mark.parametrize("text", HOSTILE)
def test_fts5_syntax_in_user_text_never_raises(fts, text):
    hits = fts.search(text, 10)
    assert isinstance(hits, list)
    assert all(isinstance(tid, str) and isinstance(s, float) for tid, s in hits)
    fts.score_tickets(text, [t.id for t in TICKETS])  # the same expression; must not raise either


def test_operators_alone_match_nothing(fts):
    for text in ['"', '*', 'OR', 'AND', 'NOT', '-', '^', '(', ')', ':', 'a:b', '']:
        assert fts.search(text, 10) == [], text


def test_keywords_and_operators_are_plain_words(fts):
    # NEAR is searched as the word "near" (only VL-3 contains it), not as the NEAR() group
    assert [tid for tid, _ in fts.search("NEAR(", 10)] == ["VL-3"]
    # "-valve" is not NOT valve: the valve tickets come back
    valve = {tid for tid, _ in fts.search("-valve", 10)}
    assert valve == {"CP-2", "VL-3", "LB-4"}
    # a column filter is not one: "subject:valve" also finds tickets whose subject lacks "valve"
    assert {tid for tid, _ in fts.search("subject:valve", 10)} >= {"CP-2", "LB-4"}
    # "*" is not a prefix operator: "turb*" does not match "turbine"
    assert fts.search("turb*", 10) == []
    # "oil NOT valve" keeps the valve tickets (NOT is a stop word here, not an operator)
    assert {"CP-2"} <= {tid for tid, _ in fts.search("oil NOT valve", 10)}


def test_match_expression_quotes_every_term():
    assert fts5_match_expression(['valve', 'say "hi"']) == '"valve" OR "say ""hi"""'
    assert list(query_terms('The "Valve"* leaks; NEAR(oil)')) == ["valve", "leaks", "near", "oil"]


def test_empty_and_stop_word_queries_give_no_candidates(fts):
    assert fts.search("", 10) == []
    assert fts.search("   \n\t", 10) == []
    assert fts.search("the and of it is", 10) == []
    assert fts.search("valve", 0) == []
    assert fts.score_tickets("the of", ["GT-1"]) == {"GT-1": 0.0}


def test_100kb_query_works_and_keeps_the_rare_terms(fts):
    rng = random.Random(7)
    filler = " ".join("".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(8)) for _ in range(11_000))
    text = filler + " valve valve valve igniter " + '" * ( OR - ^ a:b ) AND ' * 100
    assert len(text.encode()) >= 100_000
    expr = fts.match_expression(text)
    assert 0 < expr.count(" OR ") + 1 <= MAX_QUERY_TERMS
    assert '"igniter"' in expr and '"valve"' in expr  # held by the index: kept over the unknown filler words
    hits = fts.search(text, 10)
    assert hits[0][0] == "GT-1"  # "igniter" is the rarest matching term (valve is in half the tickets)
    assert {tid for tid, _ in hits} == {"GT-1", "CP-2", "VL-3", "LB-4"}
    fts.store.close()  # a new connection (the vocabulary table is per connection) gives the same answer
    assert fts.search(text, 10) == hits


def test_rare_words_win(fts):
    hits = fts.search("diode bridge oil valve", 10)
    assert hits[0][0] == "AUX-6"
    scores = [s for _, s in hits]
    assert scores == sorted(scores, reverse=True) and all(s > 0 for s in scores)


def test_k_limits_and_orders_results(fts):
    hits = fts.search("valve oil clean replace", 2)
    assert len(hits) == 2
    assert hits[0][1] >= hits[1][1]
    assert len(fts.search("valve oil clean replace", 100)) == 5  # every ticket with one of the words


def test_subject_weight_counts(store):
    text = "exciter fault"  # AUX-6 has "excitation"/"fault" in the subject, "exciter" in description and solution
    heavy = dict(Fts5Searcher(store, weights=(5.0, 1.0, 1.0)).search(text, 5))
    none = dict(Fts5Searcher(store, weights=(0.0, 1.0, 1.0)).search(text, 5))
    assert heavy["AUX-6"] > none["AUX-6"]
    with pytest.raises(TicketrecError):
        Fts5Searcher(store, weights=(1.0, 1.0))


def test_score_tickets_agrees_with_search(fts):
    text = "Lube oil leaks near the valve, temperature high"
    hits = fts.search(text, 10)
    scores = fts.score_tickets(text, [tid for tid, _ in hits] + ["GT-1", "no-such-ticket"])
    for tid, s in hits:
        assert scores[tid] == pytest.approx(s, rel=1e-12)
    assert scores["no-such-ticket"] == 0.0
    assert "GT-1" not in dict(hits) and scores["GT-1"] == 0.0


def test_batch_search_equals_single_queries(fts):
    texts = ["valve leak", "", "compressor surge vibration"]
    assert fts.batch_search(texts, 3) == [fts.search(t, 3) for t in texts]


def test_index_follows_store_updates(store, fts):
    assert fts.search("sandblast", 5) == []
    changed = Ticket("VL-3", "Valve stem corrosion", "Rust on the valve stem.", "Sandblast and coat the stem.")
    store.import_dataset(Dataset([changed, Ticket("NEW-7", "Sandblast nozzle worn", "Worn nozzle.", "Swap it.")]))
    assert {tid for tid, _ in fts.search("sandblast", 5)} == {"VL-3", "NEW-7"}
    assert "VL-3" not in {tid for tid, _ in fts.search("puddle gasket", 5)}  # the old text is gone
    assert fts.count() == len(TICKETS) + 1
    before = fts.search("valve stem oil", 10)
    assert fts.rebuild() == len(TICKETS) + 1
    assert fts.search("valve stem oil", 10) == before
    assert fts.index(TICKETS) == 0  # nothing to do: the triggers already did it


def test_term_cap_uses_fresh_document_frequencies(store):
    one = Fts5Searcher(store, max_terms=1)  # keeps the single term with the highest query-count x IDF
    assert one.match_expression("sandblast valve") == '"valve"'  # "sandblast" is in no ticket yet
    store.import_dataset(Dataset([Ticket("NEW-7", "Sandblast nozzle worn", "Worn nozzle.", "Swap it.")]))
    assert one.match_expression("sandblast valve") == '"sandblast"'  # now the rarer one (cache invalidated)
    # query counts weigh in: IDF(valve) = ln(4.5/3.5) = 0.25, IDF(sandblast) = ln(6.5/1.5) = 1.47 (bm25.idf)
    assert one.match_expression("valve " * 5 + "sandblast") == '"sandblast"'
    assert one.match_expression("valve " * 6 + "sandblast") == '"valve"'


def test_make_searcher_picks_backend(store):
    base = Settings(home=store.path.parent, db=store.path, model=store.path.parent / "m")
    with pytest.raises(IndexStateError):  # the index backend and no index built: said, not guessed
        make_searcher(base, store)
    opened = object()  # the index version a caller already opened is wrapped, not opened again
    searcher = make_searcher(base, store, opened)
    assert isinstance(searcher, IndexSearcher) and searcher.ticket_index is opened
    assert isinstance(make_searcher(base.replace(prefilter="fts5"), store), Fts5Searcher)
    es = make_searcher(base.replace(prefilter="elasticsearch", es_url="http://localhost:9200"), store)
    assert isinstance(es, ElasticsearchSearcher) and es.alias == base.es_index
    with pytest.raises(TicketrecError, match="TICKETREC_ES_URL"):
        make_searcher(base.replace(prefilter="elasticsearch"), store)
    with pytest.raises(TicketrecError, match="index, topics, fts5 or elasticsearch"):
        make_searcher(base.replace(prefilter="lucene"), store)


# -- the CLI ------------------------------------------------------------------------------------------------------
@pytest.fixture
def cli_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TICKETREC_HOME", str(tmp_path / "home"))
    for var in ("TICKETREC_DB", "TICKETREC_PREFILTER", "TICKETREC_ES_URL"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "home" / "ticketrec.sqlite3"


def test_cli_search(cli_env):
    from recommender.cli import main

    runner = CliRunner()
    empty = runner.invoke(main, ["search", "valve"])
    assert empty.exit_code == 0 and "knowledge base is empty" in empty.output
    with Store(cli_env) as s:
        s.import_dataset(Dataset(list(TICKETS)))
    out = runner.invoke(main, ["search", 'diode "bridge* NEAR(', "-k", "3"])
    assert out.exit_code == 0, out.output
    assert "no ticket index" in out.stderr and "FTS5" in out.stderr  # no index built yet: the store's FTS5 answers
    first = out.stdout.splitlines()[1]
    assert "AUX-6" in first and "Generator excitation fault" in first
    assert "Replace the diode bridge" in out.stdout.splitlines()[2]
    as_json = json.loads(runner.invoke(main, ["search", "oil valve", "--json", "-k", "2"]).stdout)
    assert [h["rank"] for h in as_json["hits"]] == [1, 2] and as_json["prefilter"]["backend"] == "fts5"
    assert as_json["hits"][0]["bm25"] >= as_json["hits"][1]["bm25"] > 0
    none = runner.invoke(main, ["search", "zzzz"])
    assert none.exit_code == 0 and "no ticket" in none.output


def test_cli_search_errors_are_one_line(cli_env, monkeypatch):
    from recommender.cli import main

    monkeypatch.setenv("TICKETREC_PREFILTER", "elasticsearch")
    out = CliRunner().invoke(main, ["search", "valve"])
    assert out.exit_code == 1
    assert "TICKETREC_ES_URL" in out.output and "Traceback" not in out.output
