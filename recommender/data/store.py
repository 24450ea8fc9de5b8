"""The SQLite store: tickets, queries, labelled pairs, feedback, and the FTS5 table the BM25 pre-filter reads.

Every write runs in one transaction, so a failed import leaves the database exactly as it was.
"""
from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from ..errors import InputError, TicketrecError
from .migrations import MIGRATIONS, migrate
from .records import LabeledPair, Query, Ticket

#: The schema version this code writes (`PRAGMA user_version`; the migrations are in data/migrations.py).
SCHEMA_VERSION = len(MIGRATIONS)


@dataclass
class Dataset:
    """What one import brings: tickets, queries and their labelled pairs."""

    tickets: list[Ticket] = field(default_factory=list)
    queries: list[Query] = field(default_factory=list)
    pairs: list[LabeledPair] = field(default_factory=list)
    source: str = ""
    #: Optional facts about a pair, keyed (query_id, ticket_id), e.g. SemEval's {"ir_rank": 3} (the external
    #: search engine's order, which evaluation needs for the IR baseline). Not written to the database.
    pair_meta: dict[tuple[str, str], dict] = field(default_factory=dict)

    def ticket_map(self) -> dict[str, Ticket]:
        return {t.id: t for t in self.tickets}

    def query_map(self) -> dict[str, Query]:
        return {q.id: q for q in self.queries}


@dataclass
class Feedback:
    """A support engineer's judgement of one recommendation."""

    query_subject: str
    query_description: str
    ticket_id: str
    label: str  # YES | REL | NO
    model_version: str = ""
    index_version: str = ""
    created_at: float = 0.0
    id: int | None = None


def query_key(subject: str, description: str) -> str:
    """A stable key for 'the same query', so repeated queries show the feedback already given."""
    import hashlib

    norm = " ".join(subject.lower().split()) + "\x1f" + " ".join(description.lower().split())
    return hashlib.sha1(norm.encode("utf-8")).hexdigest()


def _with_ids(records: Iterable, kind: str, source: str) -> Iterator:
    """`records`, refusing one without an id (SQLite would store a NULL text primary key)."""
    for record in records:
        if record.id is None or not str(record.id).strip():
            raise InputError(f"{source or 'import'}: a {kind} without an id ({record.subject!r}); give every "
                             f"{kind} an id (nothing was imported)")
        yield record


