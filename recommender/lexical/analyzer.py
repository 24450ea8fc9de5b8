"""The analyser: word tokenisation (no downloaded NLTK data), number masking, stop words."""
from __future__ import annotations

import html
import re
from functools import lru_cache
from typing import Iterable

NUMBER_TOKEN = "##"
_NUMBER = re.compile(r"^[+-]?\d[\d.,:/%-]*[a-z]{0,3}$")
_TAG = re.compile(r"<[^>]{0,200}>")
_SPACE = re.compile(r"\s+")

#: A short English stop list (no NLTK corpus download needed); used for IDF weighting and explanations.
STOP_WORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have having
    he her here hers herself him himself his how i if in into is it its itself just me more most my myself no
    nor not now of off on once only or other our ours ourselves out over own same she should so some such than
    that the their theirs them themselves then there these they this those through to too under until up very
    was we were what when where which while who whom why will with would you your yours yourself yourselves
    also get got can't cannot don't doesn't didn't isn't aren't wasn't won't i'm it's i've i'd i'll
    that's there's what's let's ve ll re s t d m""".split()
)

#: Words, with inner hyphens, apostrophes and number punctuation kept ("o-ring", "isn't", "50.5", "10:30").
#: A regular expression rather than NLTK's Treebank tokenizer: that one expects one sentence at a time and
#: leaves sentence-internal periods on words ("inspection."), and it is four times slower. Compiled with `re`
#: rather than through NLTK's RegexpTokenizer, whose ReDoS time-out guard (NLTK ≥ 3.10) makes it 3× slower;
#: this pattern needs no guard: every repetition must consume a separator, so it cannot backtrack badly.
_WORD = re.compile(r"\w+(?:['’\-.,:/]\w+)*|##+")


def clean(text: str) -> str:
    """Unescape HTML entities, drop tags and fold white space (forum and ticket text carries both)."""
    text = html.unescape(text or "")
    text = _TAG.sub(" ", text)
    return _SPACE.sub(" ", text).strip()


@lru_cache(maxsize=200_000)
def _normalise_token(token: str) -> str:
    token = token.lower()
    if _NUMBER.match(token):
        return NUMBER_TOKEN
    return token


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens with numbers masked as `##`; punctuation-only tokens dropped."""
    return tokenize_clean(clean(text))


def tokenize_clean(text: str) -> list[str]:
    """`tokenize` for text that `clean` already cleaned (e.g. a sentence of `SentenceSplitter.split`)."""
    return [_normalise_token(t) for t in _WORD.findall(text)]


def content_words(tokens: Iterable[str]) -> list[str]:
    """Tokens without stop words and masks, for explanations (shared terms)."""
    return [t for t in tokens if t not in STOP_WORDS and t != NUMBER_TOKEN and len(t) > 1]
