"""The SQLite store: all-or-nothing imports, updates, FTS5 sync, stats, feedback, schema version."""
from __future__ import annotations

import sqlite3

import pytest

from recommender.errors import InputError, TicketrecError
from recommender.data.importers import load
from recommender.data.records import LabeledPair, Query, Ticket
from recommender.data.store import SCHEMA_VERSION, Dataset, Feedback, Store, query_key


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "kb.sqlite3")
    yield s
    s.close()


def small_kb() -> Dataset:
    return Dataset(
        [Ticket("T1", "Oil pressure low", "Alarm after filter change.", "Bleed the filter.", {"site": "A"}),
         Ticket("T2", "Valve sticks", "Valve stuck at 40%.", "Clean the stem.")],
        [Query("oil press low", "LO pressure falling", "Q1")],
        [LabeledPair("Q1", "T1", 5.0), LabeledPair("Q1", "T2", 1.0)],
        source="test",
    )


def fts_hits(store: Store, word: str) -> list[str]:
    rows = store.conn.execute("SELECT t.id FROM tickets_fts f JOIN tickets t ON t.rowid = f.rowid "
                              "WHERE tickets_fts MATCH ? ORDER BY t.id", (word,))
    return [r[0] for r in rows]


def test_import_and_read_back(store):
    counts = store.import_dataset(small_kb())
    assert counts == {"tickets": 2, "queries": 1, "pairs": 2, "feedback": 0}
    assert store.stats() == {"tickets": 2, "queries": 1, "pairs": 2, "feedback": 0}
    assert store.get_ticket("T1") == small_kb().tickets[0]
    assert [t.id for t in store.get_tickets(["T2", "nope", "T1"])] == ["T2", "T1"]
    assert store.queries() == small_kb().queries and store.pairs() == small_kb().pairs
    assert store.schema_version == SCHEMA_VERSION
    assert fts_hits(store, "stem") == ["T2"]


def test_reimport_updates_and_keeps_fts_in_sync(store):
    store.import_dataset(small_kb())
    changed = small_kb()
    changed.tickets[1] = Ticket("T2", "Valve sticks", "Valve stuck at 40%.", "Replace the actuator.")
    changed.pairs[1] = LabeledPair("Q1", "T2", 3.0)
    store.import_dataset(changed)
    assert store.stats()["tickets"] == 2
    assert store.get_ticket("T2").solution == "Replace the actuator."
    assert fts_hits(store, "stem") == [] and fts_hits(store, "actuator") == ["T2"]
    assert [p.score for p in store.pairs()] == [5.0, 3.0]


def test_unchanged_ticket_keeps_its_update_time(store):
    store.import_dataset(small_kb())
    before = store.ticket_versions()
    store.import_dataset(small_kb())
    assert store.ticket_versions() == before


def test_pair_with_unknown_ticket_rolls_back_everything(store):
    store.import_dataset(small_kb())
    before = (store.stats(), store.dataset().tickets)
    bad = Dataset([Ticket("T3", "New", "New ticket.", "Fix.")], [Query("q", "d", "Q2")],
                  [LabeledPair("Q2", "T3", 5.0), LabeledPair("Q2", "T404", 1.0)], source="bad.jsonl")
    with pytest.raises(InputError, match="bad.jsonl.*T404.*nothing was imported"):
        store.import_dataset(bad)
    assert (store.stats(), store.dataset().tickets) == before
    assert fts_hits(store, "new") == []


def test_bad_record_in_a_file_leaves_an_existing_kb_unchanged(tmp_path, store):
    store.import_dataset(small_kb())
    before = store.stats()
    path = tmp_path / "broken.jsonl"
    path.write_text('{"type": "ticket", "id": "T9", "subject": "a", "description": "b", "solution": "c"}\n'
                    '{"type": "pair", "query_id": "Q1", "ticket_id": "T9", "score": 9}\n', encoding="utf-8")
    with pytest.raises(InputError, match="line 2"):
        store.import_dataset(load(path, known_query_ids=[q.id for q in store.queries()]))
    assert store.stats() == before and store.get_ticket("T9") is None


