"""The analyser: word tokenisation (no downloaded NLTK data), number masking, stop words, and the BM25 terms.

Two pipelines share the stop list. `tokenize` feeds the model (words with numbers masked). The BM25 terms feed
every lexical score (the index's postings, the in-memory scorer of training and evaluation, the FTS5 and
Elasticsearch queries): `term_tokens` splits like SQLite FTS5's unicode61 tokenizer, `query_terms` drops stop
words and counts, `fts5_stem` reduces a word to its Porter stem the way FTS5's porter tokenizer does.
"""
from __future__ import annotations

import html
import re
import unicodedata
from collections import Counter
from functools import lru_cache
from typing import Iterable, Iterator

from ..data.records import Ticket, query_text, ticket_text

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


#: English text has 30–48 % stop words (SeaMonkey's bug reports 30 %, SemEval-2016's forum 48 %, the synthetic
#: tickets 37 %); German or French tickets 0–4 % (`benchmarks/stop_word_share.py`). Below this share a knowledge base
#: does not read as English.
ENGLISH_STOP_SHARE = 0.10


def stop_word_share(texts: Iterable[str]) -> float:
    """The share of the word tokens of `texts` that are English stop words (0 when there are none): how English
    the texts read."""
    words = stops = 0
    for text in texts:
        tokens = tokenize(text)
        words += len(tokens)
        stops += sum(1 for t in tokens if t in STOP_WORDS)
    return stops / words if words else 0.0


def content_words(tokens: Iterable[str]) -> list[str]:
    """Tokens without stop words and masks, for explanations (shared terms)."""
    return [t for t in tokens if t not in STOP_WORDS and t != NUMBER_TOKEN and len(t) > 1]


def token_documents(tickets: Iterable[Ticket], with_solution: bool, stop_words: bool) -> list[list[str]]:
    """One token document per ticket, SUB+DESC or (`with_solution`) SUB+DESC+SOL, its content words only unless
    `stop_words`: what the topic models' perplexity comparison trains and scores on."""
    docs = []
    for t in tickets:
        tokens = tokenize(ticket_text(t) if with_solution else query_text(t))
        docs.append(tokens if stop_words else content_words(tokens))
    return docs


# -- BM25 terms -------------------------------------------------------------------------------------------------
#: The most distinct terms a BM25 query keeps (`bm25.select_terms` picks which).
MAX_QUERY_TERMS = 64

# unicode61 (the FTS5 tokenizer under porter) splits on everything that is not a letter, digit or private-use
# character; this regex splits the same way (the underscore is a separator there too).
_TERM = re.compile(r"[^\W_]+", re.UNICODE)


def term_tokens(text: str) -> list[str]:
    """Every lower-cased word of `text` as FTS5's unicode61 tokenizer splits it (stop words included)."""
    return [t.lower() for t in _TERM.findall(text or "")]


def term_spans(text: str) -> Iterator[re.Match]:
    """The terms of raw `text` as `term_tokens` splits them, each as its match (where it stands in `text`)."""
    return _TERM.finditer(text or "")


def word_spans(text: str) -> Iterator[re.Match]:
    """The words of raw `text` as `tokenize` splits them, each as its match (where it stands in `text`)."""
    return _WORD.finditer(text or "")


@lru_cache(maxsize=100_000)
def stem_key(word: str) -> tuple[str, ...]:
    """The stems of a word's terms as BM25 indexes them (`term_tokens`, `fts5_stem`): "Crashes" and "crashing" are
    ("crash",), "mozilla/5.0" is ("mozilla", "5", "0"). Two words with one key are the same word to BM25."""
    return tuple(fts5_stem(t) for t in term_tokens(word))


@lru_cache(maxsize=100_000)
def matched_keys(key: tuple[str, ...]) -> frozenset[tuple[str, ...]]:
    """The stem keys of the query words that a text's word of stem key `key` matches, as BM25 matches them: its own,
    and each of its terms alone when it has several ("dictionary" inside ".../dictionaries/en-US.aff"); a query word
    of several terms ("mozilla/5.0") matches only a word of the same terms."""
    return frozenset([key, *((term,) for term in key)]) if len(key) > 1 else frozenset([key])


def query_terms(text: str) -> Counter:
    """Lower-cased word terms of `text` with their counts, stop words removed, in first-occurrence order.

    Splits like FTS5's unicode61 tokenizer, so everything that is not a letter or digit (quotes, `*`, `-`, `^`,
    `:`, parentheses) is a separator and never reaches a search engine as syntax.
    """
    return Counter(t for t in term_tokens(text) if t not in STOP_WORDS)


@lru_cache(maxsize=1)
def _stemmer():
    from nltk.stem.porter import PorterStemmer

    return PorterStemmer(mode=PorterStemmer.ORIGINAL_ALGORITHM)


@lru_cache(maxsize=100_000)
def fts5_stem(term: str) -> str:
    """Approximately the term FTS5's `porter unicode61` tokenizer stores (diacritics removed, Porter stem).

    The BM25 postings and the in-memory scorer (`bm25.py`) index these stems; on the SemEval-2016 vocabulary
    they equal SQLite's own stems for 99.7 % of words (`benchmarks/lexical_agreement.py` measures the effect).
    """
    plain = "".join(c for c in unicodedata.normalize("NFKD", term) if not unicodedata.combining(c))
    return plain if len(plain) < 3 else _stemmer().stem(plain)
