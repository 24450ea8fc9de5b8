"""Safe highlighting of the words a ticket shares with the query (escape every piece, then wrap matches)."""
from __future__ import annotations

from typing import Iterable

from markupsafe import Markup, escape

from recommender.lexical.analyzer import matched_keys, stem_key, term_spans, word_spans


def highlight(text: str, terms: Iterable[str]) -> Markup:
    """`text` as HTML-escaped markup with every word that BM25 takes for one of `terms` wrapped in <mark>: the same
    stems (`stem_key`), so the query's "attaching" marks "attachments", as the shared terms were found; a term of
    one word also inside a longer word, as it is shared (".../dictionaries/en-US.aff" for "dictionary").

    The raw text is split at the matches and each piece is escaped on its own, so neither a term nor the
    text can inject markup, and a term never matches inside an entity such as `&amp;`.
    """
    text = text or ""
    keys = {key for key in map(stem_key, terms) if key}
    if not keys:
        return escape(text)
    pieces: list[Markup] = []
    position = 0
    for start, end in _marked(text, keys):
        pieces.append(escape(text[position:start]))
        pieces.append(Markup("<mark>%s</mark>") % text[start:end])
        position = end
    pieces.append(escape(text[position:]))
    return Markup("").join(pieces)


def _marked(text: str, keys: set[tuple[str, ...]]) -> Iterable[tuple[int, int]]:
    """(start, end) of each word of `text` whose stem key is one of `keys`, and of each term inside a longer word
    whose own key is one of them, in order."""
    for match in word_spans(text):
        key = stem_key(match.group(0))
        if key in keys:
            yield match.span()
        elif matched_keys(key) & keys:  # a term of the query's inside this longer word
            yield from ((match.start() + t.start(), match.start() + t.end()) for t in term_spans(match.group(0))
                        if stem_key(t.group(0)) in keys)
