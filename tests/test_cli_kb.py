"""The knowledge-base CLI: `ticketrec import`, `synth`, `stats`, through click's CliRunner over a temp home."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from recommender.cli import main


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """run(*args) -> click Result, with TICKETREC_HOME and TICKETREC_DB inside tmp_path."""
    monkeypatch.setenv("TICKETREC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TICKETREC_DB", str(tmp_path / "home" / "kb.sqlite3"))
    runner = CliRunner()

    def run(*args):
        return runner.invoke(main, [str(a) for a in args])

    return run


def stats(cli) -> dict:
    result = cli("stats", "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_synth_import_stats(cli, tmp_path):
    out = tmp_path / "kb.jsonl"
    result = cli("synth", "--tickets", 60, "--queries", 6, "--seed", 4, "--out", out)
    assert result.exit_code == 0, result.output
    assert "wrote 60 tickets, 6 queries" in result.output and out.exists()
    result = cli("import", out, "--quiet")
    assert result.exit_code == 0, result.output
    assert "imported 60 tickets, 6 queries" in result.output
    counts = stats(cli)
    assert counts["tickets"] == 60 and counts["queries"] == 6 and counts["pairs"] > 6 and counts["feedback"] == 0
    plain = cli("stats")
    assert plain.exit_code == 0 and "tickets   60" in plain.output


def test_synth_is_deterministic(cli, tmp_path):
    for name in ("a", "b"):
        assert cli("synth", "--tickets", 20, "--queries", 2, "--seed", 1, "--out", tmp_path / f"{name}.jsonl").exit_code == 0
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_synth_dev_split_holds_out_queries_over_the_same_tickets(cli, tmp_path):
    from recommender.data.importers import load

    train, dev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    result = cli("synth", "--tickets", 40, "--queries", 9, "--out", train, "--dev-out", dev, "--dev-queries", 3)
    assert result.exit_code == 0, result.output
    a, b = load(train), load(dev)
    assert [t.id for t in a.tickets] == [t.id for t in b.tickets]
    assert (len(a.queries), len(b.queries)) == (6, 3)
    assert not {q.id for q in a.queries} & {q.id for q in b.queries}
    assert {p.query_id for p in b.pairs} == {q.id for q in b.queries}
    too_many = cli("synth", "--tickets", 10, "--queries", 3, "--out", train, "--dev-out", dev, "--dev-queries", 3)
    assert too_many.exit_code == 1 and "no training query" in too_many.output


def test_broken_file_leaves_counts_unchanged_and_prints_one_line(cli, tmp_path):
    good = tmp_path / "kb.jsonl"
    assert cli("synth", "--tickets", 30, "--queries", 3, "--out", good).exit_code == 0
    assert cli("import", good, "--quiet").exit_code == 0
    before = stats(cli)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"type": "ticket", "id": "NEW-1", "subject": "a", "description": "b", "solution": "c"}\n'
                      '{"type": "pair", "query_id": "Q00001", "ticket_id": "NEW-1", "label": "PERHAPS"}\n',
                      encoding="utf-8")
    result = cli("import", broken, "--quiet")
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "line 2" in lines[0] and "unknown label" in lines[0]
    assert "Traceback" not in result.output
    assert stats(cli) == before


def test_pairs_may_refer_to_tickets_already_imported(cli, tmp_path):
    (tmp_path / "t.csv").write_text("id,subject,description,solution\nT1,Pump noise,Rattling,Replace bearing\n",
                                    encoding="utf-8")
    (tmp_path / "p.csv").write_text("query_id,query_subject,query_description,ticket_id,label\nQ1,noise,pump,T1,YES\n",
                                    encoding="utf-8")
    assert cli("import", tmp_path / "t.csv", "--quiet").exit_code == 0
    result = cli("import", tmp_path / "p.csv", "--quiet")
    assert result.exit_code == 0, result.output
    assert stats(cli)["pairs"] == 1


def test_import_errors(cli, tmp_path):
    (tmp_path / "notes.txt").write_text("hello", encoding="utf-8")
    result = cli("import", tmp_path / "notes.txt")
    assert result.exit_code == 1 and "--format" in result.output
    result = cli("import", tmp_path / "missing.jsonl")
    assert result.exit_code == 1 and "does not exist" in result.output
    result = cli("import", tmp_path / "notes.txt", "--format", "csv")
    assert result.exit_code == 1 and "unrecognised header" in result.output
    assert cli("import").exit_code != 0  # no FILE: click's usage error


def test_import_semeval_dev(cli, semeval_dir):
    result = cli("import", semeval_dir / "dev.xml", "--quiet")
    assert result.exit_code == 0, result.output
    assert stats(cli) == {"tickets": 500, "queries": 50, "pairs": 500, "feedback": 0}


# -- a help desk's own export (issue 12): column mapping, subject-only tickets end to end --------------------------
EXPORT = ("Issue id,Summary,Status,Description\n"
          "101,Compressor trips on high vibration,OPEN,The compressor tripped at start.\n"
          "102,Lube oil pressure low,CLOSED,\n"
          "103,Valve sticks at part load,CLOSED,\n")


def test_import_with_a_column_mapping(cli, tmp_path):
    export = tmp_path / "bugs.csv"
    export.write_text(EXPORT, encoding="utf-8")
    result = cli("import", export, "--map", "id=Issue id", "--map", "subject=Summary", "--map", "description=Description",
                 "--quiet")
    assert result.exit_code == 0, result.output
    assert "imported 3 tickets" in result.output and stats(cli)["tickets"] == 3
    mapping = tmp_path / "mapping.txt"
    mapping.write_text('# our export\nid="Issue id"\nsubject=Summary\ndescription=Nothing\n', encoding="utf-8")
    result = cli("import", export, "--mapping", mapping, "--map", "description=Description", "--quiet")  # --map wins
    assert result.exit_code == 0, result.output


def test_import_with_a_missing_mapped_column_is_one_line(cli, tmp_path):
    export = tmp_path / "bugs.csv"
    export.write_text(EXPORT, encoding="utf-8")
    result = cli("import", export, "--map", "id=Issue id", "--map", "subject=Title", "--quiet")
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "no column 'Title' (mapped to subject)" in lines[0]
    assert "'Issue id', 'Summary', 'Status', 'Description'" in lines[0] and "Compressor" not in lines[0]
    assert stats(cli)["tickets"] == 0
    result = cli("import", export, "--map", "headline=Summary", "--quiet")
    assert result.exit_code == 1 and "cannot map 'headline'" in result.output


def test_subject_only_tickets_end_to_end(cli, tmp_path, tiny_model, monkeypatch):
    """Tickets without description or solution: import, index, recommend (CLI, API, UI) with a subject-only query."""
    from web import create_app

    from recommender.config import Settings

    export = tmp_path / "bugs.csv"
    export.write_text(EXPORT, encoding="utf-8")
    assert cli("import", export, "--map", "id=Issue id", "--map", "subject=Summary", "--quiet").exit_code == 0
    monkeypatch.setenv("TICKETREC_MODEL", str(tiny_model[0]))
    monkeypatch.setenv("TICKETREC_CANDIDATES", "0")  # every ticket is scored, not only those sharing a word
    result = cli("index")
    assert result.exit_code == 0, result.output
    result = cli("recommend", "--subject", "compressor vibration trip", "-k", 3)
    assert result.exit_code == 0, result.output
    assert result.output.count("solution: (no solution recorded)") == 3
    assert "    description: The compressor tripped at start." in result.output  # what tells whether one fits
    result = cli("recommend", "--subject", "compressor vibration trip", "-k", 3, "--json")
    assert [r["ticket"]["solution"] for r in json.loads(result.output)["results"]] == ["", "", ""]

    app = create_app({"TESTING": True, "WTF_CSRF_ENABLED": False, "TICKETREC_SETTINGS": Settings.from_env()})
    client = app.test_client()
    response = client.post("/api/v1/recommendations", json={"subject": "compressor vibration trip", "k": 3})
    assert response.status_code == 200, response.get_data(as_text=True)
    assert len(response.get_json()["results"]) == 3
    html = client.post("/", data={"subject": "compressor vibration trip", "description": ""}).get_data(as_text=True)
    assert html.count("(no solution recorded)") == 3
    # tickets without a solution show their description instead of an empty solution box, and the page says so
    assert html.count('<details class="ticket-text" open>') == 3 and 'class="solution"' not in html
    assert "<h2>Top 3 similar tickets</h2>" in html
    # the export's status column under each card's heading (TICKETREC_CARD_FIELDS), and none when set to none
    assert html.count('<span class="fact-name">status</span> ') == 3
    assert '<span class="fact-name">status</span> OPEN' in html
    monkeypatch.setenv("TICKETREC_CARD_FIELDS", "none")
    app = create_app({"TESTING": True, "WTF_CSRF_ENABLED": False, "TICKETREC_SETTINGS": Settings.from_env()})
    html = app.test_client().post("/", data={"subject": "compressor vibration trip", "description": ""}).get_data(
        as_text=True)
    assert html.count('<article class="card') == 3 and 'class="facts"' not in html


COPIES = EXPORT + ("104,Compressor  trips on HIGH vibration,CLOSED,The compressor tripped at start. \n"  # spaces, case
                   "105,Compressor trips on high vibration,OPEN,The compressor tripped at start.\n")


def test_copies_of_one_ticket_are_shown_as_one(cli, tmp_path, tiny_model, monkeypatch):
    """Tickets that read the same under other ids (white space and case aside) keep their ranks and scores, but
    the CLI, the API and the results page name the higher one instead of repeating the text and why."""
    from web import create_app

    from recommender.config import Settings

    export = tmp_path / "bugs.csv"
    export.write_text(COPIES, encoding="utf-8")
    result = cli("import", export, "--map", "id=Issue id", "--map", "subject=Summary", "--quiet")
    assert result.exit_code == 0, result.output
    assert "note: 3 tickets read the same as another under another id (1 group of the same" in result.stderr
    monkeypatch.setenv("TICKETREC_MODEL", str(tiny_model[0]))
    monkeypatch.setenv("TICKETREC_CANDIDATES", "0")
    assert cli("index").exit_code == 0
    answer = cli("recommend", "--subject", "compressor vibration trip", "-k", 5, "--json")
    results = json.loads(answer.output)["results"]
    copies = {"101", "104", "105"}
    by_id = {r["ticket"]["id"]: r for r in results}
    assert set(by_id) == copies | {"102", "103"}
    first = min(copies, key=lambda tid: by_id[tid]["rank"])
    assert {tid: by_id[tid]["same_text_as"] for tid in by_id} == {
        tid: (first if tid in copies and tid != first else None) for tid in by_id}
    assert len({by_id[tid]["raw_score"] for tid in copies}) == 1  # one text, one score: the ranking is untouched
    output = cli("recommend", "--subject", "compressor vibration trip", "-k", 5).output
    line = f"    same subject, description and solution as result {by_id[first]['rank']} ({first})"
    assert output.count(line) == 2 and output.count("    why: ") == 3

    app = create_app({"TESTING": True, "WTF_CSRF_ENABLED": False, "TICKETREC_SETTINGS": Settings.from_env()})
    client = app.test_client()
    response = client.post("/api/v1/recommendations", json={"subject": "compressor vibration trip", "k": 5})
    assert [r["same_text_as"] for r in response.get_json()["results"]] == [r["same_text_as"] for r in results]
    html = client.post("/", data={"subject": "compressor vibration trip", "description": ""}).get_data(as_text=True)
    assert html.count('<article class="card card-copy"') == 2 and html.count('<div class="why"') == 3
    assert html.count(f'<a href="#result-{by_id[first]["rank"]}">{by_id[first]["rank"]}</a> (ticket {first}).') == 2
    assert html.count('class="fb fb-yes') == 5  # a copy can still be judged
    for tid in copies:  # a ticket's page: its copies among its neighbours copy it, whichever of them it is
        page = client.get(f"/tickets/{tid}").get_data(as_text=True)
        assert page.count("Same subject, description and solution as this ticket.") == 2, tid
        assert page.count('<article class="card card-copy"') == 2


RICH_EXPORT = """Ticket,Subject,Description,Solution
Z1,Compressor trips on vibration,"<div style=""color:#333""><p>Tripped twice at start.</p><ul><li>bearing alarm</li><li>high vibration</li></ul></div>","<p>Re-align the coupling&nbsp;and check the bearing.</p>"
Z2,Lube oil pressure low,<p>Alarm after the <b>filter</b> change.</p>,<p>Bleed the filter housing.</p>
Z3,Valve sticks at part load,<p>Stem stuck at 40&#37; load.</p>,Clean the stem.
"""


def test_a_rich_text_export_is_served_without_its_markup(cli, tmp_path, tiny_model, monkeypatch):
    """A help desk that stores HTML: `ticketrec import` says which fields it read as HTML, and what the CLI, the API
    and the results page show is the tickets' text, no tag, style or entity."""
    from web import create_app

    from recommender.config import Settings

    export = tmp_path / "zendesk.csv"
    export.write_text(RICH_EXPORT, encoding="utf-8")
    result = cli("import", export, "--map", "id=Ticket", "--quiet")
    assert result.exit_code == 0, result.output
    assert "read 3 of 3 descriptions as HTML" in result.stderr and "read 2 of 3 solutions as HTML" in result.stderr
    monkeypatch.setenv("TICKETREC_MODEL", str(tiny_model[0]))
    monkeypatch.setenv("TICKETREC_CANDIDATES", "0")
    assert cli("index").exit_code == 0
    answer = json.loads(cli("recommend", "--subject", "compressor trip", "-k", 3, "--json").output)
    z1 = next(r["ticket"] for r in answer["results"] if r["ticket"]["id"] == "Z1")
    assert z1["description"] == "Tripped twice at start.\n\n  * bearing alarm\n  * high vibration"
    assert z1["solution"] == "Re-align the coupling and check the bearing."
    app = create_app({"TESTING": True, "WTF_CSRF_ENABLED": False, "TICKETREC_SETTINGS": Settings.from_env()})
    page = app.test_client().post("/", data={"subject": "compressor trip", "description": ""}).get_data(as_text=True)
    assert "Bleed the filter housing." in page and "Stem stuck at 40% load." in page
    assert "&lt;p&gt;" not in page and "nbsp" not in page and "color:#333" not in page
    assert json.loads(cli("search", "style color", "--json").output)["hits"] == []  # no tag or style word is a term
    result = cli("import", export, "--map", "id=Ticket", "--html", "no", "--quiet")  # as written, on request
    assert result.exit_code == 0 and "as HTML" not in result.stderr and cli("index").exit_code == 0
    assert [h["id"] for h in json.loads(cli("search", "style color", "--json").output)["hits"]] == ["Z1"]


