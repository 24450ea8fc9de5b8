"""Column mappings of a help desk's export (our field → its column): from the CLI's `--map` or a mapping file."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from ...errors import InputError
from ..records import parse_json
from .parsed import TICKET_COLUMNS, ColumnMap, shown


#: A mapping file is a few lines; a longer file is refused before it is read.
_MAPPING_FILE_BYTES = 64 * 1024


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
            raise InputError(f"cannot read the mapping {shown(item)}; write FIELD=COLUMN, e.g. subject=Summary")
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
