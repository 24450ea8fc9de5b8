"""The browser pages through Flask's test client: search, results, feedback, ticket, status, topics, errors."""
import re
import socket

import pytest
from click.testing import CliRunner

from recommender.data.store import query_key
from web import create_app
from web.highlight import highlight


def page(response) -> str:
    return response.get_data(as_text=True)


def cards_of(html: str) -> list[str]:
    return re.findall(r'<article class="card".*?</article>', html, flags=re.S)


# -- safe highlighting --------------------------------------------------------------------------------------
def test_highlight_escapes_text_and_wraps_the_words_bm25_takes_for_a_term():
    out = str(highlight("Valve <script>x</script> leaks; valves & VALVE, valvetrain", ["valve"]))
    assert out == ("<mark>Valve</mark> &lt;script&gt;x&lt;/script&gt; leaks; <mark>valves</mark> &amp; "
                   "<mark>VALVE</mark>, valvetrain")  # whole words of the same stem, never a longer word
    assert str(highlight("Mozilla/5.0 (X11) with 5.0 attachments", ["mozilla/5.0", "attaching"])) == (
        "<mark>Mozilla/5.0</mark> (X11) with 5.0 <mark>attachments</mark>")
    # a term of one word inside a longer one, as it is shared: a path, a URL (a term of several words is not)
    assert str(highlight("error: /usr/lib/Dictionaries/en-US.aff & dictionary-x", ["dictionary", "en-us"])) == (
        "error: /usr/lib/<mark>Dictionaries</mark>/en-US.aff &amp; <mark>dictionary</mark>-x")


def test_highlight_never_matches_inside_an_escape_or_injects_a_term():
    assert str(highlight("a & b", ["amp"])) == "a &amp; b"
    assert str(highlight("x <b> y", ["<b>"])) == "x &lt;<mark>b</mark>&gt; y"
    assert str(highlight("<i>plain</i>", [])) == "&lt;i&gt;plain&lt;/i&gt;"


# -- without a model: forms, errors, status -----------------------------------------------------------------
@pytest.fixture
def client(make_web_app):
    return make_web_app().test_client()


def test_search_page_has_a_csrf_protected_form(make_web_app):
    html = page(make_web_app(WTF_CSRF_ENABLED=True).test_client().get("/"))
    assert 'name="subject"' in html and 'name="description"' in html
    assert re.search(r'name="csrf_token" type="hidden" value="[^"]+"', html)


def test_a_form_without_csrf_token_is_refused(make_web_app, web_kb):
    client = make_web_app(WTF_CSRF_ENABLED=True).test_client()
    response = client.post("/", data={"subject": "s", "description": "d"})
    assert response.status_code == 400 and "Reload the page" in page(response)
    response = client.post("/feedback", data={"subject": "s", "description": "d", "choice": "YES WEB-1"})
    assert response.status_code == 400 and web_kb[1].feedback() == []


def test_empty_fields_get_form_errors(client):
    response = client.post("/", data={"subject": "  ", "description": ""})
    assert response.status_code == 400
    html = page(response)
    assert "Enter the ticket&#39;s subject" in html and html.count('class="field-error"') == 1
    assert not cards_of(html)  # the description is optional (a subject alone is a query); the subject is not


def test_a_too_long_description_is_refused_with_the_limit(client):
    response = client.post("/", data={"subject": "s", "description": "x" * 201})
    assert response.status_code == 400 and "the limit is 200" in page(response)


def test_search_without_a_model_says_what_to_do(client):
    response = client.post("/", data={"subject": "valve", "description": "leaks"})
    assert response.status_code == 503
    assert "No recommendations can be served" in page(response) and "ticketrec index" in page(response)


def test_ticket_page_shows_markup_as_text(client):
    response = client.get("/tickets/WEB-3")
    html = page(response)
    assert response.status_code == 200
    assert "Valve &lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; sticks" in html and "<script>alert" not in html
    assert "&lt;b&gt;Valve&lt;/b&gt; sticks" in html and "Clean the &lt;i&gt;stem&lt;/i&gt;." in html
    assert "Neighbours cannot be computed" in html


def test_ticket_page_of_a_ticket_without_a_solution_says_so_in_one_line(client, web_kb):
    from recommender.data.records import Ticket
    from recommender.data.store import Dataset

    web_kb[1].import_dataset(Dataset([Ticket("WEB-9", "Seal weeps", "Oil at the shaft seal.", "")], source="t"))
    html = page(client.get("/tickets/WEB-9"))
    assert '<p class="no-solution"><span class="summary-label">Solution</span> (no solution recorded)</p>' in html
    assert 'class="solution"' not in html
    assert 'class="solution"' in page(client.get("/tickets/WEB-1"))


