"""HTML in a help desk's export: which ticket fields hold it, and the text a browser shows for it.

Help desks that store rich text (Zendesk, Freshdesk, OTRS, ...) export descriptions and solutions as HTML. Read as
written, the tag and style words become search terms and every result card shows the markup. `read_html` decides
per field: with `mode="auto"` a field is read as HTML when at least `HTML_SHARE` of its non-empty values hold
markup (an export renders a field as HTML everywhere or nowhere; a bug tracker whose plain text quotes a tag now
and then stays as written). A value read as HTML becomes its rendered text (inscriptis: paragraphs, line breaks and
list items as lines, `<pre>` kept as laid out, entities decoded, scripts, styles and comments dropped); values
without markup are left as they are.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Sequence, TypeVar

#: `--html`: auto (decide per field, `HTML_SHARE`), yes (read every value with markup as HTML), no (as written).
HTML_MODES = ("auto", "yes", "no")
#: With `--html auto`, a field is read as HTML when at least this share of its non-empty values hold markup.
HTML_SHARE = 0.5

# Markup: a tag of a common HTML element (opening, closing or empty, with attributes), or a character reference.
# Angle brackets around anything else (<https://...>, <user@example.com>, "x < 5 and y > 3", <stdin>) are not.
_ELEMENTS = ("a abbr b big blockquote body br caption center code col colgroup dd del details div dl dt em "
             "figcaption figure font footer h1 h2 h3 h4 h5 h6 head header hr html i img ins kbd li mark ol p pre "
             "q s samp section small span strike strong sub summary sup table tbody td tfoot th thead title tr tt "
             "u ul").split()
_MARKUP = re.compile(r"</?(?:%s)(?=[\s/>])[^<>]{0,1000}>|&(?:[a-z][a-z0-9]{1,30}|#[0-9]{1,7}|#x[0-9a-f]{1,6});"
                     % "|".join(_ELEMENTS), re.IGNORECASE)
_ANY_TAG = re.compile(r"<[^<>]*>")
_BLANK_LINES = re.compile(r"\n[ \t]*(?:\n[ \t]*)+\n")

R = TypeVar("R")


def holds_markup(text: str) -> bool:
    """Whether `text` holds an HTML tag of a common element or a character reference (`&amp;`, `&#39;`)."""
    return bool(text) and _MARKUP.search(text) is not None


@lru_cache(maxsize=1)
def _renderer():
    """inscriptis and lxml, imported when an import first reads HTML (the CLI starts without them)."""
    from inscriptis import Inscriptis
    from inscriptis.css_profiles import CSS_PROFILES
    from inscriptis.model.config import ParserConfig
    from lxml import etree
    from lxml import html as lxml_html

    config = ParserConfig(css=CSS_PROFILES["strict"])  # no indentation of <div>s; lists, tables and <pre> laid out
    parser = lxml_html.HTMLParser(huge_tree=True)  # deep nesting (mail clients') beyond libxml2's default limit

    def render(text: str) -> str:
        try:
            tree = lxml_html.fromstring(text, parser=parser)
            # inscriptis unescapes the parsed text once more (2.7: "&amp;lt;b&amp;gt;" would show as "<b>", a URL's
            # "&amp;timestamp=" as "×tamp="): every "&" escaped here comes back as itself
            for node in tree.iter():
                if node.text and "&" in node.text:
                    node.text = node.text.replace("&", "&amp;")
                if node.tail and "&" in node.tail:
                    node.tail = node.tail.replace("&", "&amp;")
            return Inscriptis(tree, config).get_text()
        except (etree.ParserError, ValueError, RecursionError):  # no element at all, or nested past the recursion limit
            return ""

    return render


def html_to_text(text: str) -> str:
    """The text a browser shows for the HTML `text`: one line per paragraph, line break and list item, blank lines
    folded to one, white space at the ends stripped."""
    shown = _renderer()(text)
    if not shown.strip():  # what the parser could not lay out: the words between the tags, on one line
        shown = " ".join(html.unescape(_ANY_TAG.sub(" ", text)).split())
    lines = "\n".join(line.rstrip() for line in shown.splitlines())
    return _BLANK_LINES.sub("\n\n", lines).strip()


@dataclass(frozen=True)
class FieldMarkup:
    """How one field of an import was read: `with_markup` of its `filled` non-empty values hold markup."""

    name: str
    with_markup: int
    filled: int
    as_html: bool


def read_html(records: Sequence[R], fields: Sequence[str], mode: str = "auto",
              progress: bool = False) -> tuple[list[R], list[FieldMarkup]]:
    """`records` (tickets or queries) with the values of each field in `fields` that `mode` reads as HTML replaced by
    their text, and for each field whose values hold any markup how it was read (`progress`: a bar per field)."""
    if mode not in HTML_MODES:
        raise ValueError(f"html mode must be one of {', '.join(HTML_MODES)}, not {mode!r}")
    records = list(records)
    found = []
    for name in fields:
        values = [getattr(r, name) for r in records]
        marked = [i for i, value in enumerate(values) if holds_markup(value)]
        if not marked:
            continue
        filled = sum(1 for value in values if value)
        as_html = mode == "yes" or (mode == "auto" and len(marked) >= HTML_SHARE * filled)
        found.append(FieldMarkup(name, len(marked), filled, as_html))
        if as_html:
            from tqdm import tqdm  # here, not at the top: the CLI imports this module (HTML_MODES) at start-up

            for i in tqdm(marked, desc=f"reading {name}s as HTML", unit="value", disable=not progress, leave=False):
                records[i] = replace(records[i], **{name: html_to_text(values[i])})
    return records, found
