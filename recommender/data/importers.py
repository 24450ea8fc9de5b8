"""Read knowledge-base files (JSONL, CSV, Excel workbooks, SemEval-2016/2017 Task 3 XML) into a validated `Dataset`,
and duplicate-link files into id pairs.

Everything is parsed and checked before anything is written: a malformed record raises `InputError` naming
the file, the line (or XML element id) and the reason, and never quotes a file that is not a valid import (a
header's column names only when the file is a valid CSV with a header row). `Store.import_dataset` then writes the
result in one transaction. Subjects longer than `Settings.max_subject_chars` and descriptions or solutions longer
than `Settings.max_field_chars` are cut to that length, with one warning line per import saying how many tickets
were cut. A help desk's own export is read through a column mapping (`ColumnMap`: our field → its column).
The formats are documented in `docs/data-formats.md`.
"""
from __future__ import annotations

import csv
import datetime
import io
import itertools
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from tqdm import tqdm

from ..config import Settings, default
from ..errors import InputError
from .markup import HTML_MODES, holds_markup, html_to_text, read_html
from .records import LABEL_SCORES, LabeledPair, Query, Ticket, check_id, check_text, parse_json
from .store import Dataset, Feedback

#: Formats `load` understands; "auto" picks one from the file extension.
FORMATS = ("auto", "jsonl", "csv", "xlsx", "semeval")
_EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".xlsx": "xlsx",
               ".xlsm": "xlsx", ".xml": "semeval"}

#: SemEval-2016/2017 Task 3 subtask B relevance of a related question to the original one → the 1–5 scale.
SEMEVAL_LABELS = {"PerfectMatch": 5.0, "Relevant": 3.0, "Irrelevant": 1.0}

TICKET_COLUMNS = ("id", "subject", "description", "solution")
#: The columns a tickets file (or a mapping) must give; description and solution are optional.
REQUIRED_TICKET_COLUMNS = ("id", "subject")
#: Fields an export may spread over columns of one name (Jira writes a "Comment" column per comment) or give as a
#: JSON list of strings; their texts are joined, a blank line between them.
JOINED_COLUMNS = ("description", "solution")
PAIR_COLUMNS = ("query_id", "query_subject", "ticket_id")  # query_description optional

#: Column mapping of a help desk's export: our ticket field (id, subject, description, solution) → its column.
ColumnMap = Mapping[str, str]
#: Receives one-line warnings (records repeated with trivial differences, dropped links); default: the log.
Warn = Callable[[str], None]

log = logging.getLogger(__name__)
_QUOTES = re.compile("[\"'`\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u00ab\u00bb]")
_SPACES = re.compile(r"\s+")
#: A mapping file is a few lines; a longer file is refused before it is read.
_MAPPING_FILE_BYTES = 64 * 1024


#: First characters that make a spreadsheet read a cell as a formula (OWASP "CSV injection"), fullwidth forms too.
_FORMULA_START = tuple("=+-@\t\r\uff1d\uff0b\uff0d\uff20")
_PLAIN_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def csv_cell(value: Any) -> Any:
    """`value` as a CSV cell that a spreadsheet shows rather than runs: text starting like a formula (=, +, -, @,
    tab, carriage return) gets a leading single quote; numbers, and text that is only a number, are unchanged."""
    if isinstance(value, str) and value.startswith(_FORMULA_START) and not _PLAIN_NUMBER.fullmatch(value):
        return "'" + value
    return value


def _shown(value: Any, limit: int = 60) -> str:
    """`value` for a one-line message: its repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _normalised(value: Any) -> Any:
    """`value` with quotes removed and white space folded (strings inside dicts too): what a repeated export
    record may differ by without being a different record."""
    if isinstance(value, str):
        return _SPACES.sub(" ", _QUOTES.sub("", value)).strip()
    if isinstance(value, dict):
        return {k: _normalised(v) for k, v in value.items()}
    return value


def _same_record(a: Ticket | Query, b: Ticket | Query) -> bool:
    return _normalised(vars(a)) == _normalised(vars(b))


@dataclass
class _Parsed:
    """One file's records plus where each came from (for error messages that name a line)."""

    path: Path
    tickets: dict[str, Ticket] = field(default_factory=dict)
    queries: dict[str, Query] = field(default_factory=dict)
    pairs: dict[tuple[str, str], LabeledPair] = field(default_factory=dict)
    pair_meta: dict[tuple[str, str], dict] = field(default_factory=dict)
    where: dict[tuple[str, str], str] = field(default_factory=dict)  # pair key → "line 12" / "element ..."
    mapping: dict[str, str] | None = None  # our field → the file's column (a mapped export of tickets)
    repeated: list[str] = field(default_factory=list)  # ids repeated with only white space / quote differences
    #: longest subject, longest description / solution (longer ones are cut)
    limits: tuple[int, int] = (default("max_subject_chars"), default("max_field_chars"))
    cut: dict[str, set[str]] = field(default_factory=lambda: {"ticket": set(), "query": set()})  # ids cut, by kind
    feedback: list[tuple[Feedback, str]] = field(default_factory=list)  # (judgement, where), in file order

    def clip(self, kind: str, record_id: str, name: str, value: str) -> str:
        """`value` cut to the limit of field `name`; the record's id is remembered for the import's warning."""
        limit = self.limits[0] if name.endswith("subject") else self.limits[1]
        if len(value) <= limit:
            return value
        self.cut[kind].add(record_id)
        return value[:limit]

    def fail(self, where: str, reason: str, todo: str = "fix the record and import again") -> InputError:
        return InputError(f"{self.path}, {where}: {reason}; {todo} (nothing was imported)")

    def add_ticket(self, ticket: Ticket, where: str) -> None:
        old = self.tickets.get(ticket.id)
        if old is not None and old != ticket:
            if not _same_record(old, ticket):
                raise self.fail(where, f"ticket id {ticket.id!r} appears twice with different content",
                                "give every ticket a unique id, or remove the duplicate")
            self.repeated.append(ticket.id)  # the same record exported twice: keep the first
        self.tickets.setdefault(ticket.id, ticket)

    def add_query(self, query: Query, where: str) -> None:
        old = self.queries.get(query.id)
        if old is not None and old != query:
            if not _same_record(old, query):
                raise self.fail(where, f"query id {query.id!r} appears twice with different content",
                                "give every query a unique id, or make its repeated subject and description identical")
            self.repeated.append(query.id)
        self.queries.setdefault(query.id, query)

    def add_pair(self, pair: LabeledPair, where: str, meta: dict | None = None) -> None:
        key = (pair.query_id, pair.ticket_id)
        old = self.pairs.get(key)
        if old is not None and old.score != pair.score:
            raise self.fail(where, f"pair ({pair.query_id}, {pair.ticket_id}) appears twice with scores "
                                   f"{old.score:g} and {pair.score:g}", "keep one judgement per pair")
        if old is None:
            self.pairs[key] = pair
            self.where[key] = where
        if meta:
            self.pair_meta.setdefault(key, dict(meta))


