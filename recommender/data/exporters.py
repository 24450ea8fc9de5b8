"""Write the knowledge base out as ticketrec JSONL (`ticketrec export`): what `ticketrec import` reads back.

Tickets with their metadata, queries, labelled pairs and the engineers' feedback (who, when, which model and index
served it), read from one snapshot of the store, so a pair or judgement never names a ticket the file lacks; accounts
and API tokens are never written. The file is written aside and renamed into place: a failure leaves no partial file.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from tqdm import tqdm

from ..errors import InputError, TicketrecError
from ..files import atomic_file
from .records import Ticket
from .store import Dataset, Feedback, Store

#: What an export counts, in the order it writes them, by record type.
EXPORTED = {"ticket": "tickets", "query": "queries", "pair": "pairs", "feedback": "feedback"}


def export_jsonl(store: Store, path: str | Path, *, feedback: bool = True, progress: bool = False) -> dict[str, int]:
    """Write `store`'s knowledge base to `path` as JSONL (without its feedback when not `feedback`); how many
    records of each kind (EXPORTED's values) were written."""
    database = store.path.resolve()
    if Path(path).resolve() in {database, *(database.with_name(database.name + end) for end in ("-wal", "-shm"))}:
        raise InputError(f"{path} is the knowledge base's own database, which the export would replace; choose "
                         "another path (nothing was written)")
    counts = dict.fromkeys(EXPORTED.values(), 0)

    def write(out, record: dict) -> None:
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        counts[EXPORTED[record["type"]]] += 1

    try:
        with store.snapshot(), atomic_file(path, "w") as out:
            with tqdm(total=store.stats()["tickets"], unit="ticket", desc="exporting", disable=not progress,
                      leave=False) as bar:
                for ticket in store.iter_tickets():  # streamed: a million tickets are never all in memory
                    write(out, ticket_record(ticket))
                    bar.update()
            rest = Dataset(queries=store.queries(), pairs=store.pairs(), feedback=store.feedback() if feedback else [])
            for record in iter_records(rest):
                write(out, record)
    except OSError as exc:
        raise TicketrecError(f"cannot write {path}: {exc.strerror or exc}; choose another path (nothing was "
                             "written)") from exc
    return counts


def ticket_record(t: Ticket) -> dict:
    """A ticket as a JSONL record."""
    record = {"type": "ticket", **t.to_dict()}
    if not t.metadata:
        del record["metadata"]
    return record


def feedback_record(fb: Feedback) -> dict:
    """An engineer's judgement as a JSONL record (what the JSONL importer reads back)."""
    return {"type": "feedback", "subject": fb.query_subject, "description": fb.query_description,
            "ticket_id": fb.ticket_id, "label": fb.label, "user": fb.user_name, "created_at": fb.created_at,
            "model_version": fb.model_version, "index_version": fb.index_version}


def iter_records(dataset: Dataset) -> Iterator[dict]:
    """The dataset as JSONL records (tickets, queries, pairs, feedback), the inverse of the JSONL importer."""
    for t in dataset.tickets:
        yield ticket_record(t)
    for q in dataset.queries:
        yield {"type": "query", "id": q.id, "subject": q.subject, "description": q.description}
    meta = getattr(dataset, "pair_meta", {}) or {}
    for p in dataset.pairs:
        record = {"type": "pair", "query_id": p.query_id, "ticket_id": p.ticket_id, "score": p.score}
        if (p.query_id, p.ticket_id) in meta:
            record["metadata"] = meta[(p.query_id, p.ticket_id)]
        yield record
    for fb in dataset.feedback:
        yield feedback_record(fb)
