"""Duplicate-link files: two ticket ids per CSV line, the truth of the knowledge-base protocol."""
from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Iterable, Sequence

from ...errors import InputError
from .parsed import Warn, log, shown, text_encoding, undecodable_where
from .tables import UNCLOSED_QUOTE, NumberedRows, found_columns, refuse_unclosed_quote


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
        encoding = text_encoding(path)
        with open(path, encoding=encoding, newline="") as fh:
            sample = fh.read(65536)
            fh.seek(0)
            try:
                dialect = csv.Sniffer().sniff(sample, delimiters=",;\t")
            except csv.Error:
                dialect = csv.excel
            numbered = NumberedRows(csv.reader(fh, dialect))
            rows = [row for _, row in numbered if any(cell.strip() for cell in row)]
        refuse_unclosed_quote(path, encoding, numbered, lambda where: InputError(
            f"{path}, {where}: {'; '.join(UNCLOSED_QUOTE)}"), dialect=dialect)
    except UnicodeDecodeError as exc:
        where = "begins as UTF-16 but is not" if encoding == "utf-16" else f"{undecodable_where(path)}: not UTF-8"
        raise InputError(f"{path}, {where} ({exc.reason}); save the links file as UTF-8") from None
    except csv.Error as exc:
        raise InputError(f"{path}, line {numbered.start}: bad CSV ({exc}); fix the quoting") from None
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
                raise InputError(f"{path}, line 1: no column {shown(column)}; {found_columns(rows[0], rows[1:21])}; "
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
