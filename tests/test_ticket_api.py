"""A help desk's integration keeps the knowledge base current over the API: PUT /api/v1/tickets/ID adds or replaces a
ticket as an import would write it, DELETE removes it; only an API token of scope `tickets` may, never a session, and
never without accounts. The store is real, and so are the index, the reindex and the engine that serves the change."""
import sqlite3
from contextlib import closing

import pytest
from click.testing import CliRunner

from recommender.cli import main
from recommender.data.migrations import MIGRATIONS, statements
from recommender.data.records import Ticket
from recommender.data.store import Feedback, Store

PASSWORD = "correct horse battery"
NEW = {"subject": "Gearbox whine at full speed", "description": "High-pitched whine from the gearbox above 90 %.",
       "solution": "Replaced the worn pinion.", "metadata": {"status": "RESOLVED", "priority": 2, "tags": ["gear"]}}


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def error_of(response, status: int) -> str:
    assert response.status_code == status, response.get_data(as_text=True)
    body = response.get_json()
    assert body["error"]["status"] == status
    return body["error"]["message"]


@pytest.fixture
def tokens(web_kb):
    """API tokens of each scope for the user alice (an account exists)."""
    _, store = web_kb
    store.add_user("alice", PASSWORD)
    return {scope: store.create_token("alice", scope)[1] for scope in ("read", "write", "tickets")}


@pytest.fixture
def api(make_web_app):
    return make_web_app(WTF_CSRF_ENABLED=True).test_client()


def stored(store: Store, ticket_id: str) -> tuple | None:
    row = store.conn.execute("SELECT subject, description, solution, metadata, source, updated_at FROM tickets "
                             "WHERE id = ?", (ticket_id,)).fetchone()
    return None if row is None else tuple(row)


# -- writing ------------------------------------------------------------------------------------------------------
def test_put_adds_then_replaces_then_leaves_an_unchanged_ticket_as_it_was(api, web_kb, tokens):
    _, store = web_kb
    created = api.put("/api/v1/tickets/GB-7", json=NEW, headers=bearer(tokens["tickets"]))
    assert created.status_code == 201, created.get_data(as_text=True)
    assert created.headers["Location"].endswith("/api/v1/tickets/GB-7")
    body = created.get_json()
    assert body["result"] == "created" and body["cut"] == [] and body["indexed"] is None  # no index served here
    assert body["ticket"] == {"id": "GB-7", **NEW}
    assert api.get("/api/v1/tickets/GB-7", headers=bearer(tokens["read"])).get_json() == {"id": "GB-7", **NEW}
    first = stored(store, "GB-7")
    assert first[4] == "api:alice"  # where it came from, as an import records its file

    again = api.put("/api/v1/tickets/GB-7", json=NEW, headers=bearer(tokens["tickets"]))
    assert again.status_code == 200 and again.get_json()["result"] == "unchanged"
    assert stored(store, "GB-7") == first  # not even its update time moved: no reindex re-encodes it

    changed = {**NEW, "solution": "Replaced the pinion and the bearing.", "metadata": {"status": "CLOSED"}}
    replaced = api.put("/api/v1/tickets/GB-7", json=changed, headers=bearer(tokens["tickets"]))
    assert replaced.status_code == 200 and replaced.get_json()["result"] == "replaced"
    assert store.get_ticket("GB-7") == Ticket("GB-7", NEW["subject"], NEW["description"],
                                              "Replaced the pinion and the bearing.", {"status": "CLOSED"})
    assert stored(store, "GB-7")[5] >= first[5]
    assert store.stats()["tickets"] == 5


def test_a_ticket_read_from_the_api_can_be_sent_back_whole(api, web_kb, tokens):
    got = api.get("/api/v1/tickets/WEB-2", headers=bearer(tokens["read"])).get_json()
    back = api.put("/api/v1/tickets/WEB-2", json=got, headers=bearer(tokens["tickets"]))
    assert back.status_code == 200 and back.get_json()["result"] == "unchanged"
    other = api.put("/api/v1/tickets/WEB-2", json={**got, "id": "WEB-1"}, headers=bearer(tokens["tickets"]))
    assert "'id'" in error_of(other, 400)
    assert web_kb[1].get_ticket("WEB-1").subject == "Compressor trips on high vibration"


