"""Read knowledge-base files (JSONL, CSV, Excel workbooks, SemEval-2016/2017 Task 3 XML) into a validated `Dataset`,
and duplicate-link files into id pairs.

Everything is parsed and checked before anything is written: a malformed record raises `InputError` naming
the file, the line (or XML element id) and the reason, and never quotes a file that is not a valid import (a
header's column names only when the file is a valid CSV with a header row). `Store.import_dataset` then writes the
result in one transaction. Subjects longer than `Settings.max_subject_chars` and descriptions or solutions longer
than `Settings.max_field_chars` are cut to that length, with one warning line per import saying how many tickets
were cut. A help desk's own export is read through a column mapping (`ColumnMap`: our field → its column).
The formats are documented in `docs/data-formats.md`.

One module a job: `reader` (the import: format, HTML, merge), one module per format (`jsonl`, `tables` for CSV and
worksheet rows, `xlsx`, `semeval`), `parsed` (what they share: a file's records and the field checks), `mapping`
(column mappings), `links` (duplicate-link files) and `request` (one ticket sent over the API).
"""
from .links import load_links
from .mapping import check_mapping, parse_mapping, read_mapping
from .parsed import TICKET_COLUMNS, ColumnMap, Warn
from .reader import FORMATS, detect_format, load, load_many
from .request import JSON_TICKET_FIELDS, MAX_METADATA_FIELDS, MAX_METADATA_NAME, ticket_from_json

__all__ = ["FORMATS", "JSON_TICKET_FIELDS", "MAX_METADATA_FIELDS", "MAX_METADATA_NAME", "TICKET_COLUMNS", "ColumnMap",
           "Warn", "check_mapping", "detect_format", "load", "load_links", "load_many", "parse_mapping",
           "read_mapping", "ticket_from_json"]