class Store:
    """The SQLite database of one ticketrec home."""

    def __init__(self, path: str | Path, clock: Callable[[], float] = time.time):
        """`clock` gives the timestamps of imports and feedback (seconds since the epoch); tests pass their own."""
        self.path = Path(path)
        self.clock = clock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn: sqlite3.Connection | None = None
        self._migrate()

    # -- connection -------------------------------------------------------
    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            try:
                conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            except sqlite3.Error as exc:
                raise TicketrecError(f"cannot open the database {self.path}: {exc}") from exc
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            self._conn = conn
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE … COMMIT, or ROLLBACK on any exception (also KeyboardInterrupt)."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")

    def _migrate(self) -> None:
        """Bring the database to SCHEMA_VERSION (missing migrations in one transaction); refuse a newer one."""
        try:
            migrate(self.conn, self.path)
        except sqlite3.DatabaseError as exc:
            raise TicketrecError(f"{self.path} is not a usable ticketrec database ({exc}); move it away or set TICKETREC_DB") from exc

    @property
    def schema_version(self) -> int:
        """The database's schema version (`PRAGMA user_version`)."""
        return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

    # -- writing ----------------------------------------------------------
    def import_dataset(self, data: Dataset) -> dict[str, int]:
        """Write a parsed dataset in one transaction; tickets and queries with known ids are updated.

        A pair that names a query or ticket found neither in `data` nor in the store aborts the whole import.
        """
        now = self.clock()
        with self.transaction() as conn:
            conn.executemany(
                "INSERT INTO tickets (id, subject, description, solution, metadata, source, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET subject = excluded.subject, "
                "description = excluded.description, solution = excluded.solution, metadata = excluded.metadata, "
                "source = excluded.source, updated_at = excluded.updated_at "
                "WHERE subject IS NOT excluded.subject OR description IS NOT excluded.description "
                "OR solution IS NOT excluded.solution OR metadata IS NOT excluded.metadata",
                (
                    (t.id, t.subject, t.description, t.solution, json.dumps(t.metadata, sort_keys=True), data.source, now)
                    for t in _with_ids(data.tickets, "ticket", data.source)
                ),
            )
            conn.executemany(
                "INSERT INTO queries (id, subject, description, source) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET subject = excluded.subject, description = excluded.description",
                ((q.id, q.subject, q.description, data.source) for q in _with_ids(data.queries, "query", data.source)),
            )
            for p in data.pairs:
                try:
                    conn.execute(
                        "INSERT INTO pairs (query_id, ticket_id, score, source) VALUES (?, ?, ?, ?) "
                        "ON CONFLICT(query_id, ticket_id) DO UPDATE SET score = excluded.score",
                        (p.query_id, p.ticket_id, float(p.score), data.source),
                    )
                except sqlite3.IntegrityError as exc:
                    raise InputError(
                        f"{data.source or 'import'}: pair ({p.query_id}, {p.ticket_id}, {p.score}) names an unknown "
                        f"query or ticket, or its score is outside 1-5 ({exc}); nothing was imported"
                    ) from exc
        return {"tickets": len(data.tickets), "queries": len(data.queries), "pairs": len(data.pairs)}

    def add_feedback(self, fb: Feedback) -> int:
        """Store one judgement; returns its id."""
        from .records import LABEL_SCORES

        if fb.label not in LABEL_SCORES:
            raise InputError(f"feedback label must be one of YES, REL, NO, not {fb.label!r}")
        if self.get_ticket(fb.ticket_id) is None:
            raise InputError(f"no ticket with id {fb.ticket_id!r}")
        with self.transaction() as conn:
            cur = conn.execute(
                "INSERT INTO feedback (query_key, query_subject, query_description, ticket_id, label, score, "
                "model_version, index_version, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    query_key(fb.query_subject, fb.query_description), fb.query_subject, fb.query_description,
                    fb.ticket_id, fb.label, LABEL_SCORES[fb.label], fb.model_version, fb.index_version,
                    fb.created_at or self.clock(),
                ),
            )
            return int(cur.lastrowid)

    # -- reading ----------------------------------------------------------
    @staticmethod
    def _ticket(row: sqlite3.Row) -> Ticket:
        return Ticket(row["id"], row["subject"], row["description"], row["solution"], json.loads(row["metadata"]))

    def get_ticket(self, ticket_id: str) -> Ticket | None:
        row = self.conn.execute("SELECT * FROM tickets WHERE id = ?", (ticket_id,)).fetchone()
        return None if row is None else self._ticket(row)

    def get_tickets(self, ids: Sequence[str]) -> list[Ticket]:
        """Tickets in the order of `ids` (unknown ids are skipped)."""
        found: dict[str, Ticket] = {}
        for start in range(0, len(ids), 900):
            chunk = list(ids[start : start + 900])
            marks = ",".join("?" * len(chunk))
            for row in self.conn.execute(f"SELECT * FROM tickets WHERE id IN ({marks})", chunk):
                found[row["id"]] = self._ticket(row)
        return [found[i] for i in ids if i in found]

    def iter_tickets(self, batch: int = 2000, since: float | None = None) -> Iterator[Ticket]:
        """All tickets (or those updated after `since`) in insertion order."""
        sql = "SELECT * FROM tickets WHERE pk > ?" + (" AND updated_at > ?" if since is not None else "")
        last = 0
        while True:
            args = (last, since) if since is not None else (last,)
            rows = self.conn.execute(sql + " ORDER BY pk LIMIT ?", (*args, batch)).fetchall()
            if not rows:
                return
            for row in rows:
                yield self._ticket(row)
            last = rows[-1]["pk"]

    def ticket_ids(self) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT id FROM tickets ORDER BY pk")]

    def ticket_versions(self) -> dict[str, float]:
        """ticket id → last update time, for incremental reindexing."""
        return {r[0]: r[1] for r in self.conn.execute("SELECT id, updated_at FROM tickets")}

    def queries(self) -> list[Query]:
        return [Query(r["subject"], r["description"], r["id"]) for r in self.conn.execute("SELECT * FROM queries ORDER BY rowid")]

    def pairs(self) -> list[LabeledPair]:
        return [LabeledPair(r[0], r[1], r[2]) for r in self.conn.execute("SELECT query_id, ticket_id, score FROM pairs ORDER BY rowid")]

    def dataset(self) -> Dataset:
        """The whole store as a Dataset (tickets, queries, pairs)."""
        return Dataset(list(self.iter_tickets()), self.queries(), self.pairs(), source=str(self.path))

    def feedback(self, key: str | None = None) -> list[Feedback]:
        sql, args = "SELECT * FROM feedback", ()
        if key is not None:
            sql, args = sql + " WHERE query_key = ?", (key,)
        return [
            Feedback(r["query_subject"], r["query_description"], r["ticket_id"], r["label"], r["model_version"],
                     r["index_version"], r["created_at"], r["id"])
            for r in self.conn.execute(sql + " ORDER BY id", args)
        ]

    def stats(self) -> dict[str, int]:
        """Counts of tickets, queries, labelled pairs and feedback."""
        c = self.conn
        return {
            "tickets": c.execute("SELECT COUNT(*) FROM tickets").fetchone()[0],
            "queries": c.execute("SELECT COUNT(*) FROM queries").fetchone()[0],
            "pairs": c.execute("SELECT COUNT(*) FROM pairs").fetchone()[0],
            "feedback": c.execute("SELECT COUNT(*) FROM feedback").fetchone()[0],
        }

    def last_update(self) -> float:
        """Time of the newest ticket change (0 for an empty store)."""
        return float(self.conn.execute("SELECT COALESCE(MAX(updated_at), 0) FROM tickets").fetchone()[0])