def test_a_ticket_is_read_as_an_import_reads_it(api, web_kb, tokens):
    """Subject alone, list fields joined, HTML read as text when asked, long fields cut (and said), empty metadata
    values left out: what `ticketrec import` would store for the same record."""
    _, store = web_kb
    settings = web_kb[0]
    sent = {"subject": "<b>Relief</b> valve chatter", "description": ["first note", "second note"],
            "solution": "x" * (settings.max_field_chars + 5), "metadata": {"status": "OPEN", "owner": None, "area": ""},
            "html": True}
    response = api.put("/api/v1/tickets/RV-1", json=sent, headers=bearer(tokens["tickets"]))
    assert response.status_code == 201
    assert response.get_json()["cut"] == ["solution"]
    assert store.get_ticket("RV-1") == Ticket("RV-1", "Relief valve chatter", "first note\n\nsecond note",
                                              "x" * settings.max_field_chars, {"status": "OPEN"})
    alone = api.put("/api/v1/tickets/RV-2", json={"subject": "Subject only"}, headers=bearer(tokens["tickets"]))
    assert alone.status_code == 201 and store.get_ticket("RV-2").description == ""


@pytest.mark.parametrize("payload, says", [
    ({"description": "no subject field"}, "'subject'"),
    ({"subject": "", "description": "  "}, "neither subject nor description"),
    ({"subject": 3}, "must be a string"),
    ({"subject": "s", "solution": {"text": "x"}}, "'solution'"),
    ({"subject": "s", "summary": "typo of a field"}, "unknown field 'summary'"),
    ({"subject": "s", "metadata": ["RESOLVED"]}, "JSON object"),
    ({"subject": "s", "metadata": {"status": {"name": "RESOLVED"}}}, "metadata field 'status'"),
    ({"subject": "s", "metadata": {f"f{i}": i for i in range(101)}}, "at most 100"),
    ({"subject": "s", "html": "yes"}, "'html'"),
])
def test_a_bad_ticket_is_refused_and_nothing_is_written(api, web_kb, tokens, payload, says):
    _, store = web_kb
    before = store.stats()
    assert says in error_of(api.put("/api/v1/tickets/WEB-1", json=payload, headers=bearer(tokens["tickets"])), 400)
    assert store.get_ticket("WEB-1").subject == "Compressor trips on high vibration" and store.stats() == before


def test_bad_ids_and_bodies_are_refused(api, web_kb, tokens):
    headers = bearer(tokens["tickets"])
    assert "white space" in error_of(api.put("/api/v1/tickets/%20GB-1", json=NEW, headers=headers), 400)
    assert "at most" in error_of(api.put("/api/v1/tickets/" + "x" * 201, json=NEW, headers=headers), 400)
    assert "Content-Type" in error_of(api.put("/api/v1/tickets/GB-1", data="subject=s", headers=headers), 400)
    assert "JSON object" in error_of(api.put("/api/v1/tickets/GB-1", json=["s"], headers=headers), 400)
    assert web_kb[1].get_ticket("GB-1") is None


def test_delete_removes_the_ticket_with_its_pairs_and_feedback(api, web_kb, tokens):
    _, store = web_kb
    store.add_feedback(Feedback("valve", "sticks", "WEB-3", "YES"))
    response = api.delete("/api/v1/tickets/WEB-3", headers=bearer(tokens["tickets"]))
    assert response.status_code == 200
    assert response.get_json() == {"id": "WEB-3", "removed": {"tickets": 1, "pairs": 0, "feedback": 1}}
    assert store.get_ticket("WEB-3") is None and store.feedback() == []
    assert "WEB-3" in error_of(api.delete("/api/v1/tickets/WEB-3", headers=bearer(tokens["tickets"])), 404)
    assert store.stats()["tickets"] == 3


