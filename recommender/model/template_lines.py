"""Template lines of a knowledge base, learnt from its tickets and left out of what the learned channels read.

Help-desk and bug-tracker exports repeat the lines of their forms in many tickets: "Steps to reproduce:", a browser's
user-agent string, a signature, a quoted template. They say nothing about which old ticket matches a new one, yet they
fill the first word pieces the sentence encoder S reads (256) and the first tokens the LSTM reads. A line is a
template line of a field (DESCRIPTION, SOLUTION) when, written the same way up to case, white space and digits, it
recurs in at least `min_share` of the tickets that fill the field (and at least `min_tickets` of them), each time
beside other lines of the same field. A text repeated whole (a ticket posted twice, the very duplicates ticketrec
looks for) is never one: the count takes only texts with another line.

BM25 reads the tickets as they are (its IDF already weighs such lines down, and the index must score what training
scored); the subject is never filtered.
"""
from __future__ import annotations

import dataclasses
import re
from collections import Counter
from typing import Sequence

#: The fields whose template lines are learnt (the attribute of a Ticket / Query), each on its own.
FIELDS = ("description", "solution")
#: The defaults: a line is a template line when it recurs in at least this share of the texts, and this many of them.
MIN_SHARE = 0.01
MIN_TICKETS = 5

_DIGITS = re.compile(r"\d+")
_SPACE = re.compile(r"\s+")


def line_key(line: str) -> str:
    """A line as template lines are compared: lower case, runs of white space one space, runs of digits one 0."""
    return _DIGITS.sub("0", _SPACE.sub(" ", line.strip().lower()))


def _line_keys(text: str) -> set[str]:
    return {key for line in text.splitlines() if (key := line_key(line))}


def learn_template_lines(texts: Sequence[str], min_share: float = MIN_SHARE,
                         min_tickets: int = MIN_TICKETS) -> list[str]:
    """The template lines (their `line_key`s, sorted) of one field's `texts`, one text per ticket (empty when the
    ticket leaves the field empty): keys found in at least max(`min_tickets`, `min_share` × the non-empty texts) of the
    texts that have another line too."""
    filled = [text for text in texts if text and text.strip()]
    counts: Counter = Counter()
    for text in filled:
        keys = _line_keys(text)
        if len(keys) > 1:
            counts.update(keys)
    least = max(int(min_tickets), min_share * len(filled))
    return sorted(key for key, n in counts.items() if n >= least)


def strip_lines(text: str, template: frozenset[str]) -> str:
    """`text` without its template lines (and without empty lines, once any line was left out)."""
    if not template or not text:
        return text
    lines = text.splitlines()
    kept = [line for line in lines if line.strip() and line_key(line) not in template]
    return text if len(kept) == len(lines) else "\n".join(kept)


@dataclasses.dataclass(frozen=True)
class TemplateLines:
    """The template lines of each field (`FIELDS`), as saved in a model's config (`to_dict` / `from_dict`)."""

    lines: dict[str, frozenset[str]]
    min_share: float = MIN_SHARE
    min_tickets: int = MIN_TICKETS

    @classmethod
    def learn(cls, tickets: Sequence, min_share: float = MIN_SHARE, min_tickets: int = MIN_TICKETS) -> "TemplateLines":
        """Learn each field's template lines from the knowledge base's `tickets`."""
        return cls({name: frozenset(learn_template_lines([getattr(t, name, "") or "" for t in tickets], min_share,
                                                         min_tickets)) for name in FIELDS}, min_share, min_tickets)

    def __len__(self) -> int:
        return sum(len(v) for v in self.lines.values())

    def strip(self, item):
        """`item` (a Ticket or Query) itself, or a copy without the template lines of its fields."""
        changed = {}
        for name, template in self.lines.items():
            value = getattr(item, name, None)
            if value:
                stripped = strip_lines(value, template)
                if stripped is not value:
                    changed[name] = stripped
        return dataclasses.replace(item, **changed) if changed else item

    def to_dict(self) -> dict:
        return {"min_share": self.min_share, "min_tickets": self.min_tickets,
                "lines": {name: sorted(v) for name, v in self.lines.items() if v}}

    @classmethod
    def from_dict(cls, data: dict | None) -> "TemplateLines | None":
        """The saved record (None, or a model saved before template lines existed: None)."""
        if not data:
            return None
        return cls({name: frozenset(data.get("lines", {}).get(name, ())) for name in FIELDS},
                   float(data.get("min_share", MIN_SHARE)), int(data.get("min_tickets", MIN_TICKETS)))
