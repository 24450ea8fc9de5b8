"""JSONL: ticketrec's own records (tickets, queries, pairs, feedback), or a help desk's export of tickets read
through a column mapping (a dotted name reads a nested field)."""
from __future__ import annotations

from typing import Any

from ...errors import InputError
from ..records import LabeledPair, Ticket, parse_json
from .parsed import (TICKET_COLUMNS, TO_UTF8, UTF16_BOMS, Parsed, column_names, feedback_field, id_field, progress_bar,
                     query_field, score_field, shown, ticket_field)


_ABSENT = object()


def _json_field(record: dict, name: str) -> Any:
    """`record[name]`; else, for a dotted name ("fields.summary"), the nested field it names, through lists too
    ("fields.comment.comments.body": the list of every comment's body); else `_ABSENT`."""
    if name in record:
        return record[name]
    if "." not in name:
        return _ABSENT
    return _nested(record, name.split("."))


def _nested(value: Any, parts: list[str]) -> Any:
    if not parts:
        return value
    if isinstance(value, list):  # the rest of the path in each element that has it
        return [found for found in (_nested(v, parts) for v in value) if found is not _ABSENT]
    if not isinstance(value, dict) or parts[0] not in value:
        return _ABSENT
    return _nested(value[parts[0]], parts[1:])


def _mapped_json_ticket(parsed: Parsed, where: str, record: dict, seen: set[str]) -> Ticket:
    """A ticket from a JSON object with the export's own field names (`parsed.mapping`; a dotted name reads a
    nested field, as Jira's "fields.summary"); other top-level fields with a value become its metadata. The mapped
    names this record has go into `seen`."""
    mapping = parsed.mapping or {}
    fields: dict[str, Any] = {}
    used = set()
    for name in TICKET_COLUMNS:
        source = mapping.get(name, name)
        value = _json_field(record, source)
        if value is not _ABSENT:
            fields[name] = value
            used.add(source)
            seen.add(source)
    if fields.get("id") is None:
        raise parsed.fail(where, f"the record has no field {mapping.get('id', 'id')!r} (the ticket id)",
                          "give every record an id, or map the id field with --map id=FIELD")
    fields.setdefault("subject", "")
    metadata = {k: v for k, v in record.items() if k not in used and v not in (None, "")}
    parsed.other_fields.update(dict.fromkeys(k for k in record if k not in used))
    return ticket_field(parsed, where, fields, metadata)


#: The fields a ticket line of ticketrec's own format reads (any other is ignored).
_TICKET_LINE_FIELDS = ("type", *TICKET_COLUMNS, "metadata")


def parse_jsonl(parsed: Parsed, progress: bool) -> None:
    """Read a JSONL file into `parsed`: ticketrec's own records, or with a mapping an export's tickets."""
    seen: set[str] = set()  # the fields any record of a mapped export has
    _read_jsonl(parsed, progress, seen)
    if parsed.mapping is not None:
        for name, source in parsed.mapping.items():
            if source not in seen:  # every line was a JSON object: its keys are field names, fit to quote
                raise parsed.fail("every line", f"no record has the field {shown(source)} (mapped to {name}); the "
                                                f"fields found are {column_names(sorted(seen))}",
                                  f"fix the mapping of {name} (a dotted name, fields.summary, reads a nested field)")


def _read_jsonl(parsed: Parsed, progress: bool, seen: set[str]) -> None:
    with open(parsed.path, "rb") as raw, progress_bar(parsed.path, progress) as bar:
        for number, line in enumerate(raw, 1):
            bar.update(len(line))
            where = f"line {number}"
            if number == 1 and line[:2] in UTF16_BOMS:  # JSON Lines are UTF-8 by definition
                raise parsed.fail(where, "UTF-16 (the file begins with its byte-order mark), not UTF-8",
                                  "save the file as UTF-8 (e.g. iconv -f utf-16 -t utf-8 FILE > FILE.utf8)")
            try:
                text = line.decode("utf-8-sig" if number == 1 else "utf-8").strip()
            except UnicodeDecodeError as exc:
                raise parsed.fail(where, f"not UTF-8 ({exc.reason})", TO_UTF8) from None
            if not text:
                continue
            try:
                record = parse_json(text)
            except InputError as exc:
                raise parsed.fail(where, str(exc), "fix the line: one UTF-8 JSON object per line") from None
            if not isinstance(record, dict):
                raise parsed.fail(where, f"a line must hold a JSON object, not {type(record).__name__}")
            if parsed.mapping is not None:  # a mapped export: every record is a ticket
                seen.update(record)
                parsed.add_ticket(_mapped_json_ticket(parsed, where, record, seen), where)
                continue
            kind = record.get("type")
            if kind == "ticket":
                parsed.other_fields.update(dict.fromkeys(k for k in record if k not in _TICKET_LINE_FIELDS))
                metadata = record.get("metadata", {})
                if metadata is None:
                    metadata = {}
                if not isinstance(metadata, dict):
                    raise parsed.fail(where, "field 'metadata' must be a JSON object")
                parsed.add_ticket(ticket_field(parsed, where, record, metadata), where)
            elif kind == "query":
                parsed.add_query(query_field(parsed, where, record), where)
            elif kind == "feedback":
                parsed.feedback.append((feedback_field(parsed, where, record), where))
            elif kind == "pair":
                qid = id_field(parsed, where, record, "query_id")
                tid = id_field(parsed, where, record, "ticket_id")
                meta = record.get("metadata")
                if meta is not None and not isinstance(meta, dict):
                    raise parsed.fail(where, "field 'metadata' must be a JSON object")
                score = score_field(parsed, where, record.get("score"), record.get("label"))
                parsed.add_pair(LabeledPair(qid, tid, score), where, meta)
            elif kind is None:
                raise parsed.fail(where, 'the record has no "type"',
                                  'set "type" to "ticket", "query", "pair" or "feedback" in every line, or import '
                                  "a help desk's export of tickets through a mapping of its fields (--map id=FIELD; "
                                  "subject, description and solution are read from fields of those names)")
            else:
                raise parsed.fail(where, f"unknown record type {shown(kind)}",
                                  'set "type" to "ticket", "query", "pair" or "feedback"')
