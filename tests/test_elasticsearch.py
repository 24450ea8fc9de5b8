"""The Elasticsearch searcher: request bodies (no server), a dead server (real refused connection),
and, when TICKETREC_ES_URL names a live Elasticsearch 8+ server, the backend end to end."""
import json
import os
import uuid

import pytest

from recommender.errors import ServiceUnavailable, TicketrecError
from recommender.lexical.analyzer import MAX_QUERY_TERMS
from recommender.lexical.searchers import ElasticsearchSearcher
from recommender.data.records import Ticket

ES_URL = os.environ.get("TICKETREC_ES_URL", "")
live = pytest.mark.skipif(not ES_URL, reason="set TICKETREC_ES_URL to a live Elasticsearch 8+ server to run these")


def _searcher(**kw) -> ElasticsearchSearcher:
    return ElasticsearchSearcher("http://localhost:9200", "tickets-test", **kw)


def test_query_body_is_a_boosted_multi_match_of_plain_terms():
    body = _searcher().query_body('Gas "turbine"* trips NEAR( the OR a:b ^ -(flame)', 25)
    assert body["size"] == 25 and body["_source"] is False
    mm = body["query"]["multi_match"]
    assert mm["type"] == "most_fields"
    assert mm["fields"] == ["subject^2", "description^1", "solution^1"]
    assert mm["query"] == "gas turbine trips near b flame"  # operators gone, stop words dropped
    assert "query_string" not in json.dumps(body)


def test_query_body_boosts_follow_weights_and_zero_drops_a_field():
    mm = _searcher(weights=(3.0, 1.5, 0.0)).query_body("valve", 5)["query"]["multi_match"]
    assert mm["fields"] == ["subject^3", "description^1.5"]


def test_query_body_of_nothing_searchable_is_none():
    pf = _searcher()
    assert pf.query_body("", 10) is None
    assert pf.query_body('" * ( ) OR AND', 10) is None
    assert pf.query_body("valve", 0) is None
    assert pf.search("the of and", 10) == []  # answered without a request


def test_query_body_of_a_huge_query_keeps_the_most_frequent_terms():
    text = "valve " * 500 + "compressor " * 300 + " ".join(f"word{i}" for i in range(20_000))
    terms = _searcher().query_body(text, 10)["query"]["multi_match"]["query"].split()
    assert len(terms) == MAX_QUERY_TERMS and terms[:2] == ["valve", "compressor"]


def test_score_body_filters_by_ids_without_changing_the_query():
    pf = _searcher()
    body = pf.score_body("valve leak", ["a", "b"])
    assert body["query"]["bool"]["must"] == [pf.query_body("valve leak", 1)["query"]]
    assert body["query"]["bool"]["filter"] == [{"ids": {"values": ["a", "b"]}}]
    assert body["size"] == 2


def test_page_body_is_the_query_sorted_by_score_then_index_order_after_the_last_hit():
    pf = _searcher()
    body = pf.query_body("valve leak", 25_000)
    first = pf.page_body(body, "PIT-1", None, 10_000)
    assert first["query"] == body["query"] and first["size"] == 10_000 and first["_source"] is False
    assert first["pit"] == {"id": "PIT-1", "keep_alive": pf.pit_keep_alive}
    assert first["sort"] == [{"_score": "desc"}, {"_shard_doc": "asc"}] and "search_after" not in first
    assert pf.page_body(body, "PIT-2", (3.5, 17), 5)["search_after"] == [3.5, 17]
    assert body["size"] == 25_000 and "pit" not in body  # the query body is left as it was


class _PagingClient:
    """A stand-in for the server's point-in-time paging (no Elasticsearch here; the live tests below run it on
    one): hits sorted by score, then by their place; every request recorded."""

    def __init__(self, scores, fail_on_page=None):
        self.hits = sorted(((s, i, f"T{i}") for i, s in enumerate(scores)), key=lambda h: (-h[0], h[1]))
        self.requests, self.open, self.fail_on_page = [], set(), fail_on_page

    def open_point_in_time(self, index, keep_alive):
        self.open.add("pit-0")
        return {"id": "pit-0"}

    def search(self, body=None, index=None):
        assert index is None and body["pit"]["id"] in self.open  # a point-in-time search names no index
        self.requests.append(body)
        if self.fail_on_page == len(self.requests):
            import elasticsearch
            raise elasticsearch.ConnectionError("connection reset")
        after = body.get("search_after")
        rest = [h for h in self.hits if after is None or (-h[0], h[1]) > (-after[0], after[1])]
        page = rest[: body["size"]]
        self.open = {f"pit-{len(self.requests)}"}  # the server may hand back a new id with each page
        return {"pit_id": f"pit-{len(self.requests)}",
                "hits": {"hits": [{"_id": tid, "_score": s, "sort": [s, i]} for s, i, tid in page]}}

    def close_point_in_time(self, id):
        self.open.discard(id)


def test_more_hits_than_the_result_window_come_a_page_at_a_time_and_the_point_in_time_is_closed():
    scores = [1.0 + (i % 7) for i in range(23)]  # ties across page boundaries
    client = _PagingClient(scores)
    pf = ElasticsearchSearcher("http://localhost:9200", "t", client=client)
    pf.result_window = 5
    hits = pf.search("valve", 23)
    assert hits == [(tid, s) for s, _, tid in client.hits]  # every ticket once, best first
    assert [r["size"] for r in client.requests] == [5, 5, 5, 5, 3] and not client.open
    assert pf.search("valve", 12) == hits[:12] and not client.open  # stops at what was asked
    assert pf.batch_search(["valve", "the"], 8) == [hits[:8], []]
    client.requests.clear()
    assert len(pf.search("valve", 100)) == 23  # fewer tickets than asked for: the short page ends it
    assert [r["size"] for r in client.requests] == [5] * 5 and not client.open


