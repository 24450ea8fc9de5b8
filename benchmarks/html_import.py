"""Does an HTML export read back as its text? Real plain text stored as a rich-text help desk stores it.

A rich-text help desk (Zendesk, Freshdesk, ...) keeps what an engineer typed as HTML: escaped, a <p> per paragraph, a
<br> per line break. This takes a real export's plain descriptions (SeaMonkey by default), writes them that way into
a CSV, imports it with `--html auto` (`importers.load`) and compares each description read back with the one of the
plain export: the same non-blank lines (white space folded), the same model tokens (`analyzer.tokenize`), the same
BM25 terms (`analyzer.query_terms`). `--copies N` repeats the knowledge base N times (new ids) for the import time,
as written (`--html no`) and as HTML.

    .venv/bin/python benchmarks/html_import.py [--kb ../shared/data/seamonkey/SeaMonkey_bugs.csv] [--copies 50]
"""
from __future__ import annotations

import argparse
import csv
import html
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from shared_data import SEAMONKEY, seamonkey_tickets

_PARAGRAPHS = re.compile(r"\n[ \t]*\n")


def as_rich_text(text: str) -> str:
    """`text` as a rich-text editor stores it: escaped, a <p> per paragraph, a <br> per line break."""
    return "".join("<p>" + "<br>".join(html.escape(line) for line in p.split("\n")) + "</p>"
                   for p in _PARAGRAPHS.split(text) if p.strip())


def lines(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def write(path: Path, tickets, copies: int, rich: bool) -> None:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "subject", "description"])
        for k in range(copies):
            for t in tickets:
                writer.writerow([f"{t.id}-{k}" if copies > 1 else t.id, t.subject,
                                 as_rich_text(t.description) if rich else t.description])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kb", default=str(SEAMONKEY), help="a SeaMonkey-style export (Issue id, Summary, Description)")
    ap.add_argument("--copies", type=int, default=50, help="copies of the knowledge base for the import times")
    args = ap.parse_args()
    if not Path(args.kb).exists():
        sys.exit(f"no file at {args.kb}: pass --kb")
    from recommender.data.importers import load
    from recommender.lexical.analyzer import query_terms, tokenize

    plain = [t for t in seamonkey_tickets(args.kb) if t.description]
    with tempfile.TemporaryDirectory() as tmp:
        rich_path = Path(tmp) / "rich.csv"
        write(rich_path, plain, 1, rich=True)
        notes: list[str] = []
        read = load(rich_path, warn=notes.append).tickets
        same = {"lines": 0, "tokens": 0, "terms": 0}
        for a, b in zip(plain, read):
            same["lines"] += lines(a.description) == lines(b.description)
            same["tokens"] += tokenize(a.description) == tokenize(b.description)
            same["terms"] += query_terms(a.description) == query_terms(b.description)
        seconds = {}
        for rich in (False, True):
            path = Path(tmp) / f"copies-{rich}.csv"
            write(path, plain, args.copies, rich)
            start = time.perf_counter()
            load(path, html="auto", warn=lambda _: None)
            seconds[rich] = time.perf_counter() - start
    n = len(plain)
    kb = os.path.relpath(args.kb) if Path(args.kb).is_absolute() else args.kb
    print(f"    .venv/bin/python benchmarks/html_import.py --kb {kb} --copies {args.copies}\n")
    print("the import said: " + "; ".join(note.split(": ", 1)[1] for note in notes) + "\n")
    print("| descriptions | same non-blank lines | same model tokens | same BM25 terms |")
    print("|---|---|---|---|")
    print(f"| {n:,} | {same['lines']:,} | {same['tokens']:,} | {same['terms']:,} |\n")
    print("| tickets imported | as written | as HTML | per description read as HTML |")
    print("|---|---|---|---|")
    print(f"| {n * args.copies:,} | {seconds[False]:.1f} s | {seconds[True]:.1f} s | "
          f"{(seconds[True] - seconds[False]) / (n * args.copies) * 1e3:.2f} ms |")


if __name__ == "__main__":
    main()