def test_unknown_ticket_and_page_are_404_pages(client):
    assert client.get("/tickets/NOPE").status_code == 404
    response = client.get("/nothing-here")
    assert response.status_code == 404 and response.content_type.startswith("text/html")
    assert client.get("/feedback").status_code == 405


def test_feedback_form_stores_the_judgement(client, web_kb):
    response = client.post("/feedback", data={"subject": "valve stuck", "description": "at 40% load", "choice": "REL WEB-3"})
    # stored even though no model can redraw the results (the page says why)
    assert response.status_code == 503 and "Saved: ticket WEB-3 marked REL" in page(response)
    [fb] = web_kb[1].feedback(query_key("valve stuck", "at 40% load"))
    assert (fb.ticket_id, fb.label, fb.model_version, fb.index_version) == ("WEB-3", "REL", "", "")


@pytest.mark.parametrize("choice, status", [("MAYBE WEB-1", 400), ("YES", 400), ("", 400), ("YES NOPE", 404)])
def test_bad_feedback_forms_are_refused(client, web_kb, choice, status):
    response = client.post("/feedback", data={"subject": "s", "description": "d", "choice": choice})
    assert response.status_code == status
    assert web_kb[1].feedback() == []


def test_status_page_without_model_shows_the_knowledge_base(client):
    html = page(client.get("/status"))
    assert "No model loaded" in html and "No index loaded" in html and "in-process" in html
    assert re.search(r"<dt>Tickets</dt><dd>4</dd>", html)
    assert "No evaluation report yet" in html


