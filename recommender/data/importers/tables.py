"""Tables: CSV files (comma, semicolon, tab or bar separated) and the rows of a worksheet, read as tickets (by
their header or a column mapping) or as labelled pairs."""
from __future__ import annotations

import csv
import io
import itertools
from typing import Callable, Iterable, Iterator, Sequence

from ...errors import InputError
from ..records import LabeledPair
from .parsed import (JOINED_COLUMNS, PAIR_COLUMNS, TICKET_COLUMNS, TO_UTF8, Parsed, column_names, id_field,
                     progress_bar, query_field, score_field, shown, text_encoding, ticket_field, undecodable_where)


def found_columns(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """"the columns found are ..." when the file is a valid CSV with a header row (two or more short printable
    names, and `rows`, the first records, with as many fields); else words that quote nothing, so that a file that
    is no CSV export (a symlink to a secret, say) is never echoed."""
    plausible = (len(header) >= 2 and all(len(h) <= 100 and h.isprintable() for h in header)
                 and all(len(row) == len(header) for row in rows if any(cell.strip() for cell in row)))
    return f"the columns found are {column_names(header)}" if plausible else "the first line is not a CSV header row"


def _ticket_columns(parsed: Parsed, header: Sequence[str], found: str,
                    unit: str = "line") -> dict[str, list[int]]:
    """Our ticket field → the positions of its columns in `header` (none: not in the file, the field is empty).

    A mapped field takes the column the mapping names (exact name, else the same name ignoring case and
    surrounding white space); an unmapped field takes the column of its own name. A description or solution column
    may repeat (all of them are read); the id and subject columns may not. The id and a subject or description
    column are required. `found`: what an error says of the header (`found_columns`); `unit`: "line" or "row"."""
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
            raise parsed.fail(f"{unit} 1", f"no column {shown(column)} (mapped to {name}){found}",
                              f"fix the mapping of {name}")
    for name, positions in out.items():
        repeated = bool(positions) and folded.count(folded[positions[0]]) > 1
        if repeated and name not in JOINED_COLUMNS:
            i = positions[0]
            raise parsed.fail(f"{unit} 1, column {i + 1}",
                              f"the column {column_names([header[i]])} (for {name}) appears more than once",
                              "rename one of them")
    if not out["id"] or (not out["subject"] and not out["description"]):
        missing = "id" if not out["id"] else "subject"
        raise parsed.fail(f"{unit} 1", f"no column for the ticket {missing}{found}",
                          f"map one with --map {missing}=COLUMN")
    return out


class NumberedRows:
    """(first line, row) of every row left in a csv reader (a quoted field may span lines); `start` is the first
    line of the row being read, `last` that of the last row read (None before one)."""

    def __init__(self, reader):
        self.reader = reader
        self.start = reader.line_num + 1
        self.last: int | None = None

    def __iter__(self) -> Iterator[tuple[int, list[str]]]:
        for row in self.reader:
            self.last = self.start
            yield self.start, row
            self.start = self.reader.line_num + 1


#: What to say of a quote never closed (`refuse_unclosed_quote`): (what is wrong, what to do).
UNCLOSED_QUOTE = ("a quoted field opens in this record and is never closed (every line after it would be read as that "
                  "one field)", 'close the quote; a quote inside a quoted field is written twice ("")')


#: The line `ends_inside_quotes` appends after a closing quote: a record of its own only when that quote closed a
#: field the text had left open.
_SENTINEL = "ticketrec: end of the text read again"


def ends_inside_quotes(lines: Iterable[str], **dialect) -> bool:
    """Whether a lenient csv reader ends the first record of `lines` (CSV from the start of a record) inside a quoted
    field, i.e. that record ran into the end of the text.

    The import reads CSV leniently, as exports are written: a quote inside a field that was not quoted as a whole
    (`"Save" fails` in a tool's TSV) is taken as text. But a lenient reader takes a quote that is never closed as a
    field running to the end of the file, every record after it imported as that one field's text, silently; such a
    field is always in the last record read, which the import reads again with this. The same lenient reader reads
    it, followed by a line break, a closing quote, a line break and `_SENTINEL`: the sentinel comes out as the second
    record alone exactly when the quote closed a field left open (otherwise the quote opens a field that takes the
    sentinel in, or follows a complete record's text)."""
    quote = csv.reader([], **dialect).dialect.quotechar or '"'
    records = csv.reader(itertools.chain(lines, ["\n", quote + "\n", _SENTINEL + "\n"]), **dialect)
    next(records, None)
    return next(records, None) == [_SENTINEL]
def refuse_unclosed_quote(path, encoding: str, rows: NumberedRows, fail: Callable[[str], Exception],
                          **dialect) -> None:
    """Raise `fail("line N")` when the last record read (the header's when no row was), from line N, spans lines
    and, read again from there, ends inside a quoted field (`ends_inside_quotes`)."""
    last = rows.last or 1
    if last >= rows.reader.line_num:  # one line: a quote in it swallowed nothing
        return
    with open(path, encoding=encoding, newline="") as fh:
        if ends_inside_quotes(itertools.islice(fh, last - 1, None), **dialect):
            raise fail(f"line {last}")


def named_width(header: Sequence[str]) -> int:
    """How many columns the header names up to its last named one: a spreadsheet keeps columns past it (formatting,
    a stray cell cleared) as empty names, in a workbook and in its "Save as CSV" alike."""
    width = len(header)
    while width and not str(header[width - 1]).strip():
        width -= 1
    return width


def empty_tail_cut(row: list[str], width: int) -> list[str]:
    """`row` without its cells past `width` when they are all empty (else as it is, for the field count to refuse)."""
    return row[:width] if len(row) > width and not any(cell.strip() for cell in row[width:]) else row


#: The longest CSV field read (characters); a longer one is refused. Python's csv module stops at 131,072, which a
#: bug tracker's pasted log exceeds; such a field is read and then cut to the import limits like a JSONL one
#: (`Settings.max_field_chars`, with a warning). The bound stays: a quote never closed reads at most this much of
#: the file before it is refused.
CSV_FIELD_CHARS = 16 * 1024 * 1024

#: Field delimiters of exports besides the comma: spreadsheets in many locales save "CSV" with ";", and some
#: tools write tab- or bar-separated files.
OTHER_DELIMITERS = (";", "\t", "|")


def _delimiter(first_line: str) -> str:
    """The field delimiter of a CSV file whose first line is `first_line` (its header row): the one of ",", ";", tab
    and "|" that splits that row into the most fields, the comma on a tie (so a header of one name stays a comma
    file, and a tab-separated header whose names hold a comma is read by tabs)."""
    fields = {d: len(next(csv.reader([first_line], delimiter=d), [])) for d in (",", *OTHER_DELIMITERS)}
    return max(fields, key=lambda d: (fields[d], d == ","))


def parse_csv(parsed: Parsed, progress: bool) -> None:
    """Read a CSV file (UTF-8, or UTF-16 with its byte-order mark) into `parsed` (`parse_table`), its delimiter
    told by the header row."""
    encoding = text_encoding(parsed.path)
    with open(parsed.path, "rb") as raw, progress_bar(parsed.path, progress) as bar:
        # the header row, at most a million characters of it (a file of one huge line is refused by the reader below)
        header_line = io.TextIOWrapper(raw, encoding=encoding, errors="replace", newline="")
        delimiter = _delimiter(header_line.readline(1 << 20))
        header_line.detach()
        raw.seek(0)
        text = io.TextIOWrapper(raw, encoding=encoding, newline="")
        csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_CHARS))  # process-wide, and only raised
        reader = csv.reader(text, delimiter=delimiter)  # lenient; the last record checked: `ends_inside_quotes`
        rows = NumberedRows(reader)

        def unclosed(where: str) -> InputError:
            return parsed.fail(where, *UNCLOSED_QUOTE)

        try:
            records = iter(rows)
            first = next(records, None)
            if first is None:
                raise parsed.fail("line 1", "the file is empty", "add a header row and records")
            header = first[1]
            width = named_width(header)
            if width < len(header):  # unnamed columns at the end: ignored where they are empty
                header = header[:width]
                records = ((number, empty_tail_cut(row, width)) for number, row in records)
            try:
                parse_table(parsed, header, records, "line", lambda: bar.update(raw.tell() - bar.n))
            except InputError:  # the record it names may be one that a quote never closed ran into
                refuse_unclosed_quote(parsed.path, encoding, rows, unclosed, delimiter=delimiter)
                raise
            refuse_unclosed_quote(parsed.path, encoding, rows, unclosed, delimiter=delimiter)
        except csv.Error as exc:
            if "field larger than field limit" in str(exc):
                raise parsed.fail(f"line {rows.start}", f"a field has more than {csv.field_size_limit():,} characters",
                                  "shorten it, or fix the quoting") from None
            raise parsed.fail(f"line {rows.start}", f"bad CSV ({exc})", "fix the quoting") from None
        except UnicodeDecodeError as exc:
            if encoding == "utf-16":
                raise parsed.fail("the file", f"begins as UTF-16 but is not ({exc.reason})",
                                  "save the file as UTF-8") from None
            # the reader decodes ahead of the rows it returns: its line number is not the bad byte's
            raise parsed.fail(undecodable_where(parsed.path), f"not UTF-8 ({exc.reason})", TO_UTF8) from None


