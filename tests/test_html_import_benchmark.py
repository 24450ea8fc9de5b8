"""benchmarks/html_import.py: plain text stored as a rich-text editor stores it reads back as that text."""
from __future__ import annotations

from html_import import as_rich_text, lines

from recommender.data.markup import holds_markup, html_to_text

TEXTS = [
    "Steps:\n1. Switch to <HTML Source>\n2. x < 5 and y > 3 & more\n\nExpected: no crash",
    "See https://example.com/v?id=1&timestamp=2&copy=3 and write &auml; literally",
    "One line only",
]


def test_plain_text_stored_as_rich_text_reads_back_line_for_line():
    for text in TEXTS:
        stored = as_rich_text(text)
        assert stored.startswith("<p>") and holds_markup(stored)
        assert lines(html_to_text(stored)) == lines(text), stored
