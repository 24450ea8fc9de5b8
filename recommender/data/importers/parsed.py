"""What every import format shares: the records of one file with where each came from, and the checks of a
record's fields (ids, texts, scores, labels), whose errors name the file, the line and what to do."""
from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tqdm import tqdm

from ...config import Settings, default
from ...errors import InputError, printable
from ..records import LABEL_SCORES, LabeledPair, Query, Ticket, check_id, check_text
from ..store import Feedback


#: Our ticket fields, in the order a tickets file lists them; description and solution are optional.
TICKET_COLUMNS = ("id", "subject", "description", "solution")
#: Fields an export may spread over columns of one name (Jira writes a "Comment" column per comment) or give as a
#: JSON list of strings; their texts are joined, a blank line between them.
JOINED_COLUMNS = ("description", "solution")
PAIR_COLUMNS = ("query_id", "query_subject", "ticket_id")  # query_description optional
#: Column mapping of a help desk's export: our ticket field (id, subject, description, solution) → its column.
ColumnMap = Mapping[str, str]
#: Receives one-line warnings (records repeated with trivial differences, dropped links); default: the log.
Warn = Callable[[str], None]
#: How to make a file UTF-8, for the error that says it is not.
TO_UTF8 = "save the file as UTF-8 (from a Windows export, e.g. iconv -f cp1252 -t utf-8 FILE > FILE.utf8)"
#: The byte-order marks of UTF-16 (little-, big-endian), with which "Unicode" exports begin (Excel's "Unicode text",
#: SQL Server's and PowerShell's defaults).
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
SPACES = re.compile(r"\s+")
_QUOTES = re.compile("[\"'`\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u00ab\u00bb]")

log = logging.getLogger(__name__)


def shown(value: Any, limit: int = 60) -> str:
    """`value` for a one-line message: its repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _normalised(value: Any) -> Any:
    """`value` with quotes removed and white space folded (strings inside dicts too): what a repeated export
    record may differ by without being a different record."""
    if isinstance(value, str):
        return SPACES.sub(" ", _QUOTES.sub("", value)).strip()
    if isinstance(value, dict):
        return {k: _normalised(v) for k, v in value.items()}
    return value


def _same_record(a: Ticket | Query, b: Ticket | Query) -> bool:
    return _normalised(vars(a)) == _normalised(vars(b))


@dataclass
class Parsed:
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
    #: the names of a tickets file's other columns or fields (kept as metadata, or ignored), in file order: what
    #: the import's warning lists when no ticket has a description (`reader.no_description_warning`)
    other_fields: dict[str, None] = field(default_factory=dict)

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


def text_field(parsed: Parsed, where: str, record: dict, name: str, required: bool = True) -> str:
    """The text of field `name` of `record` (a list of strings joined for the joined fields), checked and stripped;
    "" when it is missing and not `required`."""
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


def id_field(parsed: Parsed, where: str, record: dict, name: str) -> str:
    """The id in field `name` of `record` (a string or an integer), checked."""
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


def score_field(parsed: Parsed, where: str, score: Any, label: Any) -> float:
    """The 1–5 score of a pair given as `score` (number) and/or `label` (YES/REL/NO)."""
    from_label = None
    if label not in (None, ""):
        if not isinstance(label, str) or label.strip().upper() not in LABEL_SCORES:
            raise parsed.fail(where, f"unknown label {shown(label)}", "use YES, REL or NO (or a score from 1 to 5)")
        from_label = LABEL_SCORES[label.strip().upper()]
    if score in (None, ""):
        if from_label is None:
            raise parsed.fail(where, "a pair needs a 'score' (1-5) or a 'label' (YES, REL, NO)", "add one of them")
        return from_label
    if isinstance(score, str):
        try:
            score = float(score.strip())
        except ValueError:
            raise parsed.fail(where, f"score {shown(score)} is not a number", "use a number from 1 to 5") from None
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise parsed.fail(where, f"score {shown(score)} is not a number", "use a number from 1 to 5")
    if not 1.0 <= float(score) <= 5.0:
        raise parsed.fail(where, f"score {score:g} is outside 1-5", "use the 1-5 scale (YES 5, REL 3, NO 1)")
    if from_label is not None and from_label != float(score):
        raise parsed.fail(where, f"score {score:g} contradicts label {shown(label)}", "give only one of them")
    return float(score)


def ticket_field(parsed: Parsed, where: str, record: dict, metadata: dict) -> Ticket:
    """A ticket from a record with our field names; description and solution may be missing (empty); long fields cut."""
    ticket_id = id_field(parsed, where, record, "id")
    ticket = Ticket(
        ticket_id,
        *(parsed.clip("ticket", ticket_id, name, text_field(parsed, where, record, name, required=name == "subject"))
          for name in ("subject", "description", "solution")),
        metadata,
    )
    if not ticket.subject and not ticket.description:
        raise parsed.fail(where, f"ticket {ticket.id!r} has neither subject nor description",
                          "fill in at least one of them")
    return ticket


def query_field(parsed: Parsed, where: str, record: dict, prefix: str = "") -> Query:
    """A query from a record's fields (`prefix` + id, subject, description: "query_" in a pairs table)."""
    query_id = id_field(parsed, where, record, prefix + "id")
    query = Query(
        parsed.clip("query", query_id, "subject", text_field(parsed, where, record, prefix + "subject")),
        parsed.clip("query", query_id, "description",
                    text_field(parsed, where, record, prefix + "description", required=False)),
        query_id,
    )
    if not query.subject and not query.description:
        raise parsed.fail(where, f"query {query.id!r} has neither subject nor description",
                          "fill in at least one of them")
    return query


