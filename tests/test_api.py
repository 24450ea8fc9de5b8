"""The JSON API under /api/v1: validation, status codes, JSON errors, feedback storage, schema of a result."""
import pytest

from recommender.data.store import query_key


@pytest.fixture
def api(make_web_app):
    """A test client of an app with CSRF protection ON (the API must not need a token) and no model yet."""
    return make_web_app(WTF_CSRF_ENABLED=True).test_client()


def assert_json_error(response, status):
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.is_json
    body = response.get_json()
    assert body["error"]["status"] == status and isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert "Traceback" not in response.get_data(as_text=True)
    return body["error"]["message"]


# -- tickets ------------------------------------------------------------------------------------------------
def test_get_ticket_returns_all_fields(api):
    response = api.get("/api/v1/tickets/WEB-3")
    assert response.status_code == 200
    body = response.get_json()
    assert body["id"] == "WEB-3"
    assert body["description"] == "Valve <script>alert('x')</script> sticks at 40% load."  # raw text, JSON-escaped
    assert set(body) == {"id", "subject", "description", "solution", "metadata"}


def test_unknown_ticket_is_a_json_404(api):
    assert "NOPE" in assert_json_error(api.get("/api/v1/tickets/NOPE"), 404)


# -- feedback -----------------------------------------------------------------------------------------------
def test_feedback_is_stored_with_its_query(api, web_kb):
    _, store = web_kb
    response = api.post("/api/v1/feedback", json={"subject": "valve stuck", "description": "at partial load",
                                                   "ticket_id": "WEB-3", "label": "YES"})
    assert response.status_code == 201
    body = response.get_json()
    assert body["query_key"] == query_key("valve stuck", "at partial load") and body["label"] == "YES"
    stored = store.feedback(query_key("valve stuck", "at partial load"))
    assert [(f.ticket_id, f.label, f.query_subject, f.query_description) for f in stored] == [
        ("WEB-3", "YES", "valve stuck", "at partial load")]
    assert stored[0].created_at > 0 and stored[0].id == body["id"]


@pytest.mark.parametrize("payload, status", [
    ({"subject": "s", "description": "d", "ticket_id": "WEB-1", "label": "MAYBE"}, 400),
    ({"subject": "s", "description": "d", "ticket_id": "WEB-1", "label": 5}, 400),
    ({"subject": "s", "description": "d", "ticket_id": 1, "label": "YES"}, 400),
    ({"subject": "s", "description": "d", "label": "YES"}, 400),
    ({"subject": "", "description": "d", "ticket_id": "WEB-1", "label": "YES"}, 400),
    ({"subject": ["s"], "description": "d", "ticket_id": "WEB-1", "label": "YES"}, 400),
    ({"subject": "s", "description": "d" * 201, "ticket_id": "WEB-1", "label": "YES"}, 413),
    ({"subject": "s", "description": "d", "ticket_id": "NOPE", "label": "YES"}, 404),
])
def test_bad_feedback_is_refused_and_nothing_is_stored(api, web_kb, payload, status):
    assert_json_error(api.post("/api/v1/feedback", json=payload), status)
    assert web_kb[1].feedback() == []


def test_feedback_must_be_a_json_object(api, web_kb):
    assert "Content-Type" in assert_json_error(api.post("/api/v1/feedback", data="subject=s"), 400)
    assert_json_error(api.post("/api/v1/feedback", data="{not json", content_type="application/json"), 400)
    assert_json_error(api.post("/api/v1/feedback", json=["s", "d"]), 400)
    assert web_kb[1].feedback() == []


# -- recommendations: validation (before any model is needed) -----------------------------------------------
@pytest.mark.parametrize("payload, status, says", [
    ({"description": "d"}, 400, "subject"),
    ({"subject": "s", "description": 3}, 400, "string"),
    ({"subject": "   ", "description": "d"}, 400, "empty"),
    ({"subject": "s", "description": "d", "k": "5"}, 400, "'k'"),
    ({"subject": "s", "description": "d", "k": True}, 400, "'k'"),
    ({"subject": "s", "description": "d", "k": 0}, 400, "'k'"),
    ({"subject": "s", "description": "d", "k": 101}, 400, "'k'"),
    ({"subject": "s", "description": "x" * 201}, 413, "limit is 200"),
    ({"subject": "s", "description": "d", "html": "yes"}, 400, "'html' must be true or false"),
    ({"subject": "<p><img src='x.png'></p>", "description": "d", "html": True}, 400, "no text once read as HTML"),
])
def test_recommendation_requests_are_validated(api, payload, status, says):
    assert says in assert_json_error(api.post("/api/v1/recommendations", json=payload), status)


