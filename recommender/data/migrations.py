"""The SQLite schema's history: ordered migrations, the version in `PRAGMA user_version`.

MIGRATIONS[i] takes a database from version i to i + 1. Version 1 is the schema as release 0.1.0 created it
(every statement `IF NOT EXISTS`, so a 0.1.0 database, which has user_version 0, passes through it unchanged).
Opening a database applies the missing migrations in one transaction; a database newer than this code is
refused. The version is also kept in `schema_meta` (key `schema_version`), which release 0.1.0 reads to refuse
a newer database. To change the schema, append a migration; never edit one that was released.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

from ..errors import TicketrecError

#: Version 1: the tables, indexes, FTS5 table and triggers of release 0.1.0.
_V1 = """
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

#: Version 2 (issue 14): engineers' accounts, their API tokens (only a SHA-256 of each is kept), and who gave
#: each feedback row ('' for rows given before accounts existed, or while there were none).
_V2 = """
CREATE TABLE users (
    name TEXT PRIMARY KEY,
    password_hash TEXT NOT NULL,  -- werkzeug.security (scrypt)
    created_at REAL NOT NULL
);
CREATE TABLE api_tokens (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user_name TEXT NOT NULL REFERENCES users(name) ON DELETE CASCADE,
    token_sha256 TEXT NOT NULL UNIQUE,
    scope TEXT NOT NULL DEFAULT 'write' CHECK (scope IN ('read', 'write')),
    created_at REAL NOT NULL,
    revoked_at REAL
);
CREATE INDEX api_tokens_user ON api_tokens(user_name);
ALTER TABLE feedback ADD COLUMN user_name TEXT NOT NULL DEFAULT '';
"""

#: Version 3: API tokens of scope 'tickets', which may also add, replace and remove the knowledge base's tickets
#: (a help desk's integration keeping it current). SQLite cannot change a CHECK constraint in place, so the table is
#: rebuilt with its rows (nothing references it), and its AUTOINCREMENT counter carried over: the id of a deleted
#: token is never given again.
_V3 = """
CREATE TABLE api_tokens_v3 (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user_name TEXT NOT NULL REFERENCES users(name) ON DELETE CASCADE,
    token_sha256 TEXT NOT NULL UNIQUE,
    scope TEXT NOT NULL DEFAULT 'write' CHECK (scope IN ('read', 'write', 'tickets')),
    created_at REAL NOT NULL,
    revoked_at REAL
);
INSERT INTO api_tokens_v3 (id, user_name, token_sha256, scope, created_at, revoked_at)
    SELECT id, user_name, token_sha256, scope, created_at, revoked_at FROM api_tokens;
DELETE FROM sqlite_sequence WHERE name = 'api_tokens_v3';
INSERT INTO sqlite_sequence (name, seq) SELECT 'api_tokens_v3', seq FROM sqlite_sequence WHERE name = 'api_tokens';
DROP TABLE api_tokens;
ALTER TABLE api_tokens_v3 RENAME TO api_tokens;
CREATE INDEX api_tokens_user ON api_tokens(user_name);
"""

#: The migrations, in order: MIGRATIONS[i] brings version i to version i + 1.
MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3)


def schema_version() -> int:
    """The version this code writes: the number of migrations."""
    return len(MIGRATIONS)


def statements(script: str) -> list[str]:
    """The SQL statements of a script (a trigger's body stays one statement)."""
    out, buf = [], ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    if buf.strip():
        raise ValueError(f"incomplete SQL statement in a migration: {buf.strip()[:80]!r}")
    return out


def database_version(conn: sqlite3.Connection) -> int:
    """The schema version of an open database: `PRAGMA user_version`, or what `schema_meta` says when that is more
    (release 0.1.0 wrote only `schema_meta`)."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_meta'").fetchone():
        row = conn.execute("SELECT value FROM schema_meta WHERE key = 'schema_version'").fetchone()
        if row is not None and str(row[0]).isdigit():
            version = max(version, int(row[0]))
    return version


def _refuse_newer(version: int, path: Path | str) -> None:
    if version > schema_version():
        raise TicketrecError(f"the database {path} has schema version {version}, newer than this ticketrec "
                             f"({schema_version()}); upgrade ticketrec or point TICKETREC_DB elsewhere")


def migrate(conn: sqlite3.Connection, path: Path | str = "the database") -> int:
    """Apply the migrations `conn`'s database lacks, all in one transaction (any failure rolls every one back);
    returns the version it had. TicketrecError when it is newer than this code. `conn` must be in autocommit
    mode (isolation_level=None) with no transaction open."""
    found = database_version(conn)
    _refuse_newer(found, path)
    if found == schema_version() and int(conn.execute("PRAGMA user_version").fetchone()[0]) == found:
        return found
    conn.execute("BEGIN IMMEDIATE")
    try:
        found = database_version(conn)  # again under the write lock: another process may have migrated it
        _refuse_newer(found, path)
        for migration in MIGRATIONS[found:]:
            for statement in statements(migration):
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {schema_version():d}")
        conn.execute("INSERT INTO schema_meta (key, value) VALUES ('schema_version', ?) "
                     "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (str(schema_version()),))
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return found
