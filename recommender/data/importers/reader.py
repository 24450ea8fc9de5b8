"""The import itself: each file parsed by its format, its HTML read, repeated records and cut fields reported,
several files merged into one validated `Dataset`."""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Iterable, Sequence

from ...config import Settings
from ...errors import InputError
from ..markup import HTML_MODES, read_html
from ..records import LabeledPair, Query, Ticket
from ..store import Dataset
from .jsonl import parse_jsonl
from .mapping import check_mapping
from .parsed import ColumnMap, Parsed, Warn, column_names, import_limits, log, shown
from .semeval import parse_semeval
from .tables import parse_csv
from .xlsx import parse_xlsx


#: Formats `load` understands; "auto" picks one from the file extension.
FORMATS = ("auto", "jsonl", "csv", "xlsx", "semeval")
_EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "csv",
               ".xlsx": "xlsx", ".xlsm": "xlsx", ".xml": "semeval"}


_PARSERS = {"jsonl": parse_jsonl, "csv": parse_csv, "xlsx": parse_xlsx, "semeval": parse_semeval}


def detect_format(path: str | Path, fmt: str = "auto") -> str:
    """The format of `path`: `fmt` itself unless "auto", then by extension (.jsonl/.json, .csv/.tsv, .xlsx, .xml)."""
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
                         "name it .jsonl, .csv, .tsv, .xlsx or .xml, or give --format jsonl|csv|xlsx|semeval")
    return found


def _warn_cut(parts: Sequence[Parsed], warn: Warn | None) -> None:
    """One warning line for the whole import: how many tickets (and queries) had a field cut to the limits."""
    cut = {kind: set().union(*(p.cut[kind] for p in parts)) for kind in ("ticket", "query")}
    if not cut["ticket"] and not cut["query"]:
        return
    ids = sorted(cut["ticket"] or cut["query"])
    subject, text = parts[0].limits
    queries = f" and {len(cut['query'])} queries" if cut["query"] else ""
    (warn or log.warning)(f"{len(cut['ticket'])} tickets{queries} had a field longer than the import limits (subject "
                          f"{subject:,}, description or solution {text:,} characters) and were cut to them (ids "
                          f"{', '.join(shown(i, 40) for i in ids[:5])}{', ...' if len(ids) > 5 else ''}); raise "
                          "TICKETREC_MAX_SUBJECT_CHARS / TICKETREC_MAX_FIELD_CHARS to keep more")


def _read_html(parsed: Parsed, mode: str, warn: Warn, progress: bool) -> None:
    """The file's ticket and query fields that `mode` reads as HTML (`markup.read_html`) replaced by their text, with
    one line to `warn` per field that holds markup saying how it was read."""
    for kind, records, fields in (("ticket", parsed.tickets, ("subject", "description", "solution")),
                                  ("query", parsed.queries, ("subject", "description"))):
        read, found = read_html(list(records.values()), fields, mode, progress)
        for record in read:
            if not record.subject and not record.description:
                raise parsed.fail(f"{kind} {shown(record.id, 40)}", "its subject and description hold no text once "
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
           warn: Warn | None = None, limits: tuple[int, int] | None = None, html: str = "auto") -> Parsed:
    path = Path(path)
    kind = detect_format(path, fmt)
    if not path.is_file():
        raise InputError(f"{path} does not exist or is not a file; check the path")
    if mapping is not None and kind == "semeval":
        raise InputError(f"{path} is SemEval XML, whose fields are fixed; give a column mapping only for CSV, Excel or "
                         "JSONL")
    parsed = Parsed(path, mapping=None if mapping is None else check_mapping(mapping),
                    limits=limits or import_limits(None))
    try:
        _PARSERS[kind](parsed, progress)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}; check the path and its permissions") from exc
    if kind != "semeval":  # an export's text; SemEval's is the forum's plain text
        _read_html(parsed, html, warn or log.warning, progress)
    missing = no_description_warning(parsed, kind)
    if missing:
        (warn or log.warning)(missing)
    if parsed.repeated:
        ids = list(dict.fromkeys(parsed.repeated))
        (warn or log.warning)(f"{path}: {len(parsed.repeated)} records repeat an earlier id with only white-space or "
                              f"quote differences; kept the first of each (ids {', '.join(ids[:5])}"
                              f"{', ...' if len(ids) > 5 else ''})")
    return parsed


def no_description_warning(parsed: Parsed, kind: str) -> str | None:
    """The warning for a tickets file none of whose tickets has a description (a valid knowledge base, but most
    often a description column the import did not read: misspelt, or under a name of the tool's own), naming the
    file's other columns (`kind` "csv", "xlsx": columns; "jsonl": fields) and the one nearest "description"; None
    when a ticket has one."""
    tickets = list(parsed.tickets.values())
    if not tickets or any(t.description for t in tickets):
        return None
    mapped = (parsed.mapping or {}).get("description")
    if mapped is not None:
        return (f"{parsed.path}: the column {shown(mapped)} (mapped to description) is empty in every record; check "
                "the mapping of description")
    noun = "field" if kind == "jsonl" else "column"
    others = list(parsed.other_fields)
    near = difflib.get_close_matches("description", [o.lower() for o in others], n=1, cutoff=0.75)
    guess = next((o for o in others if near and o.lower() == near[0]), None)
    if kind == "jsonl" and parsed.mapping is None:  # ticketrec's own lines: a field name to correct
        todo = f"rename the field {shown(guess)} to \"description\"" if guess else 'name it "description"'
        todo = f"if a field holds the descriptions, {todo} and import the file again"
    else:
        todo = (f"if a {noun} holds the descriptions, import the file again with --map "
                f"description={shown(guess) if guess else noun.upper()}")
    listed = f" (its other {noun}s: {column_names(others, 12)})" if others else ""
    which = "its one ticket has no" if len(tickets) == 1 else f"none of its {len(tickets):,} tickets has a"
    read = "subjects and solutions" if any(t.solution for t in tickets) else "subjects"
    return f"{parsed.path}: {which} description{listed}; tickets are then matched by their {read} alone; {todo}"


def _merge(parts: Sequence[Parsed], known_ticket_ids: Iterable[str], known_query_ids: Iterable[str]) -> Dataset:
    """One Dataset from several files: a later file's ticket, query or pair replaces an earlier one with that id.

    Every pair must name a query and a ticket of these files or of `known_*` (e.g. already in the store).
    """
    tickets: dict[str, Ticket] = {}
    queries: dict[str, Query] = {}
    pairs: dict[tuple[str, str], LabeledPair] = {}
    pair_meta: dict[tuple[str, str], dict] = {}
    origin: dict[tuple[str, str], tuple[Parsed, str]] = {}
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
    limits = import_limits(settings)
    parts = [_parse(p, fmt, progress, mapping, warn, limits, html) for p in paths]
    dataset = _merge(parts, known_ticket_ids, known_query_ids)
    _warn_cut(parts, warn)
    return dataset