def test_a_body_far_over_the_limit_is_refused_before_reading(api):
    big = '{"subject": "s", "description": "' + "x" * 200_000 + '"}'
    assert_json_error(api.post("/api/v1/recommendations", data=big, content_type="application/json"), 413)


def test_recommendations_without_a_model_say_what_to_do(api):
    message = assert_json_error(api.post("/api/v1/recommendations", json={"subject": "s", "description": "d"}), 503)
    assert "no recommendations can be served" in message


def test_wrong_method_and_unknown_route_are_json(api):
    assert_json_error(api.get("/api/v1/recommendations"), 405)
    assert_json_error(api.patch("/api/v1/tickets/WEB-1"), 405)
    assert_json_error(api.get("/api/v1/nothing-here"), 404)


def test_an_unexpected_failure_is_a_json_500_without_traceback(make_web_app):
    def broken_engine(settings):
        raise RuntimeError("simulated engine crash")

    client = make_web_app(TICKETREC_ENGINE_FACTORY=broken_engine).test_client()
    message = assert_json_error(client.post("/api/v1/recommendations", json={"subject": "s", "description": "d"}), 500)
    assert "simulated" not in message


# -- health -------------------------------------------------------------------------------------------------
def test_healthz_without_model_reports_store_ok_and_index_missing(api):
    response = api.get("/api/v1/healthz")
    assert response.status_code == 503
    body = response.get_json()
    assert body["status"] == "unavailable"
    assert body["store"]["ok"] is True and body["store"]["tickets"] == 4
    assert body["index"]["ok"] is False and body["index"]["error"]
    assert body["broker"] == {"mode": "in-process", "ok": True, "workers": []}


def test_healthz_reports_a_dead_broker(make_web_app, web_kb):
    settings, _ = web_kb
    client = make_web_app(TICKETREC_SETTINGS=settings.replace(broker_url="redis://127.0.0.1:1/0")).test_client()
    broker = client.get("/api/v1/healthz").get_json()["broker"]
    assert broker["mode"] == "celery" and broker["ok"] is not True and broker["workers"] == []


# -- with a real engine over a tiny trained model -----------------------------------------------------------
@pytest.fixture
def engine_api(web_engine):
    from web import create_app

    settings, engine = web_engine
    return create_app({"TESTING": True, "TICKETREC_SETTINGS": settings, "TICKETREC_ENGINE": engine}).test_client()