# -- field checks -----------------------------------------------------------------------------------------------
def _text(parsed: _Parsed, where: str, record: dict, name: str, required: bool = True) -> str:
    if name not in record or record[name] is None:
        if required:
            raise parsed.fail(where, f"missing field {name!r}", f"add {name!r} to the record")
        return ""
    value = record[name]
    if isinstance(value, list) and name in JOINED_COLUMNS and all(isinstance(v, str) or v is None for v in value):
        value = "\n\n".join(v.strip() for v in value if v and v.strip())  # e.g. a list of comments
    if not isinstance(value, str):
        kinds = "a string or a list of strings" if name in JOINED_COLUMNS else "a string"
        raise parsed.fail(where, f"field {name!r} must be {kinds}, not {type(value).__name__}")
    try:
        return check_text(value, f"field {name!r}").strip()
    except InputError as exc:
        raise parsed.fail(where, str(exc)) from None


def _ident(parsed: _Parsed, where: str, record: dict, name: str) -> str:
    value = record.get(name)
    if value is None:
        raise parsed.fail(where, f"missing field {name!r}", f"add {name!r} to the record")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise parsed.fail(where, f"field {name!r} must be a string or an integer, not {type(value).__name__}")
    value = str(value).strip()
    if not value:
        raise parsed.fail(where, f"field {name!r} is empty", "give every record a non-empty id")
    try:
        return check_id(value, f"field {name!r}")
    except InputError as exc:
        raise parsed.fail(where, str(exc), "give every record a short id") from None


def _score(parsed: _Parsed, where: str, score: Any, label: Any) -> float:
    """The 1–5 score of a pair given as `score` (number) and/or `label` (YES/REL/NO)."""
    from_label = None
    if label not in (None, ""):
        if not isinstance(label, str) or label.strip().upper() not in LABEL_SCORES:
            raise parsed.fail(where, f"unknown label {_shown(label)}", "use YES, REL or NO (or a score from 1 to 5)")
        from_label = LABEL_SCORES[label.strip().upper()]
    if score in (None, ""):
        if from_label is None:
            raise parsed.fail(where, "a pair needs a 'score' (1-5) or a 'label' (YES, REL, NO)", "add one of them")
        return from_label
    if isinstance(score, str):
        try:
            score = float(score.strip())
        except ValueError:
            raise parsed.fail(where, f"score {_shown(score)} is not a number", "use a number from 1 to 5") from None
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise parsed.fail(where, f"score {_shown(score)} is not a number", "use a number from 1 to 5")
    if not 1.0 <= float(score) <= 5.0:
        raise parsed.fail(where, f"score {score:g} is outside 1-5", "use the 1-5 scale (YES 5, REL 3, NO 1)")
    if from_label is not None and from_label != float(score):
        raise parsed.fail(where, f"score {score:g} contradicts label {_shown(label)}", "give only one of them")
    return float(score)


def _ticket(parsed: _Parsed, where: str, record: dict, metadata: dict) -> Ticket:
    """A ticket from a record with our field names; description and solution may be missing (empty); long fields cut."""
    ticket_id = _ident(parsed, where, record, "id")
    ticket = Ticket(
        ticket_id,
        *(parsed.clip("ticket", ticket_id, name, _text(parsed, where, record, name, required=name == "subject"))
          for name in ("subject", "description", "solution")),
        metadata,
    )
    if not ticket.subject and not ticket.description:
        raise parsed.fail(where, f"ticket {ticket.id!r} has neither subject nor description",
                          "fill in at least one of them")
    return ticket


@dataclass
class _Request(_Parsed):
    """One ticket sent over the API: its errors say what to fix in the request, not in a file, and it remembers
    which fields it cut."""

    cut_fields: list[str] = field(default_factory=list)

    def fail(self, where: str, reason: str, todo: str = "fix the ticket and send it again") -> InputError:
        return InputError(f"{reason}; {todo}")

    def clip(self, kind: str, record_id: str, name: str, value: str) -> str:
        kept = super().clip(kind, record_id, name, value)
        if len(kept) < len(value):
            self.cut_fields.append(name)
        return kept


#: The fields of a ticket sent as a JSON object (`ticket_from_json`).
JSON_TICKET_FIELDS = ("subject", "description", "solution", "metadata")
#: Most metadata fields one ticket sent over the API may carry, and the longest name of one.
MAX_METADATA_FIELDS, MAX_METADATA_NAME = 100, 100
_METADATA_SCALARS = (str, int, float, bool)