# -- who may ------------------------------------------------------------------------------------------------------
def test_only_a_tickets_token_may_change_the_knowledge_base(api, web_kb, tokens):
    _, store = web_kb
    before = [store.get_ticket(t) for t in ("WEB-1", "WEB-2")]
    assert "--tickets" in error_of(api.put("/api/v1/tickets/WEB-1", json=NEW), 401)
    for scope in ("read", "write"):
        assert "--tickets" in error_of(api.put("/api/v1/tickets/WEB-1", json=NEW, headers=bearer(tokens[scope])), 403)
        assert "--tickets" in error_of(api.delete("/api/v1/tickets/WEB-2", headers=bearer(tokens[scope])), 403)
    assert error_of(api.delete("/api/v1/tickets/WEB-2", headers=bearer("trk_not-a-token")), 401)
    store.revoke_token(next(t.id for t in store.tokens() if t.scope == "tickets"))
    assert error_of(api.delete("/api/v1/tickets/WEB-2", headers=bearer(tokens["tickets"])), 401)
    assert [store.get_ticket(t) for t in ("WEB-1", "WEB-2")] == before


def test_a_tickets_token_may_also_read_and_give_feedback(api, web_kb, tokens):
    headers = bearer(tokens["tickets"])
    assert api.get("/api/v1/tickets/WEB-1", headers=headers).status_code == 200
    feedback = {"subject": "valve sticks", "description": "", "ticket_id": "WEB-3", "label": "YES"}
    assert api.post("/api/v1/feedback", json=feedback, headers=headers).status_code == 201


def test_without_accounts_nobody_may_change_tickets_though_the_rest_is_open(api, web_kb):
    assert "ticketrec user add" in error_of(api.put("/api/v1/tickets/WEB-1", json=NEW), 401)
    assert "ticketrec user add" in error_of(api.delete("/api/v1/tickets/WEB-1"), 401)
    assert api.get("/api/v1/tickets/WEB-1").status_code == 200  # open, as before accounts existed
    assert web_kb[1].get_ticket("WEB-1").subject == "Compressor trips on high vibration"


def test_a_signed_in_session_may_not_change_tickets(make_web_app, web_kb, tokens):
    import re

    client = make_web_app(WTF_CSRF_ENABLED=True).test_client()
    page = client.get("/login").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', page).group(1)
    client.post("/login", data={"csrf_token": csrf, "name": "alice", "password": PASSWORD, "next": ""})
    assert client.get("/api/v1/tickets/WEB-1").status_code == 200  # the session reads the API
    assert "signed-in session" in error_of(client.put("/api/v1/tickets/WEB-1", json=NEW), 403)
    assert "signed-in session" in error_of(client.delete("/api/v1/tickets/WEB-1"), 403)
    assert web_kb[1].get_ticket("WEB-1") is not None


def test_the_cli_makes_a_tickets_token(web_kb, monkeypatch):
    settings, store = web_kb
    monkeypatch.setenv("TICKETREC_HOME", str(settings.home))
    monkeypatch.delenv("TICKETREC_DB", raising=False)
    store.add_user("bot", PASSWORD)
    runner = CliRunner()
    made = runner.invoke(main, ["token", "create", "bot", "--tickets"])
    assert made.exit_code == 0, made.output
    assert store.token_owner(made.stdout.strip()) == ("bot", "tickets")
    assert "tickets" in runner.invoke(main, ["token", "list"]).output
    both = runner.invoke(main, ["token", "create", "bot", "--tickets", "--read-only"])
    assert both.exit_code == 2 and "contradict" in both.output


def test_a_version_2_database_keeps_its_tokens_and_their_ids_and_accepts_the_new_scope(tmp_path):
    path = tmp_path / "v2.sqlite3"
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        for migration in MIGRATIONS[:2]:
            for statement in statements(migration):
                conn.execute(statement)
        conn.execute("PRAGMA user_version = 2")
        conn.execute("INSERT INTO users VALUES ('alice', 'hash', 1.0)")
        for n, scope in enumerate(("read", "write", "write")):
            conn.execute("INSERT INTO api_tokens (user_name, token_sha256, scope, created_at) VALUES (?, ?, ?, 2.0)",
                         ("alice", f"sha{n}", scope))
        conn.execute("DELETE FROM api_tokens WHERE id = 3")  # the newest token gone: its id is never given again
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("INSERT INTO api_tokens (user_name, token_sha256, scope, created_at) "
                         "VALUES ('alice', 'x', 'tickets', 2.0)")
    with Store(path) as store:
        assert store.schema_version == len(MIGRATIONS) >= 3
        assert [(t.id, t.scope) for t in store.tokens()] == [(1, "read"), (2, "write")]
        record, _ = store.create_token("alice", "tickets")
        assert (record.id, record.scope) == (4, "tickets")
        store.remove_user("alice")  # the foreign key still cascades
        assert store.tokens() == []


