"""Who may do what (issue 14): accounts and API tokens in the store, the CLI that manages them, sign-in and out with
the real Flask app (CSRF on), the 401/403 of the JSON API, TICKETREC_AUTH_READ, the shared secret key file, the
session cookie, server paths on the status page and whose recent queries a page shows."""
import json
import re
import sqlite3
import stat
import threading
from contextlib import closing
from urllib.parse import parse_qs, urlsplit

import pytest
from click.testing import CliRunner

from recommender.cli import main
from recommender.data.store import Store, query_key, token_sha256
from web import create_app
from web.auth import SECRET_KEY_FILE, read_or_create_secret

PASSWORD = "correct horse battery"
FEEDBACK = {"subject": "valve sticks", "description": "at 40% load", "ticket_id": "WEB-3", "label": "REL"}


def page(response) -> str:
    return response.get_data(as_text=True)


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', html).group(1)


def sign_in(client, name: str = "alice", password: str = PASSWORD, next_: str = ""):
    token = csrf_of(page(client.get("/login")))
    return client.post("/login", data={"csrf_token": token, "name": name, "password": password, "next": next_})


def search(client, subject: str):
    """Submit the search form as a browser does (CSRF token of the page first)."""
    token = csrf_of(page(client.get("/")))
    response = client.post("/", data={"csrf_token": token, "subject": subject, "description": ""})
    assert response.status_code == 200
    return response


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def cli(web_kb, monkeypatch):
    """Run `ticketrec ARGS` on the `web_kb` home; returns the click Result."""
    monkeypatch.setenv("TICKETREC_HOME", str(web_kb[0].home))
    monkeypatch.delenv("TICKETREC_DB", raising=False)
    runner = CliRunner()
    return lambda *args, input=None: runner.invoke(main, list(args), input=input)


@pytest.fixture
def csrf_app(make_web_app):
    """The app over `web_kb` with CSRF checks on, as served."""
    return make_web_app(WTF_CSRF_ENABLED=True)


# -- the CLI ----------------------------------------------------------------------------------------------------------
def test_user_add_list_remove_through_the_cli(cli, web_kb):
    _, store = web_kb
    assert "no users" in cli("user", "list").output
    added = cli("user", "add", "alice", "--password-stdin", input=PASSWORD + "\n")
    assert added.exit_code == 0, added.output
    assert "user alice added" in added.output and "first account" in added.output
    assert store.check_password("alice", PASSWORD) and not store.check_password("alice", PASSWORD + "!")
    stored = store.conn.execute("SELECT password_hash FROM users WHERE name = 'alice'").fetchone()[0]
    assert stored.startswith("scrypt:") and PASSWORD not in stored
    assert cli("user", "add", "bob", "--password-stdin", input="another password\n").exit_code == 0
    listed = cli("user", "list", "--json")
    assert [u["name"] for u in json.loads(listed.output)] == ["alice", "bob"]
    assert re.search(r"^alice\s+created .* 0 API token", cli("user", "list").output, flags=re.M)
    removed = cli("user", "remove", "bob")
    assert removed.exit_code == 0 and "user bob removed" in removed.output
    assert [u.name for u in store.users()] == ["alice"]
    gone = cli("user", "remove", "bob")
    assert gone.exit_code == 1 and "there is no user 'bob'" in gone.output and "Traceback" not in gone.output


@pytest.mark.parametrize("args, stdin, message", [
    (["user", "add", "bob"], None, "pass it on standard input with --password-stdin"),  # no terminal: no prompt
    (["user", "add", "bob", "--password-stdin"], "", "read no password"),
    (["user", "add", "bob", "--password-stdin"], "short\n", "at least 8 characters"),
    (["user", "add", "no spaces", "--password-stdin"], PASSWORD + "\n", "not a valid user name"),
    (["user", "add", "alice", "--password-stdin"], PASSWORD + "\n", "already a user 'alice'"),
    (["token", "create", "nobody"], None, "there is no user 'nobody'"),
])
def test_cli_refusals_are_one_line_and_never_wait(cli, web_kb, args, stdin, message):
    web_kb[1].add_user("alice", PASSWORD)
    result = cli(*args, input=stdin)
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output
    assert [u.name for u in web_kb[1].users()] == ["alice"]