def _metadata(parsed: _Parsed, value: Any) -> dict:
    """A ticket's metadata sent as JSON: an object whose values filters and cards can read (text, numbers,
    true/false, or lists of them); null and empty values are left out, as a mapped import leaves them out."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise parsed.fail("", f"'metadata' must be a JSON object, not {type(value).__name__}")
    if len(value) > MAX_METADATA_FIELDS:
        raise parsed.fail("", f"'metadata' has {len(value):,} fields; a ticket may have at most {MAX_METADATA_FIELDS}")
    kept = {}
    for name, item in value.items():
        if not name.strip() or len(name) > MAX_METADATA_NAME:
            raise parsed.fail("", f"metadata field {_shown(name, 40)}: a name has 1 to {MAX_METADATA_NAME} characters")
        items = item if isinstance(item, list) else [item]
        if not all(v is None or isinstance(v, _METADATA_SCALARS) for v in items):
            raise parsed.fail("", f"metadata field {_shown(name, 40)} must be text, a number, true/false or a list of "
                                  "them")
        if isinstance(item, list):
            item = [v for v in item if v not in (None, "")]
        if item not in (None, "", []):
            kept[name] = item
    return kept


def ticket_from_json(ticket_id: str, record: Mapping[str, Any], *, html: bool = False,
                     settings: Settings | None = None) -> tuple[Ticket, list[str]]:
    """The ticket `ticket_id` sent as a JSON object of `JSON_TICKET_FIELDS` (the API's PUT /tickets/ID), read by the
    rules of an import: subject required (it may be empty when the description is not), description and solution
    optional (a list of strings joined, as an import joins comments), text beyond the import limits cut.
    `html`: fields that hold markup are read as the text a browser shows. Returns the ticket and the names of the
    fields that were cut; InputError (one line, what to fix) otherwise."""
    parsed = _Request(Path("request"), limits=_limits(settings))
    unknown = [name for name in record if name not in JSON_TICKET_FIELDS]
    if unknown:
        raise parsed.fail("", f"unknown field {_shown(unknown[0], 40)}; a ticket's fields are "
                              f"{', '.join(JSON_TICKET_FIELDS)}")
    fields = {"id": ticket_id, **{name: record.get(name) for name in ("subject", "description", "solution")}}
    if html:
        fields = {name: html_to_text(value) if name != "id" and isinstance(value, str) and holds_markup(value) else value
                  for name, value in fields.items()}
    ticket = _ticket(parsed, "", fields, _metadata(parsed, record.get("metadata")))
    if ticket.id != ticket_id:
        raise parsed.fail("", f"the ticket id {_shown(ticket_id, 40)} begins or ends with white space",
                          "send the id without it")
    return ticket, parsed.cut_fields


def _query(parsed: _Parsed, where: str, record: dict, prefix: str = "") -> Query:
    query_id = _ident(parsed, where, record, prefix + "id")
    query = Query(
        parsed.clip("query", query_id, "subject", _text(parsed, where, record, prefix + "subject")),
        parsed.clip("query", query_id, "description", _text(parsed, where, record, prefix + "description", required=False)),
        query_id,
    )
    if not query.subject and not query.description:
        raise parsed.fail(where, f"query {query.id!r} has neither subject nor description",
                          "fill in at least one of them")
    return query


def _feedback(parsed: _Parsed, where: str, record: dict) -> Feedback:
    """An engineer's judgement as `ticketrec export` writes it: the query's subject and description, the judged
    ticket, YES/REL/NO, and (optional) who gave it, when (seconds since 1970) and the versions that served it."""
    subject = _text(parsed, where, record, "subject")
    description = _text(parsed, where, record, "description", required=False)
    if not subject and not description:
        raise parsed.fail(where, "the feedback's query has neither subject nor description", "fill in one of them")
    label = record.get("label")
    if not isinstance(label, str) or label.strip().upper() not in LABEL_SCORES:
        raise parsed.fail(where, f"unknown feedback label {_shown(label)}", "use YES, REL or NO")
    created = record.get("created_at", 0.0)
    if isinstance(created, bool) or not isinstance(created, (int, float)) or not math.isfinite(created) or created < 0:
        raise parsed.fail(where, f"created_at {_shown(created)} is not a time", "give seconds since 1970, or leave "
                                                                               "it out (the import's time)")
    model_version, index_version, user = (_text(parsed, where, record, name, required=False)
                                          for name in ("model_version", "index_version", "user"))
    return Feedback(subject, description, _ident(parsed, where, record, "ticket_id"), label.strip().upper(),
                    model_version, index_version, float(created), user_name=user)


def _progress(path: Path, enabled: bool) -> tqdm:
    size = path.stat().st_size
    return tqdm(total=size, unit="B", unit_scale=True, desc=f"reading {path.name}", disable=not enabled, leave=False)


# -- JSONL --------------------------------------------------------------------------------------------------------
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


def _mapped_json_ticket(parsed: _Parsed, where: str, record: dict, seen: set[str]) -> Ticket:
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
    return _ticket(parsed, where, fields, metadata)


def _parse_jsonl(parsed: _Parsed, progress: bool) -> None:
    seen: set[str] = set()  # the fields any record of a mapped export has
    _read_jsonl(parsed, progress, seen)
    if parsed.mapping is not None:
        for name, source in parsed.mapping.items():
            if source not in seen:  # every line was a JSON object: its keys are field names, fit to quote
                raise parsed.fail("every line", f"no record has the field {_shown(source)} (mapped to {name}); the "
                                                f"fields found are {_names(sorted(seen))}",
                                  f"fix the mapping of {name} (a dotted name, fields.summary, reads a nested field)")


def _read_jsonl(parsed: _Parsed, progress: bool, seen: set[str]) -> None:
    with open(parsed.path, "rb") as raw, _progress(parsed.path, progress) as bar:
        for number, line in enumerate(raw, 1):
            bar.update(len(line))
            where = f"line {number}"
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
                metadata = record.get("metadata", {})
                if metadata is None:
                    metadata = {}
                if not isinstance(metadata, dict):
                    raise parsed.fail(where, "field 'metadata' must be a JSON object")
                parsed.add_ticket(_ticket(parsed, where, record, metadata), where)
            elif kind == "query":
                parsed.add_query(_query(parsed, where, record), where)
            elif kind == "feedback":
                parsed.feedback.append((_feedback(parsed, where, record), where))
            elif kind == "pair":
                qid = _ident(parsed, where, record, "query_id")
                tid = _ident(parsed, where, record, "ticket_id")
                meta = record.get("metadata")
                if meta is not None and not isinstance(meta, dict):
                    raise parsed.fail(where, "field 'metadata' must be a JSON object")
                parsed.add_pair(LabeledPair(qid, tid, _score(parsed, where, record.get("score"), record.get("label"))),
                                where, meta)
            else:
                raise parsed.fail(where, f"unknown record type {_shown(kind)}",
                                  'set "type" to "ticket", "query", "pair" or "feedback"')


# -- CSV ----------------------------------------------------------------------------------------------------------
def _names(names: Sequence[str], limit: int = 40) -> str:
    """Column names for a one-line message: white space folded, long names cut, at most `limit` of them."""
    shown = [repr(_SPACES.sub(" ", str(n)).strip()[:60]) for n in names[:limit]]
    return ", ".join(shown) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _found_columns(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """"the columns found are ..." when the file is a valid CSV with a header row (two or more short printable
    names, and `rows`, the first records, with as many fields); else words that quote nothing, so that a file that
    is no CSV export (a symlink to a secret, say) is never echoed."""
    plausible = (len(header) >= 2 and all(len(h) <= 100 and h.isprintable() for h in header)
                 and all(len(row) == len(header) for row in rows if any(cell.strip() for cell in row)))
    return f"the columns found are {_names(header)}" if plausible else "the first line is not a CSV header row"


def _ticket_columns(parsed: _Parsed, header: Sequence[str], found: str,
                    unit: str = "line") -> dict[str, list[int]]:
    """Our ticket field → the positions of its columns in `header` (none: not in the file, the field is empty).

    A mapped field takes the column the mapping names (exact name, else the same name ignoring case and
    surrounding white space); an unmapped field takes the column of its own name. A description or solution column
    may repeat (all of them are read); the id and subject columns may not. The id and a subject or description
    column are required. `found`: what an error says of the header (`_found_columns`); `unit`: "line" or "row"."""
    folded = [h.strip().lower() for h in header]
    mapping = parsed.mapping or {}
    out: dict[str, list[int]] = {}
    for name in TICKET_COLUMNS:
        column = mapping.get(name)
        if column is not None and column in header:
            out[name] = [i for i, h in enumerate(header) if h == column]
        else:
            wanted = (column if column is not None else name).strip().lower()
            out[name] = [i for i, h in enumerate(folded) if h == wanted]
    found = "; " + found
    for name, column in mapping.items():
        if not out[name]:
            raise parsed.fail(f"{unit} 1", f"no column {_shown(column)} (mapped to {name}){found}",
                              f"fix the mapping of {name}")
    for name, positions in out.items():
        repeated = bool(positions) and folded.count(folded[positions[0]]) > 1
        if repeated and name not in JOINED_COLUMNS:
            i = positions[0]
            raise parsed.fail(f"{unit} 1, column {i + 1}", f"the column {_names([header[i]])} (for {name}) appears "
                                                         "more than once", "rename one of them")
    if not out["id"] or (not out["subject"] and not out["description"]):
        missing = "id" if not out["id"] else "subject"
        raise parsed.fail(f"{unit} 1", f"no column for the ticket {missing}{found}",
                          f"map one with --map {missing}=COLUMN")
    return out


def _numbered_rows(reader) -> Iterator[tuple[int, list[str]]]:
    """(first line, row) of every row left in a csv reader (a quoted field may span lines)."""
    start = reader.line_num + 1
    for row in reader:
        yield start, row
        start = reader.line_num + 1


#: Field delimiters of exports besides the comma: spreadsheets in many locales save "CSV" with ";", and some
#: tools write tab- or bar-separated files.
OTHER_DELIMITERS = (";", "\t", "|")
#: How to make a file UTF-8, for the error that says it is not.
TO_UTF8 = "save the file as UTF-8 (from a Windows export, e.g. iconv -f cp1252 -t utf-8 FILE > FILE.utf8)"


def _undecodable_where(path: str | Path) -> str:
    """Where the first byte of `path` that is not UTF-8 is, for an error: "line 5002, byte 8" (both from 1, as an
    editor shows them: lines split at newline bytes, which never occur inside a UTF-8 character)."""
    with open(path, "rb") as raw:
        for number, line in enumerate(raw, 1):
            try:
                line.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                return f"line {number}, byte {exc.start + 1}"
    return "somewhere"


def _delimiter(first_line: str) -> str:
    """The field delimiter of a CSV file whose first line is `first_line` (its header row): the one of ",", ";", tab
    and "|" that splits that row into the most fields, the comma on a tie (so a header of one name stays a comma
    file, and a tab-separated header whose names hold a comma is read by tabs)."""
    fields = {d: len(next(csv.reader([first_line], delimiter=d), [])) for d in (",", *OTHER_DELIMITERS)}
    return max(fields, key=lambda d: (fields[d], d == ","))


def _parse_csv(parsed: _Parsed, progress: bool) -> None:
    with open(parsed.path, "rb") as raw, _progress(parsed.path, progress) as bar:
        # the header row, at most 1 MiB of it (a file of one huge line is refused by the reader below)
        delimiter = _delimiter(raw.readline(1 << 20).decode("utf-8-sig", errors="replace"))
        raw.seek(0)
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
        reader = csv.reader(text, delimiter=delimiter)
        try:
            header = next(reader, None)
            if header is None:
                raise parsed.fail("line 1", "the file is empty", "add a header row and records")
            _parse_table(parsed, header, _numbered_rows(reader), "line", lambda: bar.update(raw.tell() - bar.n))
        except csv.Error as exc:
            if "field larger than field limit" in str(exc):
                raise parsed.fail(f"line {reader.line_num}", f"a field has more than {csv.field_size_limit():,} "
                                                             "characters", "shorten it, or fix the quoting") from None
            raise parsed.fail(f"line {reader.line_num}", f"bad CSV ({exc})", "fix the quoting") from None
        except UnicodeDecodeError as exc:
            # the reader decodes ahead of the rows it returns: its line number is not the bad byte's
            raise parsed.fail(_undecodable_where(parsed.path), f"not UTF-8 ({exc.reason})", TO_UTF8) from None


def _parse_table(parsed: _Parsed, header: list[str], rows: Iterator[tuple[int, list[str]]], unit: str,
                 advance: Callable[[], None]) -> None:
    """The records of a table (a CSV file, a worksheet): tickets when the header or the mapping says so, else
    labelled pairs with their queries. `rows` yields (number, cells); `unit` names a number in errors ("line",
    "row"); `advance` moves the progress bar."""
    ahead = list(itertools.islice(rows, 20))  # the first records tell whether the header is a CSV header
    found = _found_columns(header, (row for _, row in ahead))
    columns = [h.strip().lower() for h in header]
    if parsed.mapping is not None or ("id" in columns and ("subject" in columns or "description" in columns)):
        kind = "tickets"
    elif all(c in columns for c in PAIR_COLUMNS) and ("score" in columns or "label" in columns):
        kind = "pairs"
    else:  # not quoted: the file may be anything (a symlink to a secret included)
        raise parsed.fail(f"{unit} 1", f"unrecognised header ({found})",
                          "a tickets file needs the columns id and subject (description and solution are "
                          "optional), or a mapping of yours (--map id=COLUMN --map subject=COLUMN); a pairs "
                          "file query_id,query_subject,ticket_id (query_description optional) and score or label")
    if parsed.mapping is None:  # a recognised header: its names may be quoted
        for i, column in enumerate(columns):
            if not column:
                raise parsed.fail(f"{unit} 1, column {i + 1}", "the header has an empty column name",
                                  "name every column")
            if columns.index(column) != i:
                raise parsed.fail(f"{unit} 1, column {i + 1}", f"the column name {_names([header[i]])} repeats "
                                                               f"column {columns.index(column) + 1}",
                                  "rename one of them")
    if kind == "tickets":  # other columns are metadata (an export's nameless or repeated ones are skipped)
        source = _ticket_columns(parsed, header, found, unit)
        used = {i for positions in source.values() for i in positions}
        extra = [i for i, c in enumerate(columns) if i not in used and c and columns.index(c) == i]
    for number, row in itertools.chain(ahead, rows):
        where = f"{unit} {number}"
        advance()
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(columns):
            raise parsed.fail(where, f"the row has {len(row)} fields but the header has {len(columns)}",
                              "quote fields that contain commas or line breaks")
        if kind == "tickets":  # a field of repeated columns is their list of cells, which `_text` joins
            record = {name: [row[i] for i in positions] if len(positions) > 1 else row[positions[0]] if positions
                      else "" for name, positions in source.items()}
            metadata = {columns[i]: row[i] for i in extra if row[i] != ""}
            parsed.add_ticket(_ticket(parsed, where, record, metadata), where)
        else:
            record = dict(zip(columns, row))
            query = _query(parsed, where, record, prefix="query_")
            parsed.add_query(query, where)
            tid = _ident(parsed, where, record, "ticket_id")
            score = _score(parsed, where, record.get("score"), record.get("label"))
            parsed.add_pair(LabeledPair(query.id, tid, score), where)


# -- SemEval-2016/2017 Task 3 XML -----------------------------------------------------------------------------------
def _iterparse(source, events):
    """`iterparse` that refuses entity declarations and external references (billion laughs, XXE).

    defusedxml is a dependency of nltk (pinned in setup.cfg), so it is always installed with ticketrec.
    """
    from defusedxml.ElementTree import iterparse

    return iterparse(source, events, forbid_dtd=False, forbid_entities=True, forbid_external=True)


def _semeval_where(element) -> str:
    for attr in ("RELQ_ID", "ORGQ_ID", "THREAD_SEQUENCE"):
        if element.get(attr):
            value = element.get(attr)
            return f"element <{element.tag} {attr}=\"{value if len(value) <= 60 else value[:59] + '…'}\">"
    return f"element <{element.tag}>"


def _parse_orgquestion(parsed: _Parsed, org) -> None:
    where = _semeval_where(org)
    orgq_id = (org.get("ORGQ_ID") or "").strip()
    if not orgq_id:
        raise parsed.fail(where, "OrgQuestion without ORGQ_ID", "every OrgQuestion needs an ORGQ_ID attribute")
    try:
        check_id(orgq_id, "ORGQ_ID")
    except InputError as exc:
        raise parsed.fail(where, str(exc)) from None
    query = Query(parsed.clip("query", orgq_id, "subject", (org.findtext("OrgQSubject") or "").strip()),
                  parsed.clip("query", orgq_id, "description", (org.findtext("OrgQBody") or "").strip()), orgq_id)
    if not query.subject and not query.description:
        raise parsed.fail(where, "OrgQuestion has neither OrgQSubject nor OrgQBody text")
    parsed.add_query(query, where)
    for thread in org.iter("Thread"):
        rel = thread.find("RelQuestion")
        if rel is None:
            raise parsed.fail(_semeval_where(thread), "Thread without RelQuestion")
        rwhere = _semeval_where(rel)
        relq_id = (rel.get("RELQ_ID") or "").strip()
        if not relq_id:
            raise parsed.fail(rwhere + f" under ORGQ_ID {orgq_id!r}", "RelQuestion without RELQ_ID")
        try:
            check_id(relq_id, "RELQ_ID")
        except InputError as exc:
            raise parsed.fail(rwhere, str(exc)) from None
        rank_text = rel.get("RELQ_RANKING_ORDER")
        try:
            ir_rank = int(rank_text) if rank_text not in (None, "") else None
        except ValueError:
            raise parsed.fail(rwhere, f"RELQ_RANKING_ORDER {_shown(rank_text)} is not an integer") from None
        comments = thread.findall("RelComment")
        good = [c for c in comments if c.get("RELC_RELEVANCE2RELQ") == "Good"] or comments
        solution = "\n".join(t for t in ((c.findtext("RelCText") or "").strip() for c in good) if t)
        metadata = {"format": "semeval", "orgq_id": orgq_id, "ir_rank": ir_rank,
                    "category": rel.get("RELQ_CATEGORY", ""), "date": rel.get("RELQ_DATE", "")}
        texts = {"subject": (rel.findtext("RelQSubject") or "").strip(),
                 "description": (rel.findtext("RelQBody") or "").strip(), "solution": solution}
        ticket = Ticket(relq_id, *(parsed.clip("ticket", relq_id, k, v) for k, v in texts.items()), metadata)
        if relq_id in parsed.tickets:  # one related question under several originals: one ticket (the first)
            first = parsed.tickets[relq_id]
            if (first.subject, first.description, first.solution) != (ticket.subject, ticket.description,
                                                                     ticket.solution):
                raise parsed.fail(rwhere, f"RELQ_ID {relq_id!r} appears twice with different text",
                                  "related questions with one id must be identical")
        else:
            parsed.tickets[relq_id] = ticket
        label = rel.get("RELQ_RELEVANCE2ORGQ")
        if label in (None, "", "?"):  # an unlabelled (test) file: tickets and queries, no pair
            continue
        if label not in SEMEVAL_LABELS:
            raise parsed.fail(rwhere, f"unknown RELQ_RELEVANCE2ORGQ {_shown(label)}",
                              "use PerfectMatch, Relevant or Irrelevant")
        parsed.add_pair(LabeledPair(orgq_id, relq_id, SEMEVAL_LABELS[label]), rwhere,
                        {"ir_rank": ir_rank, "semeval_label": label})


def _parse_semeval(parsed: _Parsed, progress: bool) -> None:
    import xml.etree.ElementTree as ET

    from defusedxml import DefusedXmlException

    seen_root = False
    with open(parsed.path, "rb") as raw, _progress(parsed.path, progress) as bar:
        try:
            for event, element in _iterparse(raw, ("start", "end")):
                if event == "start":
                    seen_root = True
                    continue
                if element.tag == "OrgQuestion":
                    _parse_orgquestion(parsed, element)
                    element.clear()
                    bar.update(raw.tell() - bar.n)
        except ET.ParseError as exc:
            line, column = getattr(exc, "position", (0, 0))
            raise parsed.fail(f"line {line}, column {column}", f"bad XML ({exc})",
                              "fix the file or give --format for what it really is") from None
        except DefusedXmlException as exc:
            raise parsed.fail("the DTD", f"unsafe XML refused ({type(exc).__name__})",
                              "remove entity declarations and external references from the file") from None
    if not seen_root or not (parsed.queries or parsed.tickets):
        raise parsed.fail("the root element", "no OrgQuestion element found",
                          "give a SemEval-2016/2017 Task 3 English (subtask B) file")


# -- Excel workbooks -------------------------------------------------------------------------------------------------
def _cell_text(value: Any) -> str:
    """A worksheet cell as the text a CSV export of it would hold: whole numbers without ".0" (Excel stores a
    numeric id as a float), dates and times in ISO 8601 (a date alone when the time is midnight), TRUE / FALSE, an
    empty cell as ""."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, datetime.datetime):  # a date cell is a datetime at midnight
        return value.date().isoformat() if value.time() == datetime.time() else value.isoformat(sep=" ")
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return str(value)


#: A workbook part that unpacks to more than this, at more than `_XLSX_RATIO` times its packed size, is refused:
#: SeaMonkey's sheet packs 4.5 times; zeros, a zip bomb's filling, over a thousand.
_XLSX_PART_BYTES = 64 << 20
_XLSX_RATIO = 100


def _check_workbook_parts(parsed: _Parsed) -> None:
    """InputError for a workbook whose parts would unpack to far more than any export (before openpyxl reads one)."""
    import zipfile

    with zipfile.ZipFile(parsed.path) as archive:
        for part in archive.infolist():
            if part.file_size > _XLSX_PART_BYTES and part.file_size > _XLSX_RATIO * max(part.compress_size, 1):
                raise parsed.fail("the workbook", f"its part {_shown(part.filename, 60)} unpacks to "
                                                  f"{part.file_size / (1 << 20):,.0f} MiB, "
                                                  f"{part.file_size // max(part.compress_size, 1):,} times its packed "
                                                  "size, which no export does (a damaged or hostile file)",
                                  "export the tickets as CSV (UTF-8) instead")


def _parse_xlsx(parsed: _Parsed, progress: bool) -> None:
    """The first worksheet of an Excel workbook, read as a CSV export of it would be (`_parse_table`)."""
    import zipfile

    from openpyxl import load_workbook
    from openpyxl.utils.exceptions import InvalidFileException

    try:
        _check_workbook_parts(parsed)
        workbook = load_workbook(parsed.path, read_only=True, data_only=True)
    except (InvalidFileException, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise parsed.fail("the workbook", f"not an Excel workbook that can be read ({type(exc).__name__})",
                          "save it again from the spreadsheet as .xlsx, or export it as CSV (UTF-8)") from None
    try:
        sheet = workbook.worksheets[0]
        rows = ([_cell_text(v) for v in values] for values in sheet.iter_rows(values_only=True))
        header = next(rows, None)
        while header and not header[-1].strip():  # columns past the last named one are formatting, not data
            header.pop()
        if not header:
            raise parsed.fail("row 1", f"the first sheet ({sheet.title!r}) is empty",
                              "put the header row and the records in the workbook's first sheet")
        width = len(header)

        def numbered() -> Iterator[tuple[int, list[str]]]:
            for number, row in enumerate(rows, 2):
                if len(row) > width and not any(cell.strip() for cell in row[width:]):
                    row = row[:width]
                yield number, row + [""] * (width - len(row))

        with tqdm(total=sheet.max_row, desc=f"reading {parsed.path.name}", unit="row", disable=not progress,
                  leave=False) as bar:
            _parse_table(parsed, header, numbered(), "row", lambda: bar.update(1))
    finally:
        workbook.close()


_PARSERS = {"jsonl": _parse_jsonl, "csv": _parse_csv, "xlsx": _parse_xlsx, "semeval": _parse_semeval}


# -- public face ----------------------------------------------------------------------------------------------------
def detect_format(path: str | Path, fmt: str = "auto") -> str:
    """The format of `path`: `fmt` itself unless "auto", then by extension (.jsonl/.json, .csv, .xlsx, .xml)."""
    path = Path(path)
    if fmt not in FORMATS:
        raise InputError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    if fmt != "auto":
        return fmt
    found = _EXTENSIONS.get(path.suffix.lower())
    if found is None:
        if path.suffix.lower() in (".xls", ".ods", ".numbers"):
            raise InputError(f"{path} is a spreadsheet of a format ticketrec does not read; save it as an Excel "
                             "workbook (.xlsx) or as CSV (UTF-8)")
        raise InputError(f"cannot tell the format of {path} from its extension {path.suffix or '(none)'!r}; "
                         "name it .jsonl, .csv, .xlsx or .xml, or give --format jsonl|csv|xlsx|semeval")
    return found


def _limits(settings: Settings | None) -> tuple[int, int]:
    """(longest subject, longest description / solution) of an import: the settings', default from the environment."""
    settings = settings or Settings.from_env()
    limits = (settings.max_subject_chars, settings.max_field_chars)
    for env, value in zip(("TICKETREC_MAX_SUBJECT_CHARS", "TICKETREC_MAX_FIELD_CHARS"), limits):
        if value < 1:
            raise InputError(f"{env} must be at least 1, not {value}; fix or unset it")
    return limits


def _warn_cut(parts: Sequence[_Parsed], warn: Warn | None) -> None:
    """One warning line for the whole import: how many tickets (and queries) had a field cut to the limits."""
    cut = {kind: set().union(*(p.cut[kind] for p in parts)) for kind in ("ticket", "query")}
    if not cut["ticket"] and not cut["query"]:
        return
    ids = sorted(cut["ticket"] or cut["query"])
    subject, text = parts[0].limits
    queries = f" and {len(cut['query'])} queries" if cut["query"] else ""
    (warn or log.warning)(f"{len(cut['ticket'])} tickets{queries} had a field longer than the import limits (subject "
                          f"{subject:,}, description or solution {text:,} characters) and were cut to them (ids "
                          f"{', '.join(_shown(i, 40) for i in ids[:5])}{', ...' if len(ids) > 5 else ''}); raise "
                          "TICKETREC_MAX_SUBJECT_CHARS / TICKETREC_MAX_FIELD_CHARS to keep more")


def _read_html(parsed: _Parsed, mode: str, warn: Warn, progress: bool) -> None:
    """The file's ticket and query fields that `mode` reads as HTML (`markup.read_html`) replaced by their text, with
    one line to `warn` per field that holds markup saying how it was read."""
    for kind, records, fields in (("ticket", parsed.tickets, ("subject", "description", "solution")),
                                  ("query", parsed.queries, ("subject", "description"))):
        read, found = read_html(list(records.values()), fields, mode, progress)
        for record in read:
            if not record.subject and not record.description:
                raise parsed.fail(f"{kind} {_shown(record.id, 40)}", "its subject and description hold no text once "
                                  "read as HTML", "fill in one of them, or import with --html no")
            records[record.id] = record
        prefix = "" if kind == "ticket" else "query "
        what = {f: f"{f.with_markup:,} of {f.filled:,} {prefix}{f.name}s" for f in found}
        for field_read in found:
            if field_read.as_html:
                warn(f"{parsed.path}: read {what[field_read]} as HTML (the text a browser shows: tags, styles and "
                     "scripts dropped, paragraphs and list items as lines); --html no keeps them as written")
        kept = [what[f] for f in found if not f.as_html]
        if kept and mode == "auto":
            fields_read = "those fields" if len(kept) > 1 else "the field"
            warn(f"{parsed.path}: {' and '.join(kept)} hold HTML markup, too few to read {fields_read} as HTML; kept "
                 "as written (--html yes reads them as HTML)")


def _parse(path: str | Path, fmt: str, progress: bool, mapping: ColumnMap | None = None,
           warn: Warn | None = None, limits: tuple[int, int] | None = None, html: str = "auto") -> _Parsed:
    path = Path(path)
    kind = detect_format(path, fmt)
    if not path.is_file():
        raise InputError(f"{path} does not exist or is not a file; check the path")
    if mapping is not None and kind == "semeval":
        raise InputError(f"{path} is SemEval XML, whose fields are fixed; give a column mapping only for CSV, Excel or "
                         "JSONL")
    parsed = _Parsed(path, mapping=None if mapping is None else check_mapping(mapping), limits=limits or _limits(None))
    try:
        _PARSERS[kind](parsed, progress)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}; check the path and its permissions") from exc
    if kind != "semeval":  # an export's text; SemEval's is the forum's plain text
        _read_html(parsed, html, warn or log.warning, progress)
    if parsed.repeated:
        ids = list(dict.fromkeys(parsed.repeated))
        (warn or log.warning)(f"{path}: {len(parsed.repeated)} records repeat an earlier id with only white-space or "
                              f"quote differences; kept the first of each (ids {', '.join(ids[:5])}"
                              f"{', ...' if len(ids) > 5 else ''})")
    return parsed


def _merge(parts: Sequence[_Parsed], known_ticket_ids: Iterable[str], known_query_ids: Iterable[str]) -> Dataset:
    """One Dataset from several files: a later file's ticket, query or pair replaces an earlier one with that id.

    Every pair must name a query and a ticket of these files or of `known_*` (e.g. already in the store).
    """
    tickets: dict[str, Ticket] = {}
    queries: dict[str, Query] = {}
    pairs: dict[tuple[str, str], LabeledPair] = {}
    pair_meta: dict[tuple[str, str], dict] = {}
    origin: dict[tuple[str, str], tuple[_Parsed, str]] = {}
    for part in parts:
        tickets.update(part.tickets)
        queries.update(part.queries)
        for key, pair in part.pairs.items():
            pairs[key] = pair
            origin[key] = (part, part.where[key])
            pair_meta.pop(key, None)
        pair_meta.update(part.pair_meta)
    known_t, known_q = set(known_ticket_ids), set(known_query_ids)
    for key in pairs:
        part, where = origin[key]
        if key[0] not in queries and key[0] not in known_q:
            raise part.fail(where, f"the pair names query {key[0]!r}, which is in none of the files given nor in "
                                   "the knowledge base", "import the query with it (same or another file)")
        if key[1] not in tickets and key[1] not in known_t:
            raise part.fail(where, f"the pair names ticket {key[1]!r}, which is in none of the files given nor in "
                                   "the knowledge base", "import the ticket with it (same or another file)")
    feedback = []
    for part in parts:
        for judgement, where in part.feedback:
            if judgement.ticket_id not in tickets and judgement.ticket_id not in known_t:
                raise part.fail(where, f"the feedback names ticket {judgement.ticket_id!r}, which is in none of the "
                                       "files given nor in the knowledge base", "import the ticket with it")
            feedback.append(judgement)
    source = ", ".join(str(p.path) for p in parts)
    return Dataset(list(tickets.values()), list(queries.values()), list(pairs.values()), source=source,
                   pair_meta=pair_meta, feedback=feedback)


def load(path: str | Path, fmt: str = "auto", *, progress: bool = False,
         known_ticket_ids: Iterable[str] = (), known_query_ids: Iterable[str] = (),
         mapping: ColumnMap | None = None, warn: Warn | None = None, settings: Settings | None = None,
         html: str = "auto") -> Dataset:
    """Parse and validate one file (JSONL, CSV or SemEval XML) into a Dataset; `InputError` on any bad record.

    Pairs may name tickets/queries in `known_*` (e.g. the store's) besides those of the file. `mapping` reads a
    help desk's export of tickets (CSV, Excel or JSONL with its own column names, see `check_mapping`); `warn` gets the
    one-line warnings (default: the log). Fields longer than `settings.max_subject_chars` (subjects) or
    `settings.max_field_chars` (descriptions, solutions) are cut to that length, and one warning line says how many
    tickets were cut (`settings` default: `Settings.from_env()`). `html` says which fields of a CSV, Excel or JSONL file
    are read as HTML (`markup.read_html`: auto, yes, no); one line to `warn` per field that holds markup.
    """
    return load_many([path], fmt, progress=progress, known_ticket_ids=known_ticket_ids,
                     known_query_ids=known_query_ids, mapping=mapping, warn=warn, settings=settings, html=html)


def load_many(paths: Sequence[str | Path], fmt: str = "auto", *, progress: bool = False,
              known_ticket_ids: Iterable[str] = (), known_query_ids: Iterable[str] = (),
              mapping: ColumnMap | None = None, warn: Warn | None = None, settings: Settings | None = None,
              html: str = "auto") -> Dataset:
    """Parse and validate several files and merge them (a later file's record replaces an earlier one's);
    a pair may name a ticket or query of any of the files. `mapping`, `warn`, `settings` and `html` as in `load`
    (for every file, each file's fields decided on their own; one warning line for the fields cut in all of them)."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not paths:
        raise InputError("no input file given; name at least one JSONL, CSV or SemEval XML file")
    if html not in HTML_MODES:
        raise InputError(f"unknown HTML mode {html!r}; use one of {', '.join(HTML_MODES)}")
    limits = _limits(settings)
    parts = [_parse(p, fmt, progress, mapping, warn, limits, html) for p in paths]
    dataset = _merge(parts, known_ticket_ids, known_query_ids)
    _warn_cut(parts, warn)
    return dataset


# -- column mappings ------------------------------------------------------------------------------------------------
def check_mapping(mapping: ColumnMap) -> dict[str, str]:
    """A validated column mapping: keys among id, subject, description, solution (case-insensitive), values
    non-empty column names. A field left out is read from the column of its own name, when there is one."""
    out: dict[str, str] = {}
    for key, column in dict(mapping).items():
        name = str(key).strip().lower()
        if name not in TICKET_COLUMNS:
            raise InputError(f"cannot map {key!r}: the ticket fields are {', '.join(TICKET_COLUMNS)}; "
                             "write e.g. id=\"Issue id\"")
        if not isinstance(column, str) or not column.strip():
            raise InputError(f"the column mapped to {name} is empty; write {name}=COLUMN")
        out[name] = column.strip()
    return out


def _mapping_item(item: str) -> tuple[str, str] | None:
    """(field, column) of one `field=Column` string, the column's quotes removed; None without "="."""
    key, sep, column = str(item).partition("=")
    if not sep:
        return None
    column = column.strip()
    if len(column) >= 2 and column[0] == column[-1] and column[0] in "\"'":  # id="Issue id" in a file
        column = column[1:-1]
    return key.strip(), column


def parse_mapping(items: Iterable[str]) -> dict[str, str]:
    """A mapping from `key=Column` strings (the CLI's `--map`; the user's own words, so quoted in errors)."""
    out: dict[str, str] = {}
    for item in items:
        pair = _mapping_item(item)
        if pair is None:
            raise InputError(f"cannot read the mapping {_shown(item)}; write FIELD=COLUMN, e.g. subject=Summary")
        out[pair[0]] = pair[1]
    return check_mapping(out)


def read_mapping(path: str | Path) -> dict[str, str]:
    """A mapping file: a JSON object {"id": "Issue id", ...}, or one `field=Column` per line (# comments).

    Errors name the line (or key) but never quote the file, which may be anything the user pointed at."""
    path = Path(path)
    todo = 'write FIELD=COLUMN lines (e.g. subject=Summary) or one JSON object {"id": "COLUMN", ...}'
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_MAPPING_FILE_BYTES + 1)
        if len(raw) > _MAPPING_FILE_BYTES:
            raise InputError(f"{path} is longer than {_MAPPING_FILE_BYTES // 1024} KiB, too long for a mapping file; "
                             f"check the path ({todo})")
        text = raw.decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        reason = (exc.strerror or exc) if isinstance(exc, OSError) else f"not UTF-8, {exc.reason}"
        raise InputError(f"cannot read the mapping file {path}: {reason}; "
                         "check the path (a UTF-8 text file)") from None
    if text.lstrip().startswith("{"):
        try:
            data = parse_json(text)
        except InputError as exc:
            raise InputError(f"{path}: {exc}; {todo}") from None
        if not isinstance(data, dict):
            raise InputError(f"{path}: the mapping must be a JSON object of field → column; {todo}")
        for n, (key, column) in enumerate(data.items(), 1):
            if str(key).strip().lower() not in TICKET_COLUMNS or not isinstance(column, str):
                raise InputError(f"{path}: entry {n} of the object is not a ticket field ({', '.join(TICKET_COLUMNS)}) "
                                 f"mapped to a column name; {todo}")
        return check_mapping(data)
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        pair = _mapping_item(line)
        if pair is None or pair[0].lower() not in TICKET_COLUMNS:
            raise InputError(f"{path}, line {n}: not a FIELD=COLUMN line with FIELD one of {', '.join(TICKET_COLUMNS)}; "
                             f"{todo}")
        out[pair[0]] = pair[1]
    return check_mapping(out)