def feedback_field(parsed: Parsed, where: str, record: dict) -> Feedback:
    """An engineer's judgement as `ticketrec export` writes it: the query's subject and description, the judged
    ticket, YES/REL/NO, and (optional) who gave it, when (seconds since 1970) and the versions that served it."""
    subject = text_field(parsed, where, record, "subject")
    description = text_field(parsed, where, record, "description", required=False)
    if not subject and not description:
        raise parsed.fail(where, "the feedback's query has neither subject nor description", "fill in one of them")
    label = record.get("label")
    if not isinstance(label, str) or label.strip().upper() not in LABEL_SCORES:
        raise parsed.fail(where, f"unknown feedback label {shown(label)}", "use YES, REL or NO")
    created = record.get("created_at", 0.0)
    if isinstance(created, bool) or not isinstance(created, (int, float)) or not math.isfinite(created) or created < 0:
        raise parsed.fail(where, f"created_at {shown(created)} is not a time",
                          "give seconds since 1970, or leave it out (the import's time)")
    model_version, index_version, user = (text_field(parsed, where, record, name, required=False)
                                          for name in ("model_version", "index_version", "user"))
    return Feedback(subject, description, id_field(parsed, where, record, "ticket_id"), label.strip().upper(),
                    model_version, index_version, float(created), user_name=user)


def progress_bar(path: Path, enabled: bool) -> tqdm:
    """A progress bar over the bytes of the file being read (shown only when `enabled`)."""
    size = path.stat().st_size
    return tqdm(total=size, unit="B", unit_scale=True, desc=f"reading {printable(path.name)}", disable=not enabled,
                leave=False)


def column_names(names: Sequence[str], limit: int = 40) -> str:
    """Column names for a one-line message: white space folded, long names cut, at most `limit` of them."""
    listed = [repr(SPACES.sub(" ", str(n)).strip()[:60]) for n in names[:limit]]
    return ", ".join(listed) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def import_limits(settings: Settings | None) -> tuple[int, int]:
    """(longest subject, longest description / solution) of an import: the settings', default from the environment."""
    settings = settings or Settings.from_env()
    limits = (settings.max_subject_chars, settings.max_field_chars)
    for env, value in zip(("TICKETREC_MAX_SUBJECT_CHARS", "TICKETREC_MAX_FIELD_CHARS"), limits):
        if value < 1:
            raise InputError(f"{env} must be at least 1, not {value}; fix or unset it")
    return limits


def text_encoding(path: str | Path) -> str:
    """How to decode a CSV file: "utf-16" when it begins with a UTF-16 byte-order mark, else "utf-8-sig" (UTF-8,
    with or without its mark)."""
    with open(path, "rb") as raw:
        return "utf-16" if raw.read(2) in UTF16_BOMS else "utf-8-sig"


def undecodable_where(path: str | Path) -> str:
    """Where the first byte of `path` that is not UTF-8 is, for an error: "line 5002, byte 8" (both from 1, as an
    editor shows them: lines split at newline bytes, which never occur inside a UTF-8 character)."""
    with open(path, "rb") as raw:
        for number, line in enumerate(raw, 1):
            try:
                line.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                return f"line {number}, byte {exc.start + 1}"
    return "somewhere"