def test_import_reads_an_excel_workbook(cli, tmp_path):
    from openpyxl import Workbook

    workbook = Workbook()
    for row in (["Number", "Short description", "Resolution notes"], [10001, "Printer jams", "New roller."],
                ["INC-2", "VPN drops", None]):
        workbook.active.append(row)
    workbook.save(tmp_path / "incidents.xlsx")
    result = cli("import", tmp_path / "incidents.xlsx", "--map", "id=Number", "--map", "subject=Short description",
                 "--map", "solution=Resolution notes", "--quiet")
    assert result.exit_code == 0, result.output
    assert "imported 2 tickets" in result.output and stats(cli)["tickets"] == 2
    found = json.loads(cli("search", "printer roller", "--json").stdout)["hits"]  # no index yet: FTS5, a note
    assert [(h["id"], h["solution"]) for h in found] == [("10001", "New roller.")]


def test_import_with_prune_makes_the_knowledge_base_the_export(cli, tmp_path):
    """A nightly full export synced with --prune: tickets gone from the export leave the store (with the pairs
    naming them) in the import's transaction; without --yes and no one to ask, nothing changes."""
    first = tmp_path / "monday.csv"
    first.write_text("id,subject\nA,Pump trips\nB,Valve leaks\nC,Fan noise\n", encoding="utf-8")
    assert cli("import", first, "--quiet").exit_code == 0
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"type": "query", "id": "q1", "subject": "valve"}\n'
                     '{"type": "pair", "query_id": "q1", "ticket_id": "B", "score": 5}\n', encoding="utf-8")
    assert cli("import", pairs, "--quiet").exit_code == 0
    second = tmp_path / "tuesday.csv"
    second.write_text("id,subject\nA,Pump trips at start\nC,Fan noise\nD,Belt slips\n", encoding="utf-8")
    refused = cli("import", second, "--prune", "--quiet")
    assert refused.exit_code == 1 and "--prune removes 1 ticket that the files do not hold (B)" in refused.output
    assert "add --yes (nothing was changed)" in refused.output and stats(cli)["tickets"] == 3
    result = cli("import", second, "--prune", "--yes", "--quiet")
    assert result.exit_code == 0, result.output
    assert "imported 3 tickets, 0 queries, 0 labelled pairs; removed 1 ticket the files do not hold (with 1 labelled " \
           "pair, 0 feedback judgements); the knowledge base now holds 3 tickets" in result.output
    assert stats(cli) | {"feedback": 0} == {"tickets": 3, "queries": 1, "pairs": 0, "feedback": 0}
    empty = tmp_path / "pairs-only.jsonl"
    empty.write_text('{"type": "query", "id": "q2", "subject": "belt"}\n', encoding="utf-8")
    nothing = cli("import", empty, "--prune", "--yes", "--quiet")
    assert nothing.exit_code == 1 and "it holds none; nothing was imported" in nothing.output
    assert stats(cli)["tickets"] == 3


GERMAN = ["Drucker im {n}. Stock druckt nicht mehr", "Seit dem Update druckt der Drucker keine Seiten mehr; die "
          "Warteschlange zeigt die Aufträge, aber nichts passiert.", "Treiber neu installiert, danach lief alles wieder."]


def test_import_says_when_the_tickets_do_not_read_as_english(cli, tmp_path):
    """BM25's stop words and stems and the packaged encoder are English: a German knowledge base is told so once, at
    import; an English one is not."""
    german = tmp_path / "de.csv"
    german.write_text("id,subject,description,solution\n" + "".join(
        f'D{n},"{GERMAN[0].format(n=n)}","{GERMAN[1]}","{GERMAN[2]}"\n' for n in range(1, 25)), encoding="utf-8")
    result = cli("import", german, "--quiet")
    assert result.exit_code == 0, result.output
    assert "these tickets do not read as English (0% of their words are English stop words" in result.stderr
    assert 'README, "Languages"' in result.stderr
    english = tmp_path / "en.jsonl"
    assert cli("synth", "--tickets", 40, "--queries", 0, "--out", english).exit_code == 0
    result = cli("import", english, "--quiet")
    assert result.exit_code == 0 and "English" not in result.stderr
