"""Excel workbooks: the first worksheet, read as a CSV export of it would be."""
from __future__ import annotations

import datetime
import re
from typing import Any, Iterator

from tqdm import tqdm

from ...errors import printable
from .parsed import Parsed, shown
from .tables import empty_tail_cut, named_width, parse_table


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


def _check_workbook_parts(parsed: Parsed) -> None:
    """InputError for a workbook whose parts would unpack to far more than any export (before openpyxl reads one)."""
    import zipfile

    with zipfile.ZipFile(parsed.path) as archive:
        for part in archive.infolist():
            if part.file_size > _XLSX_PART_BYTES and part.file_size > _XLSX_RATIO * max(part.compress_size, 1):
                raise parsed.fail("the workbook", f"its part {shown(part.filename, 60)} unpacks to "
                                                  f"{part.file_size / (1 << 20):,.0f} MiB, "
                                                  f"{part.file_size // max(part.compress_size, 1):,} times its packed "
                                                  "size, which no export does (a damaged or hostile file)",
                                  "export the tickets as CSV (UTF-8) instead")


#: A formula element in a worksheet part (`<f>`, `<f t="shared" …/>`, or with a namespace prefix).
_FORMULA = re.compile(rb"<(?:\w+:)?f[\s>/]")


def _holds_formulas(parsed: Parsed) -> bool:
    """Whether any worksheet part of the workbook holds a formula (a streaming scan of its XML)."""
    import zipfile

    with zipfile.ZipFile(parsed.path) as archive:
        for name in archive.namelist():
            if not (name.startswith("xl/worksheets/") and name.endswith(".xml")):
                continue
            with archive.open(name) as part:
                tail = b""
                while chunk := part.read(1 << 20):
                    if _FORMULA.search(tail + chunk):
                        return True
                    tail = chunk[-16:]
    return False


def _check_formulas_computed(parsed: Parsed) -> None:
    """InputError at the first cell of the first sheet that holds a formula but no value for it: a workbook written
    by a program and never opened in a spreadsheet, which openpyxl (it computes nothing) would read as an empty cell."""
    from openpyxl import load_workbook
    from openpyxl.utils import get_column_letter

    formulas = load_workbook(parsed.path, read_only=True, data_only=False)
    values = load_workbook(parsed.path, read_only=True, data_only=True)
    try:
        pairs = zip(formulas.worksheets[0].iter_rows(values_only=True),
                    values.worksheets[0].iter_rows(values_only=True))
        for number, (written, computed) in enumerate(pairs, 1):
            for column, (formula, value) in enumerate(zip(written, computed), 1):
                if value is None and isinstance(formula, str) and formula.startswith("="):
                    raise parsed.fail(f"row {number}, column {get_column_letter(column)}",
                                      "a formula whose value the workbook does not hold (it was written by a program "
                                      "and never computed; read as it is, the cell would be empty)",
                                      "open and save the workbook in a spreadsheet, or export the tickets as CSV")
    finally:
        formulas.close()
        values.close()


def parse_xlsx(parsed: Parsed, progress: bool) -> None:
    """The first worksheet of an Excel workbook, read as a CSV export of it would be (`parse_table`)."""
    import zipfile

    from openpyxl import load_workbook
    from openpyxl.utils.exceptions import InvalidFileException

    try:
        _check_workbook_parts(parsed)
        if _holds_formulas(parsed):
            _check_formulas_computed(parsed)
        workbook = load_workbook(parsed.path, read_only=True, data_only=True)
    except (InvalidFileException, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise parsed.fail("the workbook", f"not an Excel workbook that can be read ({type(exc).__name__})",
                          "save it again from the spreadsheet as .xlsx, or export it as CSV (UTF-8)") from None
    try:
        sheet = workbook.worksheets[0]
        rows = ([_cell_text(v) for v in values] for values in sheet.iter_rows(values_only=True))
        header = next(rows, None)
        header = None if header is None else header[:named_width(header)]  # past the last named: formatting
        if not header:
            raise parsed.fail("row 1", f"the first sheet ({sheet.title!r}) is empty",
                              "put the header row and the records in the workbook's first sheet")
        width = len(header)

        def numbered() -> Iterator[tuple[int, list[str]]]:
            for number, row in enumerate(rows, 2):
                row = empty_tail_cut(row, width)
                yield number, row + [""] * (width - len(row))

        with tqdm(total=sheet.max_row, desc=f"reading {printable(parsed.path.name)}", unit="row", disable=not progress,
                  leave=False) as bar:
            parse_table(parsed, header, numbered(), "row", lambda: bar.update(1))
    finally:
        workbook.close()
