"""The OpenAPI document of /api/v1 (web/openapi.py): valid, describing exactly the blueprint's routes, and true of
the real app — its limits are the ones enforced, and schemathesis checks what the app answers to requests it
generates from the document."""
import copy
import re

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from web.api import FEEDBACK_FIELDS, MAX_K, RECOMMENDATION_FIELDS, TICKET_PAGE_PARAMETERS
from web.openapi import openapi_document

SPEC = "/api/v1/openapi.json"
PREFIX = "/api/v1"
HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def schemathesis_config(unavailable_is_expected: bool = False) -> schemathesis.Config:
    """One fixed run (the same requests in CI and here) with the checks that hold for this API; 503 counts as a
    server error unless the app under test has no model (then it is the documented answer)."""
    served = ["2xx", "3xx", "4xx"] + (["503"] if unavailable_is_expected else [])
    return schemathesis.Config.from_dict({
        "seed": 14,
        "generation": {"mode": "all", "max-examples": 25, "deterministic": True, "database": "none"},
        "checks": {
            "enabled": False,
            "not_a_server_error": {"enabled": True, "expected-statuses": served},
            "status_code_conformance": {"enabled": True},
            "content_type_conformance": {"enabled": True},
            "response_schema_conformance": {"enabled": True},
            # a request the document calls invalid must be refused: 400, 413 for a description over the limit,
            # 404 for a ticket path the router cannot match (an empty id), 401 for one without the API token an
            # operation always requires (PUT and DELETE of a ticket)
            "negative_data_rejection": {"enabled": True, "expected-statuses": [400, 401, 404, 413]},
        },
    })


@pytest.fixture
def app(make_web_app):
    """The app over the 4-ticket `web_kb` store (descriptions up to 200 characters), no model."""
    return make_web_app()


def document(app) -> dict:
    response = app.test_client().get(SPEC)
    assert response.status_code == 200 and response.is_json
    return response.get_json()


# -- (a) a valid OpenAPI document ------------------------------------------------------------------------------
def test_the_served_document_is_valid_openapi(app):
    schema = schemathesis.openapi.from_wsgi(SPEC, app, config=schemathesis_config())
    schema.validate()  # against the OpenAPI 3.1 meta-schema; raises on an invalid document
    # schemathesis leaves out the endpoint the document was loaded from (GET /openapi.json)
    labels = {result.ok().label for result in schema.get_all_operations()}
    assert labels == {"POST /recommendations", "GET /tickets", "GET /tickets/{ticket_id}", "PUT /tickets/{ticket_id}",
                      "DELETE /tickets/{ticket_id}", "POST /reindex", "GET /reindex/{task_id}", "POST /feedback",
                      "GET /healthz"}


def test_the_validation_catches_a_broken_document(app):
    broken = copy.deepcopy(document(app))
    broken["paths"]["/healthz"]["get"]["responses"] = ["200"]
    with pytest.raises(Exception, match="responses"):
        schemathesis.openapi.from_dict(broken, config=schemathesis_config()).validate()


# -- (b) the document and the routes cannot drift apart -------------------------------------------------------
def api_routes(app) -> set[tuple[str, str]]:
    """(path as OpenAPI writes it, method) of every rule of the API blueprint, relative to /api/v1."""
    routes = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint.startswith("api."):
            assert rule.rule.startswith(PREFIX + "/"), rule.rule
            path = re.sub(r"<(?:[^:<>]+:)?([^:<>]+)>", r"{\1}", rule.rule.removeprefix(PREFIX))
            routes |= {(path, method.lower()) for method in rule.methods - {"HEAD", "OPTIONS"}}
    return routes


def test_every_route_is_described_and_every_described_path_exists(app):
    doc = document(app)
    assert doc["servers"] == [{"url": PREFIX}]
    described = {(path, method) for path, item in doc["paths"].items() for method in item if method in HTTP_METHODS}
    assert described == api_routes(app)
    assert ("/openapi.json", "get") in described
    for path, item in doc["paths"].items():  # every {name} in a path is a declared path parameter, and back
        for operation in item.values():
            declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert declared == set(re.findall(r"{([^}]+)}", path)), path


# -- the limits the document states are the ones the API enforces --------------------------------------------
def request_schema(doc: dict, name: str) -> dict:
    return doc["components"]["schemas"][name]["properties"]


