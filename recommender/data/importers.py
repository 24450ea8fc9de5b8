"""Read knowledge-base files (JSONL, CSV, SemEval-2016/2017 Task 3 XML) into a validated `Dataset`.

Everything is parsed and checked before anything is written: a malformed record raises `InputError` naming
the file, the line (or XML element id) and the reason. `Store.import_dataset` then writes the result in one
transaction. The formats are documented in `docs/data-formats.md`.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from tqdm import tqdm

from ..errors import InputError
from .records import LABEL_SCORES, LabeledPair, Query, Ticket
from .store import Dataset

#: Formats `load` understands; "auto" picks one from the file extension.
FORMATS = ("auto", "jsonl", "csv", "semeval")
_EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".xml": "semeval"}

#: SemEval-2016/2017 Task 3 subtask B relevance of a related question to the original one → the 1–5 scale.
SEMEVAL_LABELS = {"PerfectMatch": 5.0, "Relevant": 3.0, "Irrelevant": 1.0}

TICKET_COLUMNS = ("id", "subject", "description", "solution")
PAIR_COLUMNS = ("query_id", "query_subject", "query_description", "ticket_id")


@dataclass
class _Parsed:
    """One file's records plus where each came from (for error messages that name a line)."""

    path: Path
    tickets: dict[str, Ticket] = field(default_factory=dict)
    queries: dict[str, Query] = field(default_factory=dict)
    pairs: dict[tuple[str, str], LabeledPair] = field(default_factory=dict)
    pair_meta: dict[tuple[str, str], dict] = field(default_factory=dict)
    where: dict[tuple[str, str], str] = field(default_factory=dict)  # pair key → "line 12" / "element ..."

    def fail(self, where: str, reason: str, todo: str = "fix the record and import again") -> InputError:
        return InputError(f"{self.path}, {where}: {reason}; {todo} (nothing was imported)")

    def add_ticket(self, ticket: Ticket, where: str) -> None:
        old = self.tickets.get(ticket.id)
        if old is not None and old != ticket:
            raise self.fail(where, f"ticket id {ticket.id!r} appears twice with different content",
                            "give every ticket a unique id, or remove the duplicate")
        self.tickets.setdefault(ticket.id, ticket)

    def add_query(self, query: Query, where: str) -> None:
        old = self.queries.get(query.id)
        if old is not None and old != query:
            raise self.fail(where, f"query id {query.id!r} appears twice with different content",
                            "give every query a unique id, or make its repeated subject and description identical")
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
    if not isinstance(value, str):
        raise parsed.fail(where, f"field {name!r} must be a string, not {type(value).__name__}")
    return value.strip()


def _ident(parsed: _Parsed, where: str, record: dict, name: str) -> str:
    value = record.get(name)
    if value is None:
        raise parsed.fail(where, f"missing field {name!r}", f"add {name!r} to the record")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise parsed.fail(where, f"field {name!r} must be a string or an integer, not {type(value).__name__}")
    value = str(value).strip()
    if not value:
        raise parsed.fail(where, f"field {name!r} is empty", "give every record a non-empty id")
    return value


def _score(parsed: _Parsed, where: str, score: Any, label: Any) -> float:
    """The 1–5 score of a pair given as `score` (number) and/or `label` (YES/REL/NO)."""
    from_label = None
    if label not in (None, ""):
        if not isinstance(label, str) or label.strip().upper() not in LABEL_SCORES:
            raise parsed.fail(where, f"unknown label {label!r}", "use YES, REL or NO (or a score from 1 to 5)")
        from_label = LABEL_SCORES[label.strip().upper()]
    if score in (None, ""):
        if from_label is None:
            raise parsed.fail(where, "a pair needs a 'score' (1-5) or a 'label' (YES, REL, NO)", "add one of them")
        return from_label
    if isinstance(score, str):
        try:
            score = float(score.strip())
        except ValueError:
            raise parsed.fail(where, f"score {score!r} is not a number", "use a number from 1 to 5") from None
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise parsed.fail(where, f"score {score!r} is not a number", "use a number from 1 to 5")
    if not 1.0 <= float(score) <= 5.0:
        raise parsed.fail(where, f"score {score:g} is outside 1-5", "use the 1-5 scale (YES 5, REL 3, NO 1)")
    if from_label is not None and from_label != float(score):
        raise parsed.fail(where, f"score {score:g} contradicts label {label!r}", "give only one of them")
    return float(score)


def _ticket(parsed: _Parsed, where: str, record: dict, metadata: dict) -> Ticket:
    ticket = Ticket(
        _ident(parsed, where, record, "id"),
        _text(parsed, where, record, "subject"),
        _text(parsed, where, record, "description"),
        _text(parsed, where, record, "solution"),
        metadata,
    )
    if not ticket.subject and not ticket.description:
        raise parsed.fail(where, f"ticket {ticket.id!r} has neither subject nor description",
                          "fill in at least one of them")
    return ticket