def test_interrupted_import_is_rolled_back(store):
    store.import_dataset(small_kb())
    before = store.stats()

    def tickets():
        yield Ticket("T7", "a", "b", "c")
        raise KeyboardInterrupt

    data = Dataset(source="x")
    data.tickets = tickets()  # a KeyboardInterrupt after the first ticket row was written
    with pytest.raises(KeyboardInterrupt):
        store.import_dataset(data)
    assert store.stats() == before and store.get_ticket("T7") is None


def test_record_without_id_is_an_input_error(store):
    with pytest.raises(InputError, match="query without an id"):
        store.import_dataset(Dataset([Ticket("T1", "a", "b", "c")], [Query("s", "d")], [], source="api"))
    with pytest.raises(InputError, match="ticket without an id"):
        store.import_dataset(Dataset([Ticket(" ", "a", "b", "c")], [], [], source="api"))
    assert store.stats() == {"tickets": 0, "queries": 0, "pairs": 0, "feedback": 0}


def test_store_reopens_with_data(tmp_path):
    with Store(tmp_path / "kb.sqlite3") as s:
        s.import_dataset(small_kb())
    with Store(tmp_path / "kb.sqlite3") as s:
        assert s.stats()["pairs"] == 2 and s.ticket_ids() == ["T1", "T2"]


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "kb.sqlite3"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    conn.commit()
    conn.close()
    with pytest.raises(TicketrecError, match="newer than this ticketrec"):
        Store(path)


def test_not_a_database_is_refused(tmp_path):
    path = tmp_path / "kb.sqlite3"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(TicketrecError, match="not a usable ticketrec database"):
        Store(path)


_HOLD_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
if sys.argv[2] == "exclusive":  # readers are shut out too (a tool in exclusive locking mode)
    conn.execute("PRAGMA locking_mode = EXCLUSIVE")
conn.execute("BEGIN IMMEDIATE")  # the write lock, as a long import holds it
conn.execute("UPDATE tickets SET subject = subject")
print("locked", flush=True)
sys.stdin.read()  # hold the lock until the test closes stdin
conn.execute("COMMIT")
"""


@pytest.mark.parametrize("lock", ["write", "exclusive"])
def test_a_locked_database_says_it_is_locked_not_unusable(tmp_path, monkeypatch, lock):
    import subprocess
    import sys

    path = tmp_path / "kb.sqlite3"
    with Store(path) as s:
        s.import_dataset(small_kb())
    monkeypatch.setattr(Store, "busy_timeout", 0.2)  # SQLite's wait for the lock, 30 s by default
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(path), lock], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(TicketrecError) as err:
            with Store(path) as s:  # a reader opens a WAL database under a writer; the write then waits
                s.import_dataset(small_kb())
        message = str(err.value)
        assert "is locked" in message and "SQLITE_BUSY" in message and "another ticketrec process" in message
        assert "retry when it finishes" in message and "not a usable" not in message and "\n" not in message
    finally:
        holder.communicate("", timeout=30)
    assert holder.returncode == 0
    with Store(path) as s:  # the lock is gone: the same calls work
        s.import_dataset(small_kb())
        assert s.stats()["tickets"] == 2


def test_feedback(store):
    store.import_dataset(small_kb())
    fid = store.add_feedback(Feedback("Oil  pressure", "low", "T1", "YES"))
    assert store.stats()["feedback"] == 1
    [fb] = store.feedback(query_key("oil pressure", "LOW"))
    assert fb.id == fid and fb.label == "YES"
    with pytest.raises(InputError, match="YES, REL, NO"):
        store.add_feedback(Feedback("a", "b", "T1", "MAYBE"))
    with pytest.raises(InputError, match="no ticket"):
        store.add_feedback(Feedback("a", "b", "T404", "NO"))
    assert store.stats()["feedback"] == 1