def test_a_token_is_printed_once_and_only_its_hash_is_stored(cli, web_kb):
    _, store = web_kb
    store.add_user("alice", PASSWORD)
    created = cli("token", "create", "alice")
    token = created.stdout.strip()
    assert created.exit_code == 0 and token.startswith("trk_") and len(token) > 40
    assert "shown only now" in created.stderr
    assert [tuple(r) for r in store.conn.execute("SELECT token_sha256 FROM api_tokens")] == [(token_sha256(token),)]
    listed = cli("token", "list").output
    assert token not in listed and re.search(r"^\s+1\s+alice\s+write .* live$", listed, flags=re.M)
    assert store.token_owner(token) == ("alice", "write")
    assert cli("token", "revoke", "1").exit_code == 0
    assert store.token_owner(token) is None and "revoked" in cli("token", "list").output
    again = cli("token", "revoke", "1")
    assert again.exit_code == 1 and "already revoked" in again.output


def test_a_version_1_database_gains_accounts_and_its_feedback_an_empty_user(tmp_path):
    from recommender.data.migrations import MIGRATIONS, statements

    path = tmp_path / "v1.sqlite3"
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        for statement in statements(MIGRATIONS[0]):
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")
        conn.execute("INSERT INTO tickets (id, subject, description, updated_at) VALUES ('T1', 's', 'd', 1.0)")
        conn.execute("INSERT INTO feedback (query_key, query_subject, query_description, ticket_id, label, score, "
                     "created_at) VALUES ('k', 'leak', 'pump', 'T1', 'YES', 5.0, 2.0)")
    with Store(path) as store:
        assert store.schema_version == len(MIGRATIONS) >= 2 and not store.has_users()
        assert [(fb.ticket_id, fb.user_name) for fb in store.feedback()] == [("T1", "")]
        store.add_user("alice", PASSWORD)
        assert store.has_users() and [u.name for u in store.users()] == ["alice"]


# -- with no account, the app is open as before ------------------------------------------------------------------------
def test_with_no_account_everything_is_open_and_feedback_has_no_name(make_web_app, web_kb):
    client = make_web_app().test_client()
    assert client.get("/api/v1/tickets/WEB-1").status_code == 200
    assert client.post("/api/v1/recommendations", json={"subject": "valve"}).status_code == 503  # no model, no 401
    assert client.post("/api/v1/feedback", json=FEEDBACK).status_code == 201
    for path in ("/", "/status", "/topics", "/tickets/WEB-1"):
        assert client.get(path).status_code in (200, 503), path
    assert "Sign in" not in page(client.get("/"))
    [fb] = web_kb[1].feedback()
    assert fb.user_name == ""


# -- once an account exists ----------------------------------------------------------------------------------------------
def test_without_credentials_the_api_answers_401_and_the_pages_send_to_the_login(make_web_app, web_kb):
    _, store = web_kb
    store.add_user("alice", PASSWORD)
    client = make_web_app().test_client()
    for method, path, body in [("post", "/api/v1/feedback", FEEDBACK), ("get", "/api/v1/tickets/WEB-1", None),
                               ("post", "/api/v1/recommendations", {"subject": "valve"})]:
        response = getattr(client, method)(path, json=body)
        assert response.status_code == 401, path
        assert re.fullmatch(r'Bearer realm="?ticketrec"?', response.headers["WWW-Authenticate"])
        assert "Authorization: Bearer" in response.get_json()["error"]["message"]
    assert client.get("/api/v1/healthz").status_code == 503 and client.get("/api/v1/openapi.json").status_code == 200
    for path in ("/", "/status", "/topics", "/tickets/WEB-1"):
        response = client.get(path)
        assert response.status_code == 302 and urlsplit(response.location).path == "/login", path
        assert parse_qs(urlsplit(response.location).query)["next"] == [path]
    response = client.post("/feedback", data={"subject": "valve", "description": "", "choice": "YES WEB-1"})
    assert response.status_code == 302 and urlsplit(response.location).path == "/login"
    assert "Sign in to give feedback" in page(client.get(response.location))
    assert store.feedback() == []