def test_recommendations_schema(engine_api, web_engine):
    _, engine = web_engine
    response = engine_api.post("/api/v1/recommendations", json={
        "subject": "valve seal leak", "description": "Actuator pressure drops, gasket leaking.", "k": 7})
    assert response.status_code == 200
    body = response.get_json()
    assert set(body) == {"query_key", "model_version", "index_version", "took_ms", "served", "where", "results"}
    assert body["where"] == []  # no filter asked
    assert body["model_version"] == engine.model.version and body["index_version"] == engine.index.version
    served = body["served"]  # how the answer was made: K = 0 here, so no pre-filter unless the model weighs BM25
    lexical = bool(engine.index.metric_spec.get("bm25"))
    assert served["prefilter"] == ("index" if lexical else "none")
    assert served["mode"] == "in-process" and served["fallback_reason"] is None
    assert served["candidates"] is None  # TICKETREC_CANDIDATES=0: every ticket scored
    assert {"encode", "prefilter", "score", "total"} <= set(served["timings_ms"])
    assert body["query_key"] == query_key("valve seal leak", "Actuator pressure drops, gasket leaking.")
    assert isinstance(body["took_ms"], float) and body["took_ms"] > 0
    results = body["results"]
    assert [r["rank"] for r in results] == list(range(1, 8))
    scores = [r["raw_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    for r in results:
        assert set(r) == {"rank", "score", "raw_score", "bm25", "shared_terms", "topics", "channel_shares",
                          "same_text_as", "ticket"}
        assert isinstance(r["score"], float) and 1.0 <= r["score"] <= 5.0
        assert isinstance(r["raw_score"], float) and 0.0 < r["raw_score"] <= 1.0
        assert r["bm25"] is None or isinstance(r["bm25"], float)
        assert all(isinstance(w, str) for w in r["shared_terms"])
        # topics only when the topic channel weighs (otherwise they would not say why)
        assert len(r["topics"]) == (3 if engine.index.metric_spec["channels"].get("T", 0) > 0 else 0)
        for topic in r["topics"]:
            assert isinstance(topic["id"], int) and isinstance(topic["weight"], float)
            assert topic["words"] and all(isinstance(w, str) for w in topic["words"])
        assert set(r["ticket"]) == {"id", "subject", "description", "solution", "metadata"}
        assert all(isinstance(r["ticket"][name], str) for name in ("id", "subject", "description", "solution"))
        # the ticket's imported columns, as GET /tickets/ID gives them (what a filter reads)
        assert r["ticket"]["metadata"] == engine_api.get(f"/api/v1/tickets/{r['ticket']['id']}").get_json()["metadata"]
        # why: each weighted channel's share (h, E, T, S, bm25); shares sum to 1, or are all 0
        spec = engine.index.metric_spec
        weighted = {c for c, w in spec["channels"].items() if w > 0} | ({"bm25"} if spec["bm25"] > 0 else set())
        shares = r["channel_shares"]
        assert set(shares) == weighted and all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in shares.values())
        assert sum(shares.values()) == pytest.approx(1.0, abs=1e-3) or sum(shares.values()) == 0.0
    assert any(sum(r["channel_shares"].values()) > 0 for r in results)


def test_default_k_is_ten(engine_api):
    body = engine_api.post("/api/v1/recommendations", json={"subject": "flame", "description": "burner ignition"}).get_json()
    assert len(body["results"]) == 10


def test_a_query_without_words_is_a_400(engine_api):
    assert "no words" in assert_json_error(
        engine_api.post("/api/v1/recommendations", json={"subject": "!!!", "description": "<b></b> ..."}), 400)


def test_a_rich_text_query_reads_as_its_text_when_it_says_it_is_html(engine_api):
    """A help desk that stores HTML posts its new ticket as stored: with "html": true it is answered (and keyed) as
    its text, as `ticketrec import` reads the knowledge base; without, the markup is the text sent."""
    plain = {"subject": "Valve seal leak & drift", "description": "Actuator pressure drops.\n\ngasket leaking"}
    rich = {"subject": "Valve seal leak &amp; drift", "html": True,
            "description": '<div style="color:red"><p>Actuator pressure drops.</p><p>gasket leaking</p></div>'}
    answers = [engine_api.post("/api/v1/recommendations", json=body).get_json() for body in (plain, rich)]
    assert answers[1]["query_key"] == answers[0]["query_key"] == query_key(plain["subject"], plain["description"])
    assert [r["ticket"]["id"] for r in answers[1]["results"]] == [r["ticket"]["id"] for r in answers[0]["results"]]
    as_sent = engine_api.post("/api/v1/recommendations", json=dict(rich, html=False)).get_json()
    assert as_sent["query_key"] == query_key(rich["subject"], rich["description"])


def test_api_feedback_records_the_served_versions(engine_api, web_engine):
    from recommender.data.store import Store

    settings, engine = web_engine
    payload = {"subject": "api feedback", "description": "records versions", "ticket_id": "WEB-2", "label": "REL"}
    body = engine_api.post("/api/v1/feedback", json=payload).get_json()
    assert (body["model_version"], body["index_version"]) == (engine.model.version, engine.index.version)
    with Store(settings.db) as store:
        [fb] = store.feedback(query_key("api feedback", "records versions"))
    assert (fb.ticket_id, fb.label, fb.model_version, fb.index_version) == (
        "WEB-2", "REL", engine.model.version, engine.index.version)


def test_healthz_with_a_model(engine_api, web_engine):
    _, engine = web_engine
    response = engine_api.get("/api/v1/healthz")
    assert response.status_code == 200
    body = response.get_json()
    assert body["status"] == "ok" and body["store"]["ok"] and body["store"]["tickets"] == 24
    index = body["index"]
    assert index["ok"] and index["version"] == engine.index.version and index["size"] == 24
    assert index["model_version"] == engine.model.version and isinstance(index["created"], float)