def test_the_document_states_this_apps_description_limit(make_web_app):
    assert request_schema(document(make_web_app()), "FeedbackRequest")["description"]["maxLength"] == 200
    other = document(make_web_app(MAX_DESCRIPTION=50))
    assert request_schema(other, "RecommendationRequest")["description"]["maxLength"] == 50


@pytest.mark.parametrize("endpoint, schema_name, ok_status", [
    ("/recommendations", "RecommendationRequest", 503),  # accepted, then: no model to answer with
    ("/feedback", "FeedbackRequest", 201),
])
@pytest.mark.parametrize("field, refused_status", [("subject", 400), ("description", 413)])
def test_text_at_the_documented_limit_is_accepted_and_one_more_refused(app, endpoint, schema_name, ok_status, field,
                                                                       refused_status):
    limit = request_schema(document(app), schema_name)[field]["maxLength"]
    body = {"subject": "valve", "description": "sticks", **({"ticket_id": "WEB-3", "label": "NO"}
                                                           if endpoint == "/feedback" else {})}
    client = app.test_client()
    assert client.post(PREFIX + endpoint, json={**body, field: "v" * limit}).status_code == ok_status
    for too_long in ["v" * (limit + 1), "v" * limit + " "]:  # counted as sent, before stripping
        response = client.post(PREFIX + endpoint, json={**body, field: too_long})
        assert response.status_code == refused_status and "limit" in response.get_json()["error"]["message"]


def test_k_and_label_are_what_the_document_says(app):
    doc = document(app)
    k = request_schema(doc, "RecommendationRequest")["k"]
    client = app.test_client()
    for value, status in [(k["minimum"], 503), (k["maximum"], 503), (k["minimum"] - 1, 400), (k["maximum"] + 1, 400)]:
        assert client.post(PREFIX + "/recommendations", json={"subject": "s", "k": value}).status_code == status, value
    body = {"subject": "valve", "ticket_id": "WEB-3"}
    for label in doc["components"]["schemas"]["Label"]["enum"]:
        assert client.post(PREFIX + "/feedback", json={**body, "label": label}).status_code == 201, label
    assert client.post(PREFIX + "/feedback", json={**body, "label": "MAYBE"}).status_code == 400


def test_the_request_fields_are_the_documented_ones_and_no_others(app, web_kb):
    """A field the document does not name is refused with a 400 naming it: a misspelt "descripton" would
    otherwise be a query without its description, answered as if nothing were wrong; nothing is stored."""
    doc = document(app)
    client = app.test_client()
    for schema_name, path, body in [
            ("RecommendationRequest", "/recommendations", {"subject": "valve"}),
            ("FeedbackRequest", "/feedback", {"subject": "valve", "ticket_id": "WEB-3", "label": "YES"})]:
        schema = doc["components"]["schemas"][schema_name]
        assert schema["additionalProperties"] is False
        fields = set(request_schema(doc, schema_name))
        assert fields == set(RECOMMENDATION_FIELDS if path == "/recommendations" else FEEDBACK_FIELDS)
        response = client.post(PREFIX + path, json={**body, "descripton": "at partial load"})
        assert response.status_code == 400, path
        message = response.get_json()["error"]["message"]
        assert "unknown field 'descripton'" in message and all(name in message for name in fields)
    assert web_kb[1].feedback() == []


def test_the_ticket_list_takes_the_documented_query_parameters_and_no_others(app):
    doc = document(app)
    parameters = doc["paths"]["/tickets"]["get"]["parameters"]
    assert [p["name"] for p in parameters if p["in"] == "query"] == list(TICKET_PAGE_PARAMETERS)
    response = app.test_client().get(f"{PREFIX}/tickets", query_string={"limit": 5, "page": 2})
    assert response.status_code == 400 and "unknown query parameter 'page'" in response.get_json()["error"]["message"]


def test_ticket_ids_over_the_documented_limit_are_refused(app):
    doc = document(app)
    [parameter] = doc["paths"]["/tickets/{ticket_id}"]["get"]["parameters"]
    limit = parameter["schema"]["maxLength"]
    assert request_schema(doc, "FeedbackRequest")["ticket_id"]["maxLength"] == limit
    client = app.test_client()
    assert client.get(f"{PREFIX}/tickets/{'t' * limit}").status_code == 404  # a valid id, no such ticket
    assert client.get(f"{PREFIX}/tickets/{'t' * (limit + 1)}").status_code == 400
    body = {"subject": "valve", "label": "NO"}
    assert client.post(PREFIX + "/feedback", json={**body, "ticket_id": "t" * limit}).status_code == 404
    assert client.post(PREFIX + "/feedback", json={**body, "ticket_id": "t" * (limit + 1)}).status_code == 400


