"""Safe highlighting of the words a ticket shares with the query (escape every piece, then wrap matches)."""
from __future__ import annotations

from typing import Iterable

from markupsafe import Markup, escape

from recommender.lexical.analyzer import stem_key, word_spans


def highlight(text: str, terms: Iterable[str]) -> Markup:
    """`text` as HTML-escaped markup with every word that BM25 takes for one of `terms` wrapped in <mark>: the same
    stems (`stem_key`), so the query's "attaching" marks "attachments", as the shared terms were found.

    The raw text is split at the matches and each piece is escaped on its own, so neither a term nor the
    text can inject markup, and a term never matches inside an entity such as `&amp;`.
    """
    text = text or ""
    keys = {key for key in map(stem_key, terms) if key}
    if not keys:
        return escape(text)
    pieces: list[Markup] = []
    position = 0
    for match in word_spans(text):
        if stem_key(match.group(0)) in keys:
            pieces.append(escape(text[position : match.start()]))
            pieces.append(Markup("<mark>%s</mark>") % match.group(0))
            position = match.end()
    pieces.append(escape(text[position:]))
    return Markup("").join(pieces)