def parse_table(parsed: Parsed, header: list[str], rows: Iterator[tuple[int, list[str]]], unit: str,
                advance: Callable[[], None]) -> None:
    """The records of a table (a CSV file, a worksheet): tickets when the header or the mapping says so, else
    labelled pairs with their queries. `rows` yields (number, cells); `unit` names a number in errors ("line",
    "row"); `advance` moves the progress bar."""
    ahead = list(itertools.islice(rows, 20))  # the first records tell whether the header is a CSV header
    found = found_columns(header, (row for _, row in ahead))
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
                raise parsed.fail(f"{unit} 1, column {i + 1}",
                                  f"the column name {column_names([header[i]])} repeats column "
                                  f"{columns.index(column) + 1}", "rename one of them")
    if kind == "tickets":  # other columns are metadata (an export's nameless or repeated ones are skipped)
        source = _ticket_columns(parsed, header, found, unit)
        used = {i for positions in source.values() for i in positions}
        extra = [i for i, c in enumerate(columns) if i not in used and c and columns.index(c) == i]
        parsed.other_fields.update(dict.fromkeys(header[i].strip() for i in extra))
    for number, row in itertools.chain(ahead, rows):
        where = f"{unit} {number}"
        advance()
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(columns):
            raise parsed.fail(where, f"the row has {len(row)} fields but the header has {len(columns)}",
                              "quote fields that contain commas or line breaks")
        if kind == "tickets":  # a field of repeated columns is their list of cells, which `text_field` joins
            record = {name: [row[i] for i in positions] if len(positions) > 1 else row[positions[0]] if positions
                      else "" for name, positions in source.items()}
            metadata = {columns[i]: row[i] for i in extra if row[i] != ""}
            parsed.add_ticket(ticket_field(parsed, where, record, metadata), where)
        else:
            record = dict(zip(columns, row))
            query = query_field(parsed, where, record, prefix="query_")
            parsed.add_query(query, where)
            tid = id_field(parsed, where, record, "ticket_id")
            score = score_field(parsed, where, record.get("score"), record.get("label"))
            parsed.add_pair(LabeledPair(query.id, tid, score), where)