# -- listing: an integration pages through the ids ticketrec holds, to compare them with its own ------------------
def test_the_ticket_list_pages_through_every_id_with_its_update_time(api, web_kb, tokens):
    _, store = web_kb
    headers = bearer(tokens["read"])
    assert api.put("/api/v1/tickets/WEB-0%2Fa", json=NEW, headers=bearer(tokens["tickets"])).status_code == 201
    seen, after, pages = [], "", 0
    while after is not None:
        response = api.get("/api/v1/tickets", query_string={"after": after, "limit": 2}, headers=headers)
        assert response.status_code == 200, response.get_data(as_text=True)
        body = response.get_json()
        assert 1 <= len(body["tickets"]) <= 2
        seen += body["tickets"]
        after, pages = body["next"], pages + 1
    ids = sorted(store.ticket_ids())
    assert [t["id"] for t in seen] == ids and pages == (len(ids) + 1) // 2
    assert {t["id"]: t["updated_at"] for t in seen} == {i: store.ticket_updated_at(i) for i in ids}
    every = api.get("/api/v1/tickets", headers=headers).get_json()  # default: 100 a page
    assert [t["id"] for t in every["tickets"]] == ids and every["next"] is None
    assert api.get("/api/v1/tickets", query_string={"after": ids[-1]}, headers=headers).get_json() == {
        "tickets": [], "next": None}


@pytest.mark.parametrize("query, says", [
    ({"limit": 0}, "'limit' must be a whole number from 1 to 1,000"),
    ({"limit": 1001}, "'limit' must be a whole number from 1 to 1,000"),
    ({"limit": "ten"}, "'limit' must be a whole number"),
    ({"limit": "1_0"}, "'limit' must be a whole number"),
    ({"limit": "9" * 5000}, "'limit' must be a whole number"),
    ({"after": "x" * 1000}, "a ticket id has at most"),
    ({"limt": 500}, "unknown query parameter 'limt'; the parameters are after, limit"),  # not the default page
])
def test_a_bad_page_is_refused(api, web_kb, tokens, query, says):
    assert says in error_of(api.get("/api/v1/tickets", query_string=query, headers=bearer(tokens["read"])), 400)


def test_the_ticket_list_needs_what_reading_needs(api, web_kb, tokens):
    assert api.get("/api/v1/tickets").status_code == 401  # an account exists and reading is not open
    assert api.get("/api/v1/tickets", headers=bearer(tokens["read"])).status_code == 200


# -- served: the engine sees a removal at once and a new ticket after the reindex -----------------------------------
class Served:
    """A home whose tiny knowledge base is indexed and served by a real app (every ticket scored), a tickets token of
    the user bot, and `twin`: a ticket whose text a new ticket may copy, so that a query of that text finds both."""

    def __init__(self, settings, store, tiny_ticket_model):
        from recommender.serving.index_build import build_index
        from web import create_app

        self.settings, self.store = settings.replace(candidates=0), store
        build_index(store, tiny_ticket_model, self.settings, progress=False)
        store.add_user("bot", PASSWORD)
        self.headers = bearer(store.create_token("bot", "tickets")[1])
        self.api = create_app({"TESTING": True, "TICKETREC_SETTINGS": self.settings,
                               "TICKETREC_REPORT_ROOTS": []}).test_client()
        self.twin = store.get_tickets([store.ticket_ids()[0]])[0]
        self.copy = {"subject": self.twin.subject, "description": self.twin.description,
                     "solution": "The new solution."}

    def ids(self) -> list[str]:
        """The ids the app serves, best first, for a query of the twin's text."""
        query = {"subject": self.twin.subject, "description": self.twin.description, "k": 100}
        response = self.api.post("/api/v1/recommendations", json=query, headers=self.headers)
        assert response.status_code == 200, response.get_data(as_text=True)
        return [r["ticket"]["id"] for r in response.get_json()["results"]]


@pytest.fixture
def served(kb_home, tiny_ticket_model) -> Served:
    return Served(*kb_home, tiny_ticket_model)