# -- duplicate links ------------------------------------------------------------------------------------------------
def load_links(path: str | Path, columns: Sequence[str] | None = None, *, known_ids: Iterable[str] | None = None,
               warn: Warn | None = None) -> list[tuple[str, str]]:
    """The duplicate links of a CSV file: (ticket id, ticket id) pairs, each distinct link once.

    Two id columns: the `columns` named (a header is then required; names match ignoring case), else the first
    two columns, with the first row taken as a header when it is not a pair of ids (neither cell a known id
    when `known_ids` is given; otherwise a cell holding white space or no digit). Self-links and repeats
    (a–b again, or b–a) are dropped; with `known_ids`, links naming an unknown id are dropped too. What was
    dropped is reported in one line through `warn` (default: the log). InputError when no link is left.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path} does not exist or is not a file; check the path of the links file")
    known = None if known_ids is None else set(known_ids)
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            sample = fh.read(65536)
            fh.seek(0)
            try:
                dialect = csv.Sniffer().sniff(sample, delimiters=",;\t")
            except csv.Error:
                dialect = csv.excel
            rows = [row for row in csv.reader(fh, dialect) if any(cell.strip() for cell in row)]
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}, {_undecodable_where(path)}: not UTF-8 ({exc.reason}); save the links file as "
                         "UTF-8") from None
    except csv.Error as exc:
        raise InputError(f"{path}: bad CSV ({exc}); fix the quoting") from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}; check the path and its permissions") from exc
    if not rows:
        raise InputError(f"{path} is empty; give one link (two ticket ids) per line")
    header = [c.strip() for c in rows[0]]
    if columns is not None:
        if len(columns) != 2:
            raise InputError(f"name exactly two link columns, not {len(columns)}")
        folded = {h.lower(): i for i, h in enumerate(header)}
        at = [folded.get(str(column).strip().lower()) for column in columns]
        for column, i in zip(columns, at):
            if i is None:
                raise InputError(f"{path}, line 1: no column {_shown(column)}; {_found_columns(rows[0], rows[1:21])}; "
                                 "name two columns of its header")
        body = rows[1:]
    else:
        if len(header) < 2:
            raise InputError(f"{path}, line 1: a link needs two ticket ids, separated by a comma")
        at = [0, 1]
        if known is not None:
            is_header = not (header[0] in known or header[1] in known)
        else:
            is_header = any(re.search(r"\s", c) or not re.search(r"\d", c) for c in header[:2])
        body = rows[1:] if is_header else rows
    first_line = len(rows) - len(body) + 1
    links: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    self_links = repeats = unknown = 0
    for n, row in enumerate(body, first_line):
        if len(row) <= max(at):
            raise InputError(f"{path}, line {n}: the row has {len(row)} fields; a link needs two ticket ids")
        a, b = row[at[0]].strip(), row[at[1]].strip()
        if not a or not b:
            raise InputError(f"{path}, line {n}: an empty ticket id; give two ids per link")
        if a == b:
            self_links += 1
            continue
        key = (a, b) if a < b else (b, a)
        if key in seen:
            repeats += 1
            continue
        seen.add(key)
        if known is not None and (a not in known or b not in known):
            unknown += 1
            continue
        links.append((a, b))
    if self_links or repeats or unknown:
        parts = []
        if unknown:
            parts.append(f"{unknown} naming a ticket that is not in the knowledge base")
        if self_links:
            parts.append(f"{self_links} self-links")
        if repeats:
            parts.append(f"{repeats} repeats (a-b again or b-a)")
        (warn or log.warning)(f"{path}: {len(links)} distinct links kept; dropped {', '.join(parts)}")
    if not links:
        raise InputError(f"{path}: no usable link (two different ticket ids"
                         f"{' of the knowledge base' if known is not None else ''}); check the ids and columns")
    return links


def ticket_record(t: Ticket) -> dict:
    """A ticket as a JSONL record."""
    record = {"type": "ticket", **t.to_dict()}
    if not t.metadata:
        del record["metadata"]
    return record


def feedback_record(fb: Feedback) -> dict:
    """An engineer's judgement as a JSONL record (what `_feedback` reads)."""
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