def test_sign_in_and_out_through_the_form_with_csrf(csrf_app, web_kb):
    _, store = web_kb
    store.add_user("alice", PASSWORD)
    client = csrf_app.test_client()
    html = page(client.get("/login?next=/tickets/WEB-2"))
    assert re.search(r'<input [^>]*name="password"[^>]*type="password"', html) and 'value="/tickets/WEB-2"' in html
    refused = client.post("/login", data={"name": "alice", "password": PASSWORD})  # no CSRF token
    assert refused.status_code == 400 and client.get("/").status_code == 302
    wrong = sign_in(client, password="wrong password")
    assert wrong.status_code == 401 and "Unknown user name or wrong password" in page(wrong)
    assert sign_in(client, name="mallory").status_code == 401
    assert client.get("/").status_code == 302

    signed_in = sign_in(client, next_="/tickets/WEB-2")
    assert signed_in.status_code == 302 and signed_in.location == "/tickets/WEB-2"
    html = page(client.get("/"))
    assert '<span id="signed-in-as">alice</span>' in html
    response = client.post("/feedback", data={"csrf_token": csrf_of(html), "subject": "valve sticks",
                                              "description": "", "choice": "NO WEB-3"})
    assert "Saved: ticket WEB-3 marked NO" in page(response)
    [fb] = store.feedback(query_key("valve sticks", ""))
    assert (fb.ticket_id, fb.label, fb.user_name) == ("WEB-3", "NO", "alice")
    assert client.post("/api/v1/feedback", json=FEEDBACK).status_code == 201  # the page's script: the session counts
    assert store.feedback()[-1].user_name == "alice"

    assert client.post("/logout").status_code == 400  # CSRF-protected
    out = client.post("/logout", data={"csrf_token": csrf_of(page(client.get("/")))})
    assert out.status_code == 302 and urlsplit(out.location).path == "/login"
    assert client.get("/").status_code == 302 and client.post("/api/v1/feedback", json=FEEDBACK).status_code == 401


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/x", "/\\evil.example", "javascript:x"])
def test_sign_in_never_sends_to_another_site(csrf_app, web_kb, target):
    web_kb[1].add_user("alice", PASSWORD)
    assert sign_in(csrf_app.test_client(), next_=target).location == "/"


def test_a_removed_user_or_a_new_password_ends_the_session(csrf_app, web_kb):
    _, store = web_kb
    store.add_user("alice", PASSWORD)
    store.add_user("bob", PASSWORD)
    alice, bob = csrf_app.test_client(), csrf_app.test_client()
    sign_in(alice), sign_in(bob, "bob")
    assert alice.get("/").status_code == bob.get("/").status_code == 200
    store.set_password("alice", "a new password")
    store.remove_user("bob")
    assert alice.get("/").status_code == bob.get("/").status_code == 302
    assert sign_in(alice, password="a new password").status_code == 302 and alice.get("/").status_code == 200


def test_bearer_tokens_write_read_only_and_revoked(make_web_app, web_kb):
    _, store = web_kb
    store.add_user("alice", PASSWORD)
    store.add_user("bob", PASSWORD)
    _, writer = store.create_token("alice")
    reader_record, reader = store.create_token("bob", "read")
    client = make_web_app().test_client()

    response = client.post("/api/v1/feedback", json=FEEDBACK, headers=bearer(writer))
    assert response.status_code == 201
    assert [(fb.ticket_id, fb.user_name) for fb in store.feedback()] == [("WEB-3", "alice")]

    assert client.get("/api/v1/tickets/WEB-1", headers=bearer(reader)).status_code == 200
    forbidden = client.post("/api/v1/feedback", json=FEEDBACK, headers=bearer(reader))
    assert forbidden.status_code == 403 and "may only read" in forbidden.get_json()["error"]["message"]

    store.revoke_token(reader_record.id)
    revoked = client.get("/api/v1/tickets/WEB-1", headers=bearer(reader))
    assert revoked.status_code == 401 and re.search(r'error="?invalid_token', revoked.headers["WWW-Authenticate"])
    assert "unknown or revoked" in revoked.get_json()["error"]["message"]
    assert client.get("/api/v1/tickets/WEB-1", headers=bearer(writer + "x")).status_code == 401
    basic = client.get("/api/v1/tickets/WEB-1", headers={"Authorization": "Basic YWxpY2U6eA=="})
    assert basic.status_code == 401 and "Bearer" in basic.get_json()["error"]["message"]
    assert client.get("/", headers=bearer(writer)).status_code == 302  # pages take sessions, not tokens
    assert len(store.feedback()) == 1