def test_a_failed_page_closes_the_point_in_time_and_says_what_to_do():
    client = _PagingClient([1.0] * 12, fail_on_page=2)
    pf = ElasticsearchSearcher("http://localhost:9200", "t", client=client)
    pf.result_window = 5
    with pytest.raises(ServiceUnavailable, match="cannot reach Elasticsearch"):
        pf.search("valve", 12)
    assert not client.open


def test_index_body_maps_three_english_fields_with_explicit_bm25():
    body = _searcher(k1=1.5, b=0.6).index_body()
    assert body["settings"]["similarity"]["ticketrec_bm25"] == {"type": "BM25", "k1": 1.5, "b": 0.6}
    assert body["settings"]["number_of_shards"] == 1
    props = body["mappings"]["properties"]
    assert set(props) == {"subject", "description", "solution"}
    for field in props.values():
        assert field == {"type": "text", "analyzer": "english", "similarity": "ticketrec_bm25"}


def test_missing_url_is_a_clear_error():
    with pytest.raises(TicketrecError, match="TICKETREC_ES_URL"):
        ElasticsearchSearcher("", "x")


def test_dead_server_is_service_unavailable():
    # port 9 (discard) on the loopback: nothing listens, the connection is refused at once
    pf = ElasticsearchSearcher("http://127.0.0.1:9", "tickets-test", request_timeout=2.0)
    with pytest.raises(ServiceUnavailable, match=r"cannot reach Elasticsearch at http://127\.0\.0\.1:9.*unset TICKETREC_ES_URL"):
        pf.search("gas turbine", 10)
    with pytest.raises(ServiceUnavailable):
        pf.rebuild([Ticket("a", "s", "d", "x")], progress=False)


# -- live server --------------------------------------------------------------------------------------------------
TICKETS = [
    Ticket("GT-1", "Gas turbine trips on startup", "The gas turbine trips during startup with a flame loss alarm.",
           "Replace the igniter and clean the fuel nozzle."),
    Ticket("CP-2", "Compressor surge at load", "High vibration and surge of the axial compressor at base load.",
           "Clean the inlet filter and recalibrate the anti-surge valve."),
    Ticket("VL-3", "Oil leak near the valve", "Lube oil leaks near the control valve stem; puddle under the skid.",
           "Tighten the valve packing and replace the gasket."),
    Ticket("AUX-6", "Generator excitation fault", "The exciter reports a fault and the unit load is reduced.",
           "Replace the diode bridge of the brushless exciter."),
]


@pytest.fixture
def es():
    pf = ElasticsearchSearcher(ES_URL, f"ticketrec-test-{uuid.uuid4().hex[:8]}")
    yield pf
    # by name: ES 8+ refuses wildcard deletes by default (action.destructive_requires_name)
    for name in pf.client.indices.get(index=f"{pf.alias}*", allow_no_indices=True).body:
        pf.client.indices.delete(index=name, ignore_unavailable=True)


@live
def test_live_rebuild_search_and_scores(es):
    assert es.rebuild(TICKETS, progress=False) == len(TICKETS)
    assert es.count() == len(TICKETS)
    hits = es.search("diode bridge exciter", 10)
    assert hits[0][0] == "AUX-6"
    for text in ['"', "*", "NEAR(", "OR", "-", "AND", "a:b", "(", "^", "valve" * 20_000]:
        assert isinstance(es.search(text, 5), list)
    scores = es.score_tickets("oil valve leak", [tid for tid, _ in es.search("oil valve leak", 10)] + ["nope"])
    for tid, s in es.search("oil valve leak", 10):
        assert scores[tid] == pytest.approx(s, rel=1e-5)
    assert scores["nope"] == 0.0
    assert es.batch_search(["oil valve", "", "surge"], 3) == [es.search(t, 3) for t in ["oil valve", "", "surge"]]


@live
def test_live_more_hits_than_the_result_window_page_through_a_point_in_time(es):
    es.rebuild(TICKETS, progress=False)
    text = "gas turbine compressor valve oil exciter fault load"
    whole = es.search(text, 10)
    es.result_window = 1
    paged = es.search(text, 10)
    assert [tid for tid, _ in paged] == [tid for tid, _ in whole] and len(whole) >= 3
    assert [s for _, s in paged] == pytest.approx([s for _, s in whole], rel=1e-6)
    assert es.batch_search([text], 10) == [paged]


@live
def test_live_rebuild_swaps_the_alias_atomically_and_index_upserts(es):
    es.rebuild(TICKETS[:2], progress=False)
    first = es._alias_targets()
    es.rebuild(TICKETS, progress=False)
    second = es._alias_targets()
    assert len(first) == len(second) == 1 and first != second
    assert not es.client.indices.exists(index=first[0])  # the old version is dropped after the swap
    es.index([Ticket("NEW-7", "Sandblast nozzle worn", "Worn nozzle.", "Swap it.")], progress=False)
    assert es.count() == len(TICKETS) + 1 and es.search("sandblast", 5)[0][0] == "NEW-7"


@live
def test_live_remove_drops_tickets_and_ignores_absent_ones(es):
    es.rebuild(TICKETS, progress=False)
    gone = TICKETS[0].id
    assert es.remove([gone, "never-indexed"]) == 1
    assert es.count() == len(TICKETS) - 1 and gone not in {tid for tid, _ in es.search(TICKETS[0].subject, 50)}


@live
def test_live_missing_index_says_how_to_fill_it(es):
    from recommender.errors import IndexStateError

    with pytest.raises(IndexStateError, match="prefilter-index"):
        es.search("valve", 5)
