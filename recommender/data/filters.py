"""Filters on the tickets' imported metadata: "only RESOLVED tickets", "only category Network", "created since 2024".

A condition is `FIELD OP VALUE[,VALUE...]` with OP one of `=` (any of the values), `!=` (none of them; a ticket
without the field passes), `>=` and `<=` (one value; numbers compare as numbers, anything else as text, which orders
ISO 8601 dates: `created>=2024-06` keeps tickets created in June 2024 or later); `\\,` is a comma inside a value.
Field names and `=`/`!=` values
compare case-insensitively and without surrounding white space; a list value (tags) matches when one of its items
does. Conditions on different fields all hold (AND); the values of one condition are alternatives (OR).

`MetadataTable` holds the metadata of many tickets by position (an index version's rows), so a filter becomes a
row mask without reading the store again for each query.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..errors import InputError
from .records import fold

#: The operators, longest first (so that `>=` is not read as `>` … `=`).
OPERATORS = ("!=", ">=", "<=", "=")
#: At most this many conditions in one filter, and this many values in one condition.
MAX_CONDITIONS = 10
MAX_VALUES = 50
MAX_CONDITION_CHARS = 1000
#: A field with at most this many distinct values is offered as a choice (the web page's filter menus).
MAX_CHOICES = 30

EXAMPLE = "status=RESOLVED,VERIFIED or created>=2024-01"


def _scalars(value: Any) -> tuple[str, ...]:
    """The text forms of a metadata value a condition reads (a list's scalar items; nothing for an object)."""
    if value is None or isinstance(value, dict):
        return ()
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if item is None or isinstance(item, (dict, list)):
            continue
        text = "true" if item is True else "false" if item is False else " ".join(str(item).split())
        if text:
            out.append(text)
    return tuple(out)


def _number(text: str) -> float | None:
    """The number `text` writes (None for anything else, "nan" and "inf" included: they would not order)."""
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


@dataclass(frozen=True)
class Condition:
    """One `FIELD OP VALUES` test (see the module's docstring)."""

    field: str  # folded
    op: str
    values: tuple[str, ...]  # folded for = and !=; as given (stripped) for >= and <=

    def __str__(self) -> str:
        return self.field + self.op + ",".join(v.replace(",", "\\,") for v in self.values)

    def holds(self, values: Sequence[str]) -> bool:
        """Whether a ticket whose field has these text values (none: the field is missing) passes."""
        if self.op == "=":
            return any(fold(v) in self.values for v in values)
        if self.op == "!=":
            return not any(fold(v) in self.values for v in values)
        return any(self._compares(v) for v in values)

    def _compares(self, value: str) -> bool:
        bound = self.values[0]
        a, b = _number(value), _number(bound)
        left, right = (a, b) if a is not None and b is not None else (value, bound)
        return left >= right if self.op == ">=" else left <= right


def parse_condition(text: str) -> Condition:
    """A `Condition` from `FIELD OP VALUE[,VALUE...]`; InputError saying what is wrong and how it is written."""
    if not isinstance(text, str):
        raise InputError(f"a filter condition must be text such as {EXAMPLE!r}, not {type(text).__name__}")
    raw = text.strip()
    if len(raw) > MAX_CONDITION_CHARS:
        raise InputError(f"a filter condition has at most {MAX_CONDITION_CHARS:,} characters, not {len(raw):,}")
    at = min(((raw.find(op), op) for op in OPERATORS if op in raw), default=None)
    if at is None or at[0] <= 0:
        raise InputError(f"the filter condition {raw!r} is not FIELD=VALUE, FIELD!=VALUE, FIELD>=VALUE or "
                         f"FIELD<=VALUE (for example {EXAMPLE})")
    position, op = at  # the first operator: `a!=b` finds `!=` at 1 before `=` at 2
    field = fold(raw[:position])
    parts = re.split(r"(?<!\\),", raw[position + len(op):])
    values = tuple(v for v in (" ".join(part.replace("\\,", ",").split()) for part in parts) if v)
    if not field or not values:
        raise InputError(f"the filter condition {raw!r} needs a field name and a value (for example {EXAMPLE})")
    if len(values) > MAX_VALUES:
        raise InputError(f"the filter condition on {field!r} lists {len(values)} values; at most {MAX_VALUES}")
    if op in (">=", "<=") and len(values) > 1:
        raise InputError(f"{field}{op} takes one value, not {len(values)}: {raw!r}")
    if op in ("=", "!="):
        values = tuple(dict.fromkeys(fold(v) for v in values))
    return Condition(field, op, values)


@dataclass(frozen=True)
class TicketFilter:
    """Conditions that a ticket's metadata must all meet."""

    conditions: tuple[Condition, ...]

    @classmethod
    def equal(cls, chosen: Mapping[str, str]) -> "TicketFilter | None":
        """field = value for each (field, value) chosen (a menu's choice: the value whole, commas and all); None
        when nothing is chosen."""
        conditions = tuple(Condition(fold(f), "=", (fold(v),)) for f, v in chosen.items() if fold(f) and fold(v))
        if len(conditions) > MAX_CONDITIONS or any(len(f) + len(v) > MAX_CONDITION_CHARS for f, v in chosen.items()):
            raise InputError(f"a filter has at most {MAX_CONDITIONS} conditions of at most "
                             f"{MAX_CONDITION_CHARS:,} characters")
        return cls(conditions) if conditions else None

    def __str__(self) -> str:
        return " and ".join(str(c) for c in self.conditions)

    @property
    def fields(self) -> list[str]:
        return list(dict.fromkeys(c.field for c in self.conditions))

    def matches(self, metadata: Mapping[str, Any] | None) -> bool:
        """Whether a ticket with this metadata passes every condition."""
        folded = {fold(k): v for k, v in (metadata or {}).items()}
        return all(c.holds(_scalars(folded.get(c.field))) for c in self.conditions)


def parse_filter(conditions: Iterable[str] | None) -> TicketFilter | None:
    """A `TicketFilter` from condition texts (None when there is none); InputError for a malformed one."""
    parsed = [parse_condition(c) for c in (conditions or [])]
    if len(parsed) > MAX_CONDITIONS:
        raise InputError(f"a filter has at most {MAX_CONDITIONS} conditions, not {len(parsed)}")
    return TicketFilter(tuple(parsed)) if parsed else None


class MetadataTable:
    """The metadata of `n` tickets by position, field by field, to turn filters into row masks.

    `fields[field][text] = positions` (field folded, text as stored): the inverted lists of every scalar value."""

    def __init__(self, n: int):
        self.n = n
        self.fields: dict[str, dict[str, list[int]]] = {}
        self._choices: dict[int, dict] = {}  # max_values → choices(max_values): a table does not change once made

    @classmethod
    def of(cls, n: int, rows: Iterable[tuple[int, Mapping[str, Any]]]) -> "MetadataTable":
        """From (position, metadata) pairs; positions outside [0, n) are an error."""
        table = cls(n)
        table._add(rows)
        return table

    def _add(self, rows: Iterable[tuple[int, Mapping[str, Any]]], own: set[tuple[str, str]] | None = None) -> None:
        """Append each row's values to the inverted lists. `own` None: every list is this table's; else only the
        (field, text) lists it names are, and any other (shared with the table this one was made from) is copied
        before its first append."""
        for position, metadata in rows:
            if not 0 <= position < self.n:
                raise IndexError(f"position {position} outside [0, {self.n})")
            for key, value in (metadata or {}).items():
                texts = _scalars(value)
                if texts:
                    field = fold(key)
                    values = self.fields.setdefault(field, {})
                    for text in dict.fromkeys(texts):
                        if own is not None and (field, text) not in own:
                            values[text] = list(values.get(text, ()))
                            own.add((field, text))
                        values.setdefault(text, []).append(position)

    def with_rows(self, rows: Iterable[tuple[int, Mapping[str, Any]]]) -> "MetadataTable":
        """A new table: this one with the given positions' metadata replaced (this one is left as it is, and shares
        every inverted list the change does not touch). Costs one pass over the lists, not a read of every ticket."""
        rows = list(rows)
        changed = {position for position, _ in rows}
        table = MetadataTable(self.n)
        own: set[tuple[str, str]] = set()
        for field, values in self.fields.items():
            kept = {}
            for text, positions in values.items():
                if changed.isdisjoint(positions):
                    kept[text] = positions
                else:
                    left = [p for p in positions if p not in changed]
                    if left:
                        kept[text] = left
                        own.add((field, text))
            if kept:
                table.fields[field] = kept
        table._add(rows, own)
        return table

    def mask(self, where: TicketFilter) -> np.ndarray:
        """bool [n]: the positions whose ticket passes `where`. InputError for a field no ticket has, or an `=`
        whose values no ticket holds (a typo, most likely), naming what there is."""
        keep = np.ones(self.n, bool)
        for condition in where.conditions:
            values = self.fields.get(condition.field)
            if values is None:
                have = ", ".join(sorted(self.fields)) or "none (the tickets were imported without other columns)"
                raise InputError(f"no ticket has a field {condition.field!r} to filter on; the knowledge base's "
                                 f"fields: {have}")
            hit = np.zeros(self.n, bool)
            if condition.op in ("=", "!="):  # the tickets holding one of the values (for != those are left out)
                for text, positions in values.items():
                    if fold(text) in condition.values:
                        hit[positions] = True
                if condition.op == "!=":
                    hit = ~hit
            else:
                for text, positions in values.items():
                    if condition.holds((text,)):
                        hit[positions] = True
            if condition.op == "=" and not hit.any():
                raise InputError(f"no ticket has {condition.field} {' or '.join(condition.values)}; its values: "
                                 f"{self.describe_values(condition.field)}")
            keep &= hit
        return keep

    def _counted(self, field: str) -> list[tuple[str, int]]:
        """A field's distinct values (folded; shown as first stored) with their ticket counts, most frequent first."""
        merged: dict[str, tuple[str, int]] = {}
        for text, positions in self.fields.get(field, {}).items():
            shown, count = merged.get(fold(text), (text, 0))
            merged[fold(text)] = (shown, count + len(positions))
        return sorted(merged.values(), key=lambda tc: (-tc[1], tc[0]))

    def describe_values(self, field: str, at_most: int = 12) -> str:
        """A field's most frequent values, as "RESOLVED (509), NEW (120), …"."""
        counted = self._counted(field)
        shown = ", ".join(f"{text} ({count:,})" for text, count in counted[:at_most])
        return shown + (f", and {len(counted) - at_most:,} more" if len(counted) > at_most else "")

    def choices(self, max_values: int = MAX_CHOICES) -> dict[str, list[tuple[str, int]]]:
        """The fields with 2 to `max_values` distinct values, each value with its ticket count, most frequent
        first: what a menu can offer (dates and ids have too many). Computed once per table."""
        if max_values not in self._choices:
            out = {}
            for field in sorted(self.fields):
                distinct: set[str] = set()
                for text in self.fields[field]:  # stop as soon as there are too many (a date has one per ticket)
                    distinct.add(fold(text))
                    if len(distinct) > max_values:
                        break
                if 2 <= len(distinct) <= max_values:
                    out[field] = self._counted(field)
            self._choices[max_values] = out
        return self._choices[max_values]