def test_status_page_shows_the_latest_report_and_its_plot(client, web_kb):
    settings, _ = web_kb
    folder = settings.home / "reports" / "run-1"
    folder.mkdir(parents=True)
    (folder / "report.md").write_text("# Evaluation\n\n| system | MAP |\n|---|---|\n| <b>ours</b> | 72.0 |\n")
    (folder / "map.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    html = page(client.get("/status"))
    assert "| &lt;b&gt;ours&lt;/b&gt; | 72.0 |" in html
    assert 'src="/status/reports/run-1/map.png"' in html
    assert client.get("/status/reports/run-1/map.png").data.startswith(b"\x89PNG")
    assert client.get("/status/reports/run-1/report.md").status_code == 404
    assert client.get("/status/reports/run-2/map.png").status_code == 404


def test_topics_page_without_model_says_why(client):
    response = client.get("/topics")
    assert response.status_code == 503 and "No topics to show" in page(response)


def test_an_unexpected_failure_is_a_500_page_without_traceback(make_web_app):
    def broken_engine(settings):
        raise RuntimeError("simulated engine crash")

    response = make_web_app(TICKETREC_ENGINE_FACTORY=broken_engine).test_client().post(
        "/", data={"subject": "s", "description": "d"})
    assert response.status_code == 500
    assert "Something went wrong" in page(response) and "Traceback" not in page(response) and "simulated" not in page(response)


def test_security_headers(client):
    headers = client.get("/").headers
    assert "script-src 'self'" in headers["Content-Security-Policy"] and headers["X-Content-Type-Options"] == "nosniff"


def test_secret_key_comes_from_the_settings(web_kb):
    settings, _ = web_kb
    assert create_app({"TICKETREC_SETTINGS": settings.replace(secret_key="s3cret")}).secret_key == "s3cret"
    first, second = create_app({"TICKETREC_SETTINGS": settings}), create_app({"TICKETREC_SETTINGS": settings})
    assert first.secret_key and first.secret_key == second.secret_key  # both read $TICKETREC_HOME/secret_key


def test_serve_refuses_a_busy_port(web_kb, monkeypatch):
    from recommender.cli import main

    monkeypatch.setenv("TICKETREC_HOME", str(web_kb[0].home))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        result = CliRunner().invoke(main, ["serve", "--port", str(busy.getsockname()[1])])
    assert result.exit_code == 1 and "in use" in result.output and "Traceback" not in result.output


# -- with a real engine over a tiny trained model -----------------------------------------------------------
@pytest.fixture
def engine_client(web_engine):
    settings, engine = web_engine
    return create_app({"TESTING": True, "WTF_CSRF_ENABLED": False, "TICKETREC_SETTINGS": settings,
                       "TICKETREC_ENGINE": engine}).test_client()


QUERY = {"subject": "turbine blade vibration", "description": "High vibration on the rotor bearing after restart."}


def test_results_show_ten_cards_solution_first_with_scores_and_topics(engine_client, web_engine):
    _, engine = web_engine
    response = engine_client.post("/", data=QUERY)
    assert response.status_code == 200
    html = page(response)
    cards = cards_of(html)
    assert len(cards) == 10
    for rank, card in enumerate(cards, start=1):
        assert f'<span class="rank" title="rank">{rank}</span>' in card
        score = float(re.search(r'<span class="score-value">(\d\.\d)</span>', card).group(1))
        assert 1.0 <= score <= 5.0
        assert card.index('class="solution"') < card.index("<details")  # the solution comes first
        assert '<details class="ticket-text">' in card and "card-no-solution" not in card  # the ticket folded
        topics_weigh = engine.index.metric_spec["channels"].get("T", 0) > 0  # chips only when topics weigh
        assert len(re.findall(r'class="chip"[^>]*title="topic \d+: [^"]+"', card)) == (3 if topics_weigh else 0)
        assert '<div class="why"' in card
        assert all(f'value="{label} ' in card for label in ("YES", "REL", "NO"))
    assert "<mark>" in html  # shared words highlighted
    assert engine.model.version[:12] in html and engine.index.version in html and "answered in" in html
    assert "<h2>Top 10 solutions</h2>" in html


def test_feedback_is_stored_with_versions_and_shown_when_the_query_repeats(engine_client, web_engine):
    settings, engine = web_engine
    query = {"subject": "oil filter pump", "description": "Lubrication oil temperature high after the filter change."}
    first = cards_of(page(engine_client.post("/", data=query)))
    ticket_id = re.search(r'data-ticket-id="([^"]+)"', first[1]).group(1)
    assert "given" not in first[1]
    response = engine_client.post("/feedback", data={**query, "choice": f"NO {ticket_id}"})
    assert response.status_code == 200 and f"Saved: ticket {ticket_id} marked NO" in page(response)
    from recommender.data.store import Store

    with Store(settings.db) as store:
        [fb] = store.feedback(query_key(query["subject"], query["description"]))
    assert (fb.ticket_id, fb.label, fb.model_version, fb.index_version) == (
        ticket_id, "NO", engine.model.version, engine.index.version)
    again = page(engine_client.post("/", data=query))
    card = next(c for c in cards_of(again) if f'data-ticket-id="{ticket_id}"' in c)
    assert re.search(r'class="fb fb-no given" aria-pressed="true"', card) and "Feedback given: NO" in card


def test_recent_queries_can_be_reused(engine_client):
    engine_client.post("/", data=QUERY)
    html = page(engine_client.get("/"))
    key = query_key(QUERY["subject"], QUERY["description"])
    assert f"/?reuse={key}" in html
    reused = page(engine_client.get(f"/?reuse={key}"))
    assert 'value="turbine blade vibration"' in reused and "rotor bearing after restart.</textarea>" in reused
    assert "no longer remembered" in page(engine_client.get("/?reuse=unknown", follow_redirects=True))


def test_a_recent_query_remembers_its_filter(engine_client):
    filtered = {**QUERY, "filter-area": "valve"}
    answered = page(engine_client.post("/", data=filtered))
    assert "Only tickets with area valve" in answered
    key = query_key(QUERY["subject"], QUERY["description"])
    assert re.search(rf'href="/\?reuse={key}">.*?<span class="recent-filter">only area valve</span>',
                     page(engine_client.get("/")))
    reused = page(engine_client.get(f"/?reuse={key}"))
    assert re.search(r'<option value="valve" selected>', reused)
    assert page(engine_client.post("/", data=filtered)).count('<option value="valve" selected>') == 1
    engine_client.post("/", data=QUERY)  # the same text without the filter: remembered so from now
    assert '<option value="valve" selected>' not in page(engine_client.get(f"/?reuse={key}"))


def test_results_show_html_in_tickets_and_queries_as_text(engine_client):
    response = engine_client.post("/", data={"subject": "valve <img src=x onerror=alert(1)> leak",
                                             "description": "seal pressure <script>alert('q')</script>"})
    html = page(response)
    assert response.status_code == 200
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_ticket_page_lists_neighbours_without_itself(engine_client):
    html = page(engine_client.get("/tickets/WEB-4"))
    cards = cards_of(html)
    assert len(cards) == 10
    assert all('data-ticket-id="WEB-4"' not in card for card in cards)
    assert [int(r) for r in re.findall(r'<span class="rank" title="rank">(\d+)</span>', html)] == list(range(1, 11))


def test_topics_page_lists_every_topic_with_ten_words(engine_client, web_engine):
    _, engine = web_engine
    html = page(engine_client.get("/topics"))
    words = engine.model.topic_words(10)
    assert len(re.findall(r'<section class="panel topic"', html)) == len(words) == 5
    assert " · ".join(words[0]) in html


def test_status_page_with_a_model(engine_client, web_engine):
    _, engine = web_engine
    html = page(engine_client.get("/status"))
    assert engine.model.version in html and engine.index.version in html
    assert engine.model.config["data_fingerprint"] in html
    assert re.search(r"<dt>Tickets</dt><dd>24</dd>", html)
    # when training saved it, and on the knowledge base's 24 tickets, all stored before it
    assert re.search(r"<dt>Trained</dt><dd>20\d\d-\d\d-\d\d \d\d:\d\d UTC, on 24 tickets</dd>", html)
    assert "<dt>Since then</dt><dd>no ticket added or changed</dd>" in html


def test_status_page_of_a_model_that_does_not_record_when_it_was_trained(engine_client, web_engine, monkeypatch):
    """A model saved before training recorded its time still says how many tickets it learnt, and no count since."""
    _, engine = web_engine
    training = {k: v for k, v in engine.model.meta["training"].items() if k != "trained_at"}
    monkeypatch.setitem(engine.model.meta, "training", training)
    html = page(engine_client.get("/status"))
    assert "<dt>Trained</dt><dd>on 24 tickets (the model does not record when)</dd>" in html
    assert "Since then" not in html
    monkeypatch.setitem(engine.model.meta, "training", {})
    assert "<dt>Trained</dt><dd>—</dd>" in page(engine_client.get("/status"))


def test_status_page_says_whose_evaluation_it_shows(engine_app, web_engine, tmp_path):
    """A report of this home names the model it evaluated against the served one; a report found only in another
    root (the repository's docs/results) is said to be of another knowledge base."""
    import json

    settings, engine = web_engine
    elsewhere = tmp_path / "docs-results" / "synthetic"
    elsewhere.mkdir(parents=True)
    (elsewhere / "report.md").write_text("# Evaluation: synthetic\n")
    own_root = tmp_path / "home-reports"
    app = engine_app(TICKETREC_REPORT_ROOTS=[own_root, elsewhere.parent], settings={"home": tmp_path / "h"})
    html = page(app.test_client().get("/status"))
    assert "No evaluation in this home's <code>reports/</code> folder yet" in html and "synthetic" in html
    own = tmp_path / "h" / "reports" / "sm"
    own.mkdir(parents=True)
    (own / "report.md").write_text("# Evaluation: sm\n")
    (own / "results.json").write_text(json.dumps({"model": {"version": engine.model.version}}))
    app = engine_app(TICKETREC_REPORT_ROOTS=[tmp_path / "h" / "reports", elsewhere.parent],
                     settings={"home": tmp_path / "h"})
    html = page(app.test_client().get("/status"))
    assert "No evaluation in this home" not in html and "sm · " in html and "of the served model" in html
    (own / "results.json").write_text(json.dumps({"model": {"version": "0123456789abcdef"}}))
    html = page(app.test_client().get("/status"))
    assert "of model <code>0123456789ab</code>, not the served one" in html


def test_status_page_says_what_the_next_reindex_brings_in(engine_app, another_model, tmp_path):
    """Tickets imported since the served version's build, and another model in TICKETREC_MODEL, are named on the
    status page (and nothing is when the index is as the store and the model directory are)."""
    from recommender.data.records import Ticket
    from recommender.data.store import Dataset, Store

    html = page(engine_app().test_client().get("/status"))
    assert "Not yet indexed" not in html and "Next model" not in html
    another_model.save(tmp_path / "another-model")
    app = engine_app(settings={"model": tmp_path / "another-model"})
    html = page(app.test_client().get("/status"))
    assert "Not yet indexed" not in html
    assert f"<dt>Next model</dt><dd><code>{another_model.version[:12]}</code>" in html
    with Store(app.config["TICKETREC_SETTINGS"].db) as store:
        store.import_dataset(Dataset([Ticket("WEB-NEW", "Bearing noise", "Grinding at full load.", "")], source="t"))
    html = page(app.test_client().get("/status"))
    assert re.search(r"<dt>Not yet indexed</dt><dd>1 new, 0 changed tickets in the knowledge base: the next reindex",
                     html)
    assert "<dt>Since then</dt><dd>1 ticket added or changed (when to retrain: README, “When to retrain”)</dd>" in html
    assert "<dt>Removed</dt>" not in html
    with Store(app.config["TICKETREC_SETTINGS"].db) as store:
        store.remove_tickets(["WEB-1", "WEB-2"])
    html = page(app.test_client().get("/status"))
    assert "<dt>Removed</dt><dd>2 tickets of this version are no longer in the knowledge base: results leave them " \
           "out, and the next reindex drops them</dd>" in html


# -- why each result was chosen: channel shares; topic chips only when the topic channel weighs ---------------
def reweighted_client(web_engine, tmp_path, channels: dict):
    """A client over the web engine's model with channel weights replaced, on the same tickets (a fresh index)."""
    from recommender.data.store import Dataset, Store
    from recommender.model.bundle import TicketModel
    from recommender.serving.engine import Recommender
    from recommender.serving.index_build import build_index

    base, _ = web_engine
    model = TicketModel.load(base.model)
    spec = model.metric_spec()
    model.net.set_weights([v for *_, v in spec["pairs"]], {**spec["channels"], **channels})
    model.invalidate()
    settings = base.replace(home=tmp_path, db=tmp_path / "tickets.db", model=tmp_path / "models" / "current")
    with Store(base.db) as src, Store(settings.db) as dst:
        dst.import_dataset(Dataset(list(src.iter_tickets()), source="web-tiny"))
        build_index(dst, model, settings, progress=False)
    engine = Recommender(settings)
    return create_app({"TESTING": True, "WTF_CSRF_ENABLED": False, "TICKETREC_SETTINGS": settings,
                       "TICKETREC_ENGINE": engine}).test_client(), engine


LABELS = {"words in common", "meaning", "topics", "LSTM", "word embeddings"}
WHY_PART = r'data-channel="(\w+)" title="[^"]+"><i class="why-dot why-\w+"></i>([\w ]+) (\d+) %</span>'


@pytest.mark.parametrize("t_weight", [0.0, 0.5])
def test_cards_say_why_and_show_topic_chips_only_when_topics_weigh(web_engine, tmp_path, t_weight):
    client, engine = reweighted_client(web_engine, tmp_path, {"E": 0.3, "T": t_weight})
    assert (engine.index.metric_spec["channels"]["T"] > 0) == (t_weight > 0)
    topics = page(client.get("/topics"))  # the topics page says when its topics move no ranking
    assert ("these topics move no ranking" in topics) == (t_weight == 0) and '<section class="panel topic"' in topics
    html = page(client.post("/", data=QUERY))
    cards = cards_of(html)
    assert len(cards) == 10
    for card in cards:
        chips = re.findall(r'class="chip"[^>]*title="topic \d+: [^"]+"', card)
        assert len(chips) == (3 if t_weight else 0)
        why = re.search(r'<div class="why" title="([^"]+)">(.*?)</div>', card, flags=re.S)
        assert "typical candidate" in why.group(1)  # the one-sentence definition is the tooltip
        parts = re.findall(WHY_PART, why.group(2))
        if parts:
            assert sum(int(p) for _, _, p in parts) == 100 and all(int(p) > 0 for _, _, p in parts)
            assert {label for _, label, _ in parts} <= LABELS
            assert t_weight > 0 or "T" not in {c for c, _, _ in parts}  # a weight-0 channel never appears
            assert len(re.findall(r"<rect ", why.group(2))) == len(parts)
        else:
            assert "no channel sets it apart" in why.group(2)
    assert 'data-channel="E"' in html  # E weighs here: it explains some result


def test_why_percentages_add_up_to_a_hundred():
    from web.views import _why

    why = _why({"bm25": 0.333, "S": 0.333, "T": 0.334, "h": 0.0})
    assert why[0]["channel"] == "T" and sum(w["percent"] for w in why) == 100
    assert [w["x"] for w in why] == [0, why[0]["percent"], why[0]["percent"] + why[1]["percent"]]
    assert {w["label"] for w in why} == {"words in common", "meaning", "topics"}
    assert _why({"bm25": 0.0, "E": 0.0}) == [] and _why({}) == []


def test_card_facts_are_the_named_metadata_in_order_dates_as_dates_long_values_cut():
    from web.views import FACT_CHARS, MAX_FACTS, card_facts

    metadata = {"status": "RESOLVED", "resolution": "FIXED", "created": "2020-01-02 17:14:21+00:00",
                "resolved": "2020-11-01T20:04:54Z", "priority": "--", "category": "x" * 60, "closed": "",
                "owner": {"name": "ann"}}
    names = ("resolution", "status", "closed", "owner", "created", "category", "resolved")
    assert card_facts(metadata, names) == [("resolution", "FIXED"), ("status", "RESOLVED"), ("created", "2020-01-02"),
                                           ("category", "x" * (FACT_CHARS - 1) + "…")]
    assert MAX_FACTS == 4 and card_facts(metadata, ()) == [] and card_facts({}, names) == []