def _query(parsed: _Parsed, where: str, record: dict, prefix: str = "") -> Query:
    query = Query(
        _text(parsed, where, record, prefix + "subject"),
        _text(parsed, where, record, prefix + "description"),
        _ident(parsed, where, record, prefix + "id"),
    )
    if not query.subject and not query.description:
        raise parsed.fail(where, f"query {query.id!r} has neither subject nor description",
                          "fill in at least one of them")
    return query


def _progress(path: Path, enabled: bool) -> tqdm:
    size = path.stat().st_size
    return tqdm(total=size, unit="B", unit_scale=True, desc=f"reading {path.name}", disable=not enabled, leave=False)


# -- JSONL --------------------------------------------------------------------------------------------------------
def _parse_jsonl(parsed: _Parsed, progress: bool) -> None:
    with open(parsed.path, "rb") as raw, _progress(parsed.path, progress) as bar:
        for number, line in enumerate(raw, 1):
            bar.update(len(line))
            where = f"line {number}"
            try:
                text = line.decode("utf-8-sig" if number == 1 else "utf-8").strip()
            except UnicodeDecodeError as exc:
                raise parsed.fail(where, f"not UTF-8 ({exc.reason})", "save the file as UTF-8") from None
            if not text:
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as exc:
                raise parsed.fail(where, f"bad JSON ({exc.msg} at column {exc.colno})",
                                  "write one JSON object per line") from None
            if not isinstance(record, dict):
                raise parsed.fail(where, f"a line must hold a JSON object, not {type(record).__name__}")
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
            elif kind == "pair":
                qid = _ident(parsed, where, record, "query_id")
                tid = _ident(parsed, where, record, "ticket_id")
                meta = record.get("metadata")
                if meta is not None and not isinstance(meta, dict):
                    raise parsed.fail(where, "field 'metadata' must be a JSON object")
                parsed.add_pair(LabeledPair(qid, tid, _score(parsed, where, record.get("score"), record.get("label"))),
                                where, meta)
            else:
                raise parsed.fail(where, f"unknown record type {kind!r}",
                                  'set "type" to "ticket", "query" or "pair"')


# -- CSV ----------------------------------------------------------------------------------------------------------
def _parse_csv(parsed: _Parsed, progress: bool) -> None:
    with open(parsed.path, "rb") as raw, _progress(parsed.path, progress) as bar:
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
        reader = csv.reader(text)
        try:
            header = next(reader, None)
            if header is None:
                raise parsed.fail("line 1", "the file is empty", "add a header row and records")
            columns = [h.strip().lower() for h in header]
            if len(set(columns)) != len(columns) or "" in columns:
                raise parsed.fail("line 1", f"the header {header} has an empty or repeated column name")
            if all(c in columns for c in TICKET_COLUMNS):
                kind = "tickets"
            elif all(c in columns for c in PAIR_COLUMNS) and ("score" in columns or "label" in columns):
                kind = "pairs"
            else:
                raise parsed.fail("line 1", f"unrecognised header {header}",
                                  "a tickets file needs the columns id,subject,description,solution; a pairs file "
                                  "query_id,query_subject,query_description,ticket_id and score or label")
            extra = [c for c in columns if c not in TICKET_COLUMNS]
            start = reader.line_num + 1
            for row in reader:
                where = f"line {start}"
                start = reader.line_num + 1
                bar.update(raw.tell() - bar.n)
                if not any(cell.strip() for cell in row):
                    continue
                if len(row) != len(columns):
                    raise parsed.fail(where, f"the row has {len(row)} fields but the header has {len(columns)}",
                                      "quote fields that contain commas or line breaks")
                record = dict(zip(columns, row))
                if kind == "tickets":
                    metadata = {c: record[c] for c in extra if record[c] != ""}
                    parsed.add_ticket(_ticket(parsed, where, record, metadata), where)
                else:
                    query = _query(parsed, where, record, prefix="query_")
                    parsed.add_query(query, where)
                    tid = _ident(parsed, where, record, "ticket_id")
                    score = _score(parsed, where, record.get("score"), record.get("label"))
                    parsed.add_pair(LabeledPair(query.id, tid, score), where)
        except csv.Error as exc:
            raise parsed.fail(f"line {reader.line_num}", f"bad CSV ({exc})", "fix the quoting") from None
        except UnicodeDecodeError as exc:
            raise parsed.fail(f"near line {reader.line_num}", f"not UTF-8 ({exc.reason})",
                              "save the file as UTF-8") from None


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
            return f"element <{element.tag} {attr}=\"{element.get(attr)}\">"
    return f"element <{element.tag}>"


