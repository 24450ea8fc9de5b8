"""`ticketrec export`: the knowledge base as JSONL that `ticketrec import` reads back into the same store — tickets
with metadata, queries, labelled pairs and the engineers' feedback (who, when, which versions) — from one snapshot,
never half-written, never with accounts or tokens; feedback imported twice is stored once."""
from __future__ import annotations

import itertools
import json
import threading

import pytest
from click.testing import CliRunner

from recommender.cli import main
from recommender.data.exporters import export_jsonl
from recommender.data.importers import load
from recommender.data.records import LabeledPair, Query, Ticket
from recommender.data.store import Dataset, Feedback, Store
from recommender.errors import InputError, TicketrecError

TICKETS = [
    Ticket("T-1", "Pump seal leak", "Oil drips from the seal.\nTwice a day.", "Replaced the seal.",
           {"status": "CLOSED", "priority": 2, "tags": ["pump", "seal"]}),
    Ticket("T-2", "Fan noise", "", "", {}),
    Ticket("T-3", "Valve <b>sticks</b> at 40 % \u2014 naïve", "Ünïcode and \"quotes\" and a tab\there.", "Cleaned.", {}),
]


def filled_store(path) -> Store:
    store = Store(path, clock=lambda: 1_700_000_000.0)
    store.import_dataset(Dataset(TICKETS, [Query("seal leaking", "pump drips", "Q-1")],
                                 [LabeledPair("Q-1", "T-1", 5.0), LabeledPair("Q-1", "T-2", 1.0)], "kb"))
    store.add_user("alice", "correct horse battery")
    store.create_token("alice", "tickets")
    store.add_feedback(Feedback("pump leak", "oil under the pump", "T-1", "YES", "m1", "i1", 1_700_000_100.5,
                                user_name="alice"))
    store.add_feedback(Feedback("fan", "", "T-2", "NO", created_at=1_700_000_200.0))
    return store


def contents(store: Store) -> tuple:
    """Everything an export carries, without ids or the import's own times and sources."""
    return (list(store.iter_tickets()), store.queries(),
            sorted((p.query_id, p.ticket_id, p.score) for p in store.pairs()),
            [(f.query_subject, f.query_description, f.ticket_id, f.label, f.model_version, f.index_version,
              f.created_at, f.user_name) for f in store.feedback()])


def test_an_export_imports_back_into_the_same_knowledge_base(tmp_path):
    source = filled_store(tmp_path / "a.sqlite3")
    counts = export_jsonl(source, tmp_path / "kb.jsonl")
    assert counts == {"tickets": 3, "queries": 1, "pairs": 2, "feedback": 2}
    target = Store(tmp_path / "b.sqlite3")
    written = target.import_dataset(load(tmp_path / "kb.jsonl", html="no"))
    assert written["feedback"] == 2
    assert contents(target) == contents(source)
    assert not target.has_users() and target.tokens() == []  # accounts and tokens never leave the store
    text = (tmp_path / "kb.jsonl").read_text(encoding="utf-8")
    assert "correct horse" not in text and "scrypt" not in text and "trk_" not in text

    again = target.import_dataset(load(tmp_path / "kb.jsonl", html="no"))  # the same export twice
    assert again["feedback"] == 0 and contents(target) == contents(source)