@pytest.mark.parametrize("mode, accounts, read_status, write_status", [
    ("auto", False, 200, 201), ("auto", True, 401, 401),
    ("open", False, 200, 201), ("open", True, 200, 401),
    ("required", False, 401, 201), ("required", True, 401, 401),
])
def test_auth_read_says_whether_reading_needs_a_user(make_web_app, web_kb, mode, accounts, read_status, write_status):
    settings, store = web_kb
    if accounts:
        store.add_user("alice", PASSWORD)
    client = make_web_app(TICKETREC_SETTINGS=settings.replace(auth_read=mode)).test_client()
    assert client.get("/api/v1/tickets/WEB-1").status_code == read_status
    assert client.get("/status").status_code == (200 if read_status == 200 else 302)
    assert client.post("/api/v1/feedback", json=FEEDBACK).status_code == write_status  # writes: only accounts count
    if mode == "required" and not accounts:
        assert "ticketrec user add NAME" in page(client.get("/login"))


# -- the status page, the session cookie, the secret key ----------------------------------------------------------------
def test_the_status_page_shows_server_paths_only_to_a_signed_in_user(csrf_app, web_kb):
    settings, store = web_kb
    store.add_user("alice", PASSWORD)
    app = create_app({**csrf_app.config, "TICKETREC_SETTINGS": settings.replace(auth_read="open")})
    client = app.test_client()
    anonymous = page(client.get("/status"))
    assert str(settings.home) not in anonymous and str(settings.db) not in anonymous
    assert "$TICKETREC_HOME/indexes" in anonymous  # the no-index message, without the path
    sign_in(client)
    signed_in = page(client.get("/status"))
    assert f"<code>{settings.db}</code>" in signed_in and str(settings.indexes_dir) in signed_in


def test_the_session_cookie_is_lax_http_only_and_secure_over_https(csrf_app):
    for base_url, secure in [("http://localhost", False), ("https://localhost", True)]:
        cookie = csrf_app.test_client().get("/login", base_url=base_url).headers["Set-Cookie"]
        assert "SameSite=Lax" in cookie and "HttpOnly" in cookie and ("Secure" in cookie) == secure, base_url


def test_the_secret_key_file_is_made_once_private_and_shared_by_every_worker(web_kb):
    settings, store = web_kb
    store.add_user("alice", PASSWORD)
    path = settings.home / SECRET_KEY_FILE
    assert not path.exists()
    first = create_app({"TICKETREC_SETTINGS": settings})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text().strip() == first.secret_key
    created = path.stat().st_mtime_ns
    second = create_app({"TICKETREC_SETTINGS": settings})  # another gunicorn worker
    assert second.secret_key == first.secret_key and path.stat().st_mtime_ns == created
    assert [p.name for p in settings.home.iterdir() if p.name.startswith(".secret_key")] == []  # no temporaries left

    one, other = first.test_client(), second.test_client()  # a form served by one worker is accepted by the other
    html = page(one.get("/login"))
    other.set_cookie("session", one.get_cookie("session").value)
    response = other.post("/login", data={"csrf_token": csrf_of(html), "name": "alice", "password": PASSWORD})
    assert response.status_code == 302
    assert create_app({"TICKETREC_SETTINGS": settings.replace(secret_key="from-env")}).secret_key == "from-env"


def test_workers_racing_to_make_the_secret_key_all_get_the_same_one(tmp_path):
    path, barrier, keys = tmp_path / "home" / SECRET_KEY_FILE, threading.Barrier(8), []

    def worker():
        barrier.wait()
        keys.append(read_or_create_secret(path))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 8 and len(set(keys)) == 1 and keys[0] == path.read_text().strip()
    assert len(keys[0]) == 64 and stat.S_IMODE(path.stat().st_mode) == 0o600


# -- recent queries: each user's own ----------------------------------------------------------------------------------------
@pytest.fixture
def model_app(engine_app, tmp_path):
    """The app over the real tiny engine, on a throwaway copy of its store (accounts added there stay there)."""
    return engine_app(WTF_CSRF_ENABLED=True, settings={"home": tmp_path / "home"})


