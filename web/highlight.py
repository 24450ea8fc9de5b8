"""Safe highlighting of the words a ticket shares with the query (escape every piece, then wrap matches)."""
from __future__ import annotations

import re
from typing import Iterable

from markupsafe import Markup, escape


def highlight(text: str, terms: Iterable[str]) -> Markup:
    """`text` as HTML-escaped markup with every whole-word occurrence of `terms` wrapped in <mark>.

    The raw text is split at the matches and each piece is escaped on its own, so neither a term nor the
    text can inject markup, and a term never matches inside an entity such as `&amp;`.
    """
    text = text or ""
    words = sorted({t for t in terms if t and t.strip()}, key=len, reverse=True)
    if not words:
        return escape(text)
    pattern = re.compile(r"(?<!\w)(?:" + "|".join(re.escape(w) for w in words) + r")(?!\w)", re.IGNORECASE)
    pieces: list[Markup] = []
    position = 0
    for match in pattern.finditer(text):
        pieces.append(escape(text[position : match.start()]))
        pieces.append(Markup("<mark>%s</mark>") % match.group(0))
        position = match.end()
    pieces.append(escape(text[position:]))
    return Markup("").join(pieces)