def test_feedback_without_a_time_imported_twice_is_stored_once(tmp_path):
    path = tmp_path / "hand.jsonl"
    lines = [{"type": "ticket", "id": "T-1", "subject": "Pump"},
             {"type": "feedback", "subject": "pump leak", "ticket_id": "T-1", "label": "YES", "user": "bob"},
             {"type": "feedback", "subject": "pump leak", "ticket_id": "T-1", "label": "NO", "user": "bob"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    ticks = itertools.count()
    store = Store(tmp_path / "kb.sqlite3", clock=lambda: 1_700_000_000.0 + next(ticks))
    assert store.import_dataset(load(path))["feedback"] == 2
    first = [(f.label, f.created_at) for f in store.feedback()]
    assert store.import_dataset(load(path))["feedback"] == 0  # a later import's time does not make it new
    assert [(f.label, f.created_at) for f in store.feedback()] == first
    lines[1]["user"] = "carol"  # another engineer's judgement is another judgement
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert store.import_dataset(load(path))["feedback"] == 1


def test_without_feedback_the_export_holds_none(tmp_path):
    counts = export_jsonl(filled_store(tmp_path / "a.sqlite3"), tmp_path / "kb.jsonl", feedback=False)
    assert counts["feedback"] == 0
    kinds = [json.loads(line)["type"] for line in (tmp_path / "kb.jsonl").read_text().splitlines()]
    assert kinds == ["ticket"] * 3 + ["query"] + ["pair"] * 2


def test_a_failed_export_leaves_no_file_and_the_old_one_whole(tmp_path, monkeypatch):
    store = filled_store(tmp_path / "a.sqlite3")
    out = tmp_path / "kb.jsonl"
    out.write_text("the previous export\n")

    def broken_feedback(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Store, "feedback", broken_feedback)  # a full disk cannot be caused here
    with pytest.raises(TicketrecError, match="No space left on device"):
        export_jsonl(store, out)
    assert out.read_text() == "the previous export\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".") or "kb.jsonl" in p.name] == ["kb.jsonl"]


@pytest.mark.parametrize("end", ["", "-wal"])
def test_an_export_never_replaces_the_database_it_reads(tmp_path, end):
    store = filled_store(tmp_path / "a.sqlite3")
    before = contents(store)
    with pytest.raises(InputError, match="own database"):
        export_jsonl(store, tmp_path / ("a.sqlite3" + end))
    assert contents(Store(tmp_path / "a.sqlite3")) == before


def test_the_export_is_one_snapshot_while_another_connection_writes(tmp_path):
    """Tickets written by another process during an export are either all in it or none: a pair or judgement never
    names a ticket the file lacks."""
    path = tmp_path / "a.sqlite3"
    store = filled_store(path)
    started, done = threading.Event(), threading.Event()
    original = Store.iter_tickets

    def slow_iter(self, *args, **kwargs):
        for ticket in original(self, *args, **kwargs):
            started.set()
            done.wait(5)
            yield ticket

    def writer():
        started.wait(5)
        with Store(path) as other:
            other.import_dataset(Dataset([Ticket("T-9", "Late ticket", "written during the export")],
                                         [Query("late", "", "Q-9")], [LabeledPair("Q-9", "T-9", 5.0)], "late"))
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    Store.iter_tickets = slow_iter
    try:
        counts = export_jsonl(store, tmp_path / "kb.jsonl")
    finally:
        Store.iter_tickets = original
        thread.join()
    assert counts == {"tickets": 3, "queries": 1, "pairs": 2, "feedback": 2}  # T-9, Q-9 and its pair came later
    assert Store(path).stats()["tickets"] == 4


@pytest.mark.parametrize("line, says", [
    ({"type": "feedback", "subject": "s", "ticket_id": "T-1", "label": "MAYBE"}, "label"),
    ({"type": "feedback", "subject": "s", "ticket_id": "T-404", "label": "YES"}, "T-404"),
    ({"type": "feedback", "subject": "s", "ticket_id": "T-1", "label": "YES", "created_at": "yesterday"},
     "created_at"),
    ({"type": "feedback", "subject": "", "ticket_id": "T-1", "label": "YES"}, "neither subject nor description"),
    ({"type": "feedback", "subject": "s", "ticket_id": "T-1", "label": "YES", "user": 7}, "'user'"),
])
def test_a_bad_feedback_line_stops_the_import_naming_it(tmp_path, line, says):
    path = tmp_path / "kb.jsonl"
    path.write_text(json.dumps({"type": "ticket", "id": "T-1", "subject": "Pump"}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(InputError, match="line 2") as error:
        load(path)
    assert says in str(error.value)


def test_the_cli_exports_and_imports_into_a_fresh_home(tmp_path, monkeypatch):
    filled_store(tmp_path / "old" / "ticketrec.sqlite3").close()
    runner = CliRunner()
    monkeypatch.delenv("TICKETREC_DB", raising=False)
    monkeypatch.setenv("TICKETREC_HOME", str(tmp_path / "old"))
    exported = runner.invoke(main, ["export", str(tmp_path / "kb.jsonl"), "--quiet"])
    assert exported.exit_code == 0, exported.output
    assert "wrote 3 tickets, 1 query, 2 labelled pairs, 2 feedback judgements" in exported.output
    monkeypatch.setenv("TICKETREC_HOME", str(tmp_path / "new"))
    imported = runner.invoke(main, ["import", str(tmp_path / "kb.jsonl"), "--html", "no", "--quiet"])
    assert imported.exit_code == 0, imported.output
    assert "2 feedback judgements" in imported.output
    again = runner.invoke(main, ["import", str(tmp_path / "kb.jsonl"), "--html", "no", "--quiet"])
    assert "0 feedback judgements (of 2; the others were stored already)" in again.output
    with Store(tmp_path / "old" / "ticketrec.sqlite3") as old, Store(tmp_path / "new" / "ticketrec.sqlite3") as new:
        assert contents(new) == contents(old)
    (tmp_path / "a-file").write_text("")
    refused = runner.invoke(main, ["export", str(tmp_path / "a-file" / "kb.jsonl"), "--quiet"])
    assert refused.exit_code == 1 and "cannot write" in refused.output and "nothing was written" in refused.output
