"""The SQLite schema is versioned (PRAGMA user_version) and migrated in order, in one transaction.

The "release 0.1.0" fixture is the DDL exactly as that release's `store.py` ran it (copied from the commit
before versioning, 05bbbe6), with a few rows written the way it wrote them: a database made by it must open
with this code, rows and full-text search intact.
"""
import sqlite3

import pytest

from recommender.data import migrations
from recommender.data.migrations import MIGRATIONS, database_version, migrate, statements
from recommender.data.store import SCHEMA_VERSION, Store
from recommender.errors import TicketrecError

#: release 0.1.0's `_SCHEMA`, verbatim; it then wrote schema_meta ('schema_version', '1') and left user_version 0.
RELEASE_0_1_0_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tickets (
    pk INTEGER PRIMARY KEY,  -- stable rowid: the FTS5 table points at it, and VACUUM cannot renumber it
    id TEXT NOT NULL UNIQUE,
    subject TEXT NOT NULL,
    description TEXT NOT NULL,
    solution TEXT NOT NULL DEFAULT '',
    metadata TEXT NOT NULL DEFAULT '{}',
    source TEXT NOT NULL DEFAULT '',
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS tickets_updated ON tickets(updated_at);
CREATE TABLE IF NOT EXISTS queries (
    id TEXT PRIMARY KEY,
    subject TEXT NOT NULL,
    description TEXT NOT NULL,
    source TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS pairs (
    query_id TEXT NOT NULL REFERENCES queries(id),
    ticket_id TEXT NOT NULL REFERENCES tickets(id),
    score REAL NOT NULL CHECK (score BETWEEN 1 AND 5),
    source TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (query_id, ticket_id)
);
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    query_key TEXT NOT NULL,
    query_subject TEXT NOT NULL,
    query_description TEXT NOT NULL,
    ticket_id TEXT NOT NULL,
    label TEXT NOT NULL CHECK (label IN ('YES', 'REL', 'NO')),
    score REAL NOT NULL,
    model_version TEXT NOT NULL DEFAULT '',
    index_version TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS feedback_query ON feedback(query_key);
CREATE VIRTUAL TABLE IF NOT EXISTS tickets_fts USING fts5(
    subject, description, solution, content='tickets', content_rowid='pk', tokenize='porter unicode61'
);
CREATE TRIGGER IF NOT EXISTS tickets_ai AFTER INSERT ON tickets BEGIN
    INSERT INTO tickets_fts(rowid, subject, description, solution)
    VALUES (new.rowid, new.subject, new.description, new.solution);
END;
CREATE TRIGGER IF NOT EXISTS tickets_ad AFTER DELETE ON tickets BEGIN
    INSERT INTO tickets_fts(tickets_fts, rowid, subject, description, solution)
    VALUES ('delete', old.rowid, old.subject, old.description, old.solution);
END;
CREATE TRIGGER IF NOT EXISTS tickets_au AFTER UPDATE ON tickets BEGIN
    INSERT INTO tickets_fts(tickets_fts, rowid, subject, description, solution)
    VALUES ('delete', old.rowid, old.subject, old.description, old.solution);
    INSERT INTO tickets_fts(rowid, subject, description, solution)
    VALUES (new.rowid, new.subject, new.description, new.solution);
END;
"""


def _release_0_1_0_database(path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript("BEGIN IMMEDIATE;" + RELEASE_0_1_0_SCHEMA + "COMMIT;")
    conn.execute("INSERT INTO schema_meta VALUES ('schema_version', ?)", ("1",))
    conn.executemany("INSERT INTO tickets (id, subject, description, solution, metadata, source, updated_at) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?)",
                     [("T1", "Pump seal leak", "Oil leaks at the pump seal.", "Replace the seal.", "{}", "kb", 1.0),
                      ("T2", "Turbine vibration", "High vibration at start.", "Balance the rotor.", "{}", "kb", 2.0)])
    conn.execute("INSERT INTO queries (id, subject, description, source) VALUES ('Q1', 'leak', 'pump leaks', 'kb')")
    conn.execute("INSERT INTO pairs (query_id, ticket_id, score, source) VALUES ('Q1', 'T1', 5.0, 'kb')")
    conn.execute("INSERT INTO feedback (query_key, query_subject, query_description, ticket_id, label, score, "
                 "created_at) VALUES ('k', 'leak', 'pump leaks', 'T1', 'YES', 5.0, 3.0)")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    conn.close()


def _schema(path) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return sorted(conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall(), key=str)
    finally:
        conn.close()


def test_a_release_0_1_0_database_opens_with_its_rows_and_the_current_version(tmp_path):
    path = tmp_path / "old.sqlite3"
    _release_0_1_0_database(path)
    before = _schema(path)
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION == len(MIGRATIONS)
        assert store.stats() == {"tickets": 2, "queries": 1, "pairs": 1, "feedback": 1}
        assert [t.subject for t in store.get_tickets(["T1", "T2"])] == ["Pump seal leak", "Turbine vibration"]
        assert [(p.query_id, p.ticket_id, p.score) for p in store.pairs()] == [("Q1", "T1", 5.0)]
        assert [(f.ticket_id, f.label) for f in store.feedback()] == [("T1", "YES")]
        hits = store.conn.execute("SELECT t.id FROM tickets_fts JOIN tickets t ON t.pk = tickets_fts.rowid "
                                  "WHERE tickets_fts MATCH 'seal'").fetchall()
        assert [h[0] for h in hits] == ["T1"]  # the FTS5 table and its triggers came along
    if SCHEMA_VERSION == 1:
        assert _schema(path) == before  # version 1 is that release's schema: nothing to change but the stamp


def test_a_fresh_database_gets_version_1_ddl_and_the_stamp(tmp_path):
    Store(tmp_path / "new.sqlite3").close()
    _release_0_1_0_database(tmp_path / "old.sqlite3")
    Store(tmp_path / "old.sqlite3").close()
    assert _schema(tmp_path / "new.sqlite3") == _schema(tmp_path / "old.sqlite3")
    conn = sqlite3.connect(tmp_path / "new.sqlite3")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("SELECT value FROM schema_meta").fetchall() == [(str(SCHEMA_VERSION),)]
    conn.close()


def test_missing_migrations_run_in_order_and_keep_the_rows(tmp_path, monkeypatch):
    path = tmp_path / "old.sqlite3"
    _release_0_1_0_database(path)
    monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS + (
        "ALTER TABLE tickets ADD COLUMN product TEXT NOT NULL DEFAULT '';",
        "UPDATE tickets SET product = 'pump' WHERE id = 'T1';\nCREATE INDEX tickets_product ON tickets(product);",
    ))
    conn = sqlite3.connect(path, isolation_level=None)
    assert migrate(conn, path) == 1 and database_version(conn) == len(MIGRATIONS) + 2
    assert conn.execute("SELECT id, product FROM tickets ORDER BY pk").fetchall() == [("T1", "pump"), ("T2", "")]
    assert migrate(conn, path) == len(MIGRATIONS) + 2  # nothing left to do
    conn.close()


def test_a_failing_migration_rolls_every_one_back(tmp_path, monkeypatch):
    path = tmp_path / "old.sqlite3"
    _release_0_1_0_database(path)
    before = _schema(path)
    monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS + (
        "ALTER TABLE tickets ADD COLUMN product TEXT NOT NULL DEFAULT '';",
        "CREATE TABLE later (x);\nINSERT INTO no_such_table VALUES (1);",
    ))
    with pytest.raises(TicketrecError, match="not a usable ticketrec database"):
        Store(path)
    assert _schema(path) == before
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 0  # the stamp was rolled back too
    assert conn.execute("SELECT COUNT(*) FROM tickets").fetchone()[0] == 2
    conn.close()


@pytest.mark.parametrize("how", ["user_version", "schema_meta"])
def test_a_database_newer_than_the_code_is_refused_untouched(tmp_path, how):
    path = tmp_path / "kb.sqlite3"
    Store(path).close()
    conn = sqlite3.connect(path)
    if how == "user_version":
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    else:  # what release 0.1.0 reads, e.g. set by a newer ticketrec
        conn.execute("UPDATE schema_meta SET value = ?", (str(SCHEMA_VERSION + 1),))
    conn.commit()
    conn.close()
    before = _schema(path)
    with pytest.raises(TicketrecError, match=f"schema version {SCHEMA_VERSION + 1}, newer than this ticketrec"):
        Store(path)
    assert _schema(path) == before


def test_statements_keep_a_trigger_body_whole():
    parts = statements(RELEASE_0_1_0_SCHEMA)
    assert len(parts) == 11 and sum(p.startswith("CREATE TRIGGER") for p in parts) == 3
    assert all(sqlite3.complete_statement(p) for p in parts)
    with pytest.raises(ValueError, match="incomplete"):
        statements("CREATE TABLE x (a);\nCREATE TABLE y (")