def _parse_orgquestion(parsed: _Parsed, org) -> None:
    where = _semeval_where(org)
    orgq_id = (org.get("ORGQ_ID") or "").strip()
    if not orgq_id:
        raise parsed.fail(where, "OrgQuestion without ORGQ_ID", "every OrgQuestion needs an ORGQ_ID attribute")
    query = Query((org.findtext("OrgQSubject") or "").strip(), (org.findtext("OrgQBody") or "").strip(), orgq_id)
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
        rank_text = rel.get("RELQ_RANKING_ORDER")
        try:
            ir_rank = int(rank_text) if rank_text not in (None, "") else None
        except ValueError:
            raise parsed.fail(rwhere, f"RELQ_RANKING_ORDER {rank_text!r} is not an integer") from None
        comments = thread.findall("RelComment")
        good = [c for c in comments if c.get("RELC_RELEVANCE2RELQ") == "Good"] or comments
        solution = "\n".join(t for t in ((c.findtext("RelCText") or "").strip() for c in good) if t)
        metadata = {"format": "semeval", "orgq_id": orgq_id, "ir_rank": ir_rank,
                    "category": rel.get("RELQ_CATEGORY", ""), "date": rel.get("RELQ_DATE", "")}
        ticket = Ticket(relq_id, (rel.findtext("RelQSubject") or "").strip(), (rel.findtext("RelQBody") or "").strip(),
                        solution, metadata)
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
            raise parsed.fail(rwhere, f"unknown RELQ_RELEVANCE2ORGQ {label!r}",
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
            raise parsed.fail("the DTD", f"unsafe XML refused ({type(exc).__name__}: {exc})",
                              "remove entity declarations and external references from the file") from None
    if not seen_root or not (parsed.queries or parsed.tickets):
        raise parsed.fail("the root element", "no OrgQuestion element found",
                          "give a SemEval-2016/2017 Task 3 English (subtask B) file")


_PARSERS = {"jsonl": _parse_jsonl, "csv": _parse_csv, "semeval": _parse_semeval}


# -- public face ----------------------------------------------------------------------------------------------------
def detect_format(path: str | Path, fmt: str = "auto") -> str:
    """The format of `path`: `fmt` itself unless "auto", then by extension (.jsonl/.json, .csv, .xml)."""
    path = Path(path)
    if fmt not in FORMATS:
        raise InputError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    if fmt != "auto":
        return fmt
    found = _EXTENSIONS.get(path.suffix.lower())
    if found is None:
        raise InputError(f"cannot tell the format of {path} from its extension {path.suffix or '(none)'!r}; "
                         "name it .jsonl, .csv or .xml, or give --format jsonl|csv|semeval")
    return found


def _parse(path: str | Path, fmt: str, progress: bool) -> _Parsed:
    path = Path(path)
    kind = detect_format(path, fmt)
    if not path.is_file():
        raise InputError(f"{path} does not exist or is not a file; check the path")
    parsed = _Parsed(path)
    try:
        _PARSERS[kind](parsed, progress)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}; check the path and its permissions") from exc
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
    source = ", ".join(str(p.path) for p in parts)
    return Dataset(list(tickets.values()), list(queries.values()), list(pairs.values()), source=source,
                   pair_meta=pair_meta)


def load(path: str | Path, fmt: str = "auto", *, progress: bool = False,
         known_ticket_ids: Iterable[str] = (), known_query_ids: Iterable[str] = ()) -> Dataset:
    """Parse and validate one file (JSONL, CSV or SemEval XML) into a Dataset; `InputError` on any bad record.

    Pairs may name tickets/queries in `known_*` (e.g. the store's) besides those of the file.
    """
    return _merge([_parse(path, fmt, progress)], known_ticket_ids, known_query_ids)


def load_many(paths: Sequence[str | Path], fmt: str = "auto", *, progress: bool = False,
              known_ticket_ids: Iterable[str] = (), known_query_ids: Iterable[str] = ()) -> Dataset:
    """Parse and validate several files and merge them (a later file's record replaces an earlier one's);
    a pair may name a ticket or query of any of the files."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not paths:
        raise InputError("no input file given; name at least one JSONL, CSV or SemEval XML file")
    return _merge([_parse(p, fmt, progress) for p in paths], known_ticket_ids, known_query_ids)


def iter_records(dataset: Dataset) -> Iterator[dict]:
    """The dataset as JSONL records (tickets, queries, pairs), the inverse of the JSONL importer."""
    for t in dataset.tickets:
        record = {"type": "ticket", "id": t.id, "subject": t.subject, "description": t.description,
                  "solution": t.solution}
        if t.metadata:
            record["metadata"] = t.metadata
        yield record
    for q in dataset.queries:
        yield {"type": "query", "id": q.id, "subject": q.subject, "description": q.description}
    meta = getattr(dataset, "pair_meta", {}) or {}
    for p in dataset.pairs:
        record = {"type": "pair", "query_id": p.query_id, "ticket_id": p.ticket_id, "score": p.score}
        if (p.query_id, p.ticket_id) in meta:
            record["metadata"] = meta[(p.query_id, p.ticket_id)]
        yield record