def test_a_put_ticket_is_served_after_the_reindex_and_a_deleted_one_at_once(served, tiny_ticket_model):
    from recommender.serving.reindex import reindex

    api, headers, sent = served.api, served.headers, served.copy
    assert served.twin.id in served.ids() and "NEW-1" not in served.ids()
    put = api.put("/api/v1/tickets/NEW-1", json=sent, headers=headers)
    assert put.status_code == 201 and put.get_json()["indexed"] is False
    assert "NEW-1" not in served.ids()  # not in the served index until the reindex

    reindex(served.settings, served.store, tiny_ticket_model)
    assert api.put("/api/v1/tickets/NEW-1", json=sent, headers=headers).get_json() == {
        "id": "NEW-1", "result": "unchanged", "cut": [], "indexed": True,
        "ticket": {"id": "NEW-1", **sent, "metadata": {}}}
    assert "NEW-1" in served.ids()[:2]  # the same text as the query's twin: among the best two

    assert api.delete(f"/api/v1/tickets/{served.twin.id}", headers=headers).status_code == 200
    assert served.twin.id not in served.ids()  # at once, before any reindex
    assert "NEW-1" in served.ids()[:1]


# -- POST /api/v1/reindex: the integration brings its changes into the index without waiting for the nightly one ----
def test_a_put_ticket_is_served_after_a_reindex_asked_over_the_api(served):
    from recommender.serving.index import current_version
    from recommender.serving.index_build import _build_lock

    api, headers, settings = served.api, served.headers, served.settings
    before = current_version(settings)
    assert api.put("/api/v1/tickets/NEW-1", json=served.copy, headers=headers).status_code == 201
    assert "NEW-1" not in served.ids()

    response = api.post("/api/v1/reindex", headers=headers)  # no broker: built in this process
    assert response.status_code == 200, response.get_data(as_text=True)
    body = response.get_json()
    assert body["state"] == "done" and body["result"]["version"] == current_version(settings) != before
    assert body["result"]["encoded"] == 1 and body["result"]["n_tickets"] == len(served.store.ticket_ids())
    assert body["result"]["built"] is True
    assert set(body["result"]) == {"version", "n_tickets", "encoded", "reused", "dtype", "model_version", "seconds",
                                   "built"}
    assert "NEW-1" in served.ids()[:2]  # the same text as the query's twin: among the best two
    assert api.put("/api/v1/tickets/NEW-1", json=served.copy, headers=headers).get_json()["indexed"] is True

    again = api.post("/api/v1/reindex", headers=headers).get_json()  # nothing changed: the version that serves
    assert again["result"]["version"] == body["result"]["version"] and again["result"]["built"] is False

    with _build_lock(settings.indexes_dir):  # a nightly reindex holds the build lock
        assert "another index build is running" in error_of(api.post("/api/v1/reindex", headers=headers), 409)
    assert current_version(settings) == body["result"]["version"]

    task = "0b7e7c1e-7d4f-4a8e-9c3a-2f1d5e6a7b8c"  # no broker: nothing is ever queued to follow
    assert "builds in this process" in error_of(api.get(f"/api/v1/reindex/{task}", headers=headers), 404)
    assert "is the UUID" in error_of(api.get("/api/v1/reindex/not-a-task", headers=headers), 404)


def test_only_a_tickets_token_may_reindex(api, web_kb, tokens):
    assert api.post("/api/v1/reindex").status_code == 401
    for scope in ("read", "write"):
        assert "may not change the knowledge base" in error_of(
            api.post("/api/v1/reindex", headers=bearer(tokens[scope])), 403)
    # with the right token: refused only because this home has no model to build an index with
    assert api.post("/api/v1/reindex", headers=bearer(tokens["tickets"])).status_code == 503


def test_a_reindex_with_the_broker_down_says_so_and_changes_nothing(served):
    from conftest import free_port
    from recommender.serving.index import current_version
    from web import create_app

    before = current_version(served.settings)
    dead = served.settings.replace(broker_url=f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    api = create_app({"TESTING": True, "TICKETREC_SETTINGS": dead, "TICKETREC_REPORT_ROOTS": []}).test_client()
    assert "is Redis running?" in error_of(api.post("/api/v1/reindex", headers=served.headers), 503)
    task = "0b7e7c1e-7d4f-4a8e-9c3a-2f1d5e6a7b8c"
    assert "cannot read the reindex task's state" in error_of(api.get(f"/api/v1/reindex/{task}",
                                                                      headers=served.headers), 503)
    assert current_version(served.settings) == before