def test_a_blank_subject_is_refused_as_the_document_says(app):
    pattern = re.compile(request_schema(document(app), "RecommendationRequest")["subject"]["pattern"])
    client = app.test_client()
    for subject in [" ", "\t\n", "\u3000", "\x1c", "\x85 "]:
        assert not pattern.search(subject), repr(subject)
        assert client.post(PREFIX + "/recommendations", json={"subject": subject}).status_code == 400, repr(subject)
    assert pattern.search(" \ufeff ")  # U+FEFF is no whitespace to str.strip(): not a blank subject


# -- (c) schemathesis: requests generated from the document against the real app, in process -----------------
# The document of an app whose descriptions may have 200 characters (both apps below are configured so), loaded at
# import: schemathesis' fixture-based loader (`schemathesis.pytest.from_fixture`) fails under pytest 9, so each
# call names the app under test instead. Writes (feedback) go to the throwaway store of that app.
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
without_model = schemathesis.openapi.from_dict(openapi_document(200, MAX_K), config=schemathesis_config(True))
with_model = schemathesis.openapi.from_dict(openapi_document(200, MAX_K), config=schemathesis_config())


@pytest.fixture
def model_app(engine_app):
    """The app over a real tiny engine; its store is a throwaway copy of the engine's."""
    return engine_app(MAX_DESCRIPTION=200)


def tickets_token(app) -> dict:
    """Headers with an API token of scope tickets, made in `app`'s store, which may then do everything the document
    describes: generated requests reach the validation of every operation, PUT and DELETE too, instead of a 401."""
    from recommender.data.store import Store

    with Store(app.config["TICKETREC_SETTINGS"].db) as store:
        store.add_user("fuzz", "fuzzing password")
        return {"Authorization": f"Bearer {store.create_token('fuzz', 'tickets')[1]}"}


@pytest.fixture
def app_token(app):
    return tickets_token(app)


@pytest.fixture
def model_app_token(model_app):
    return tickets_token(model_app)


def test_the_fuzzed_apps_serve_the_fuzzed_document(app, model_app):
    assert document(app) == document(model_app) == openapi_document(200, MAX_K)


@without_model.parametrize()
@SETTINGS
def test_without_a_model_the_api_answers_as_documented(case, app, app_token):
    case.call_and_validate(app=app, headers=app_token)


@with_model.parametrize()
@SETTINGS
def test_with_a_model_the_api_answers_as_documented(case, model_app, model_app_token):
    case.call_and_validate(app=model_app, headers=model_app_token)


@pytest.mark.parametrize("path, method, request_parts, status", [
    ("/tickets/{ticket_id}", "GET", {"path_parameters": {"ticket_id": "WEB-HTML"}}, 200),
    ("/feedback", "POST", {"body": {"subject": "valve seal", "description": "leaks", "ticket_id": "WEB-3",
                                    "label": "REL"}}, 201),
    ("/recommendations", "POST", {"body": {"subject": "valve seal leak", "description": None, "k": 100}}, 200),
    ("/healthz", "GET", {}, 200),
    ("/tickets/{ticket_id}", "PUT", {"path_parameters": {"ticket_id": "WEB-NEW"},
                                     "body": {"subject": "Seal leak", "metadata": {"area": "valve"}}}, 201),
    ("/tickets/{ticket_id}", "PUT", {"path_parameters": {"ticket_id": "WEB-1"}, "body": {"subject": "Seal leak"}}, 200),
    ("/tickets/{ticket_id}", "DELETE", {"path_parameters": {"ticket_id": "WEB-HTML"}}, 200),
])
def test_answers_random_requests_rarely_reach_are_as_documented(model_app, model_app_token, path, method,
                                                                request_parts, status):
    """Known tickets are needles in the haystack of generated ids: these answers are checked on purpose."""
    response = with_model[path][method].Case(**request_parts).call_and_validate(app=model_app, headers=model_app_token)
    assert response.status_code == status