def test_api_queries_never_show_in_another_users_recent_queries(model_app):
    with Store(model_app.config["TICKETREC_SETTINGS"].db) as store:
        store.add_user("alice", PASSWORD)
        store.add_user("bob", PASSWORD)
        _, alice_token = store.create_token("alice")
    query = {"subject": "turbine blade vibration", "description": "Rotor bearing noise after restart."}
    api = model_app.test_client()
    assert api.post("/api/v1/recommendations", json=query, headers=bearer(alice_token)).status_code == 200
    key = query_key(query["subject"], query["description"])

    bob = model_app.test_client()
    sign_in(bob, "bob")
    assert f"reuse={key}" not in page(bob.get("/"))
    assert "no longer remembered" in page(bob.get(f"/?reuse={key}"))  # not even by its key
    search(bob, "valve seal leak")
    assert "valve seal leak" in page(bob.get("/"))

    alice = model_app.test_client()
    sign_in(alice)
    html = page(alice.get("/"))
    assert f"reuse={key}" in html and "valve seal leak" not in html  # her own API query, not bob's page query


def test_anonymous_api_queries_are_not_remembered_for_anyones_page(model_app):
    model_app.test_client().post("/api/v1/recommendations", json={"subject": "combustion flame burner"})
    visitor = model_app.test_client()
    assert "combustion flame burner" not in page(visitor.get("/"))
    search(visitor, "oil filter pump")
    assert "oil filter pump" in page(visitor.get("/")) and "oil filter pump" not in page(model_app.test_client().get("/"))


# -- the OpenAPI document states the answers given -----------------------------------------------------------------------
def test_the_openapi_document_describes_bearer_tokens_and_the_401_and_403_answered(make_web_app, web_kb):
    import schemathesis

    from web.api import MAX_K
    from web.openapi import openapi_document

    _, store = web_kb
    store.add_user("alice", PASSWORD)
    _, reader = store.create_token("alice", "read")
    app = make_web_app(MAX_DESCRIPTION=200)
    doc = app.test_client().get("/api/v1/openapi.json").get_json()
    scheme = doc["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    assert {} in doc["security"] and doc["paths"]["/healthz"]["get"]["security"] == []
    assert "403" in doc["paths"]["/feedback"]["post"]["responses"]
    schema = schemathesis.openapi.from_dict(openapi_document(200, MAX_K))
    cases = [("/feedback", "POST", {"body": FEEDBACK}, {}, 401),
             ("/feedback", "POST", {"body": FEEDBACK}, bearer(reader), 403),
             ("/tickets/{ticket_id}", "GET", {"path_parameters": {"ticket_id": "WEB-1"}}, bearer("trk_nope"), 401),
             ("/recommendations", "POST", {"body": {"subject": "valve"}}, {}, 401),
             ("/tickets/{ticket_id}", "GET", {"path_parameters": {"ticket_id": "WEB-1"}}, bearer(reader), 200)]
    for path, method, parts, headers, status in cases:
        response = schema[path][method].Case(**parts, headers=headers).call_and_validate(app=app)
        assert response.status_code == status, (path, headers)


# -- a real browser signs in through the form ---------------------------------------------------------------------------
@pytest.mark.integration
def test_a_browser_signs_in_through_the_form(make_web_app, web_kb, tmp_path):
    from test_browser import CHROMEDRIVER, CHROMIUM  # the Chromium set-up of the browser tests
    from pathlib import Path

    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip(f"Chromium or ChromeDriver not installed ({CHROMIUM}, {CHROMEDRIVER})")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from werkzeug.serving import make_server

    web_kb[1].add_user("alice", PASSWORD)
    app = make_web_app(TESTING=False, WTF_CSRF_ENABLED=True)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(arg)
    browser = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        browser.set_page_load_timeout(60)
        browser.get(f"http://127.0.0.1:{server.server_port}/status")
        assert urlsplit(browser.current_url).path == "/login"  # sent to sign in first
        browser.find_element(By.ID, "name").send_keys("alice")
        browser.find_element(By.ID, "password").send_keys(PASSWORD)
        browser.find_element(By.ID, "login-button").click()
        WebDriverWait(browser, 30).until(lambda d: urlsplit(d.current_url).path == "/status")
        assert browser.find_element(By.ID, "signed-in-as").text == "alice"
        assert str(web_kb[0].db) in browser.page_source  # signed in: the server's paths are shown
    finally:
        browser.quit()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
