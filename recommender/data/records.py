"""Plain records that flow through ticketrec (tickets, queries, labelled pairs, recommendations), and the checks
every text from outside passes before it becomes one: Unicode text (no lone surrogate), bounded ids, strict JSON."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError

#: The paper's 1–5 relatedness scale.
YES, REL, NO = 5.0, 3.0, 1.0
LABEL_SCORES = {"YES": YES, "REL": REL, "NO": NO}

#: Longest ticket or query id, in characters.
MAX_ID_CHARS = 200
#: Deepest nesting of JSON arrays and objects accepted (a record needs 3: line, metadata, a list in it).
MAX_JSON_DEPTH = 64
#: Most digits of a JSON number (a longer one is refused before Python converts it; give long ids as strings).
MAX_JSON_DIGITS = 100

_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(value: str, what: str, todo: str | None = "send UTF-8 text") -> str:
    """`value` unchanged when it is Unicode text; InputError naming `what` when it holds a lone surrogate (U+D800 to
    U+DFFF: e.g. a JSON escape like \\ud800 or undecodable command-line bytes), which no UTF-8 file, database or page
    can hold. The message (`todo` appended) never repeats the text."""
    if not value.isascii():
        found = _SURROGATE.search(value)
        if found is not None:
            raise InputError(f"{what} holds a lone surrogate (U+{ord(found.group()):04X} at character {found.start() + 1}), "
                             f"which is not Unicode text{'; ' + todo if todo else ''}")
    return value


def check_id(value: str, what: str = "the id") -> str:
    """`value` when it is a usable ticket or query id (Unicode text of at most MAX_ID_CHARS characters); InputError
    otherwise (the message never repeats a long id)."""
    if len(value) > MAX_ID_CHARS:
        raise InputError(f"{what} has {len(value):,} characters; ids have at most {MAX_ID_CHARS}")
    return check_text(value, what)


def _json_int(digits: str) -> int:
    if len(digits) > MAX_JSON_DIGITS + 1:
        raise InputError(f"a JSON number has {len(digits.lstrip('-')):,} digits, more than {MAX_JSON_DIGITS} (write "
                         "long ids as strings)")
    return int(digits)


def _json_float(text: str) -> float:
    if len(text) > MAX_JSON_DIGITS + 10:
        raise InputError(f"a JSON number has {len(text):,} characters, more than {MAX_JSON_DIGITS}")
    value = float(text)
    if not math.isfinite(value):
        raise InputError(f"the JSON number {text[:20]} is out of range")
    return value


def _json_constant(name: str) -> Any:
    raise InputError(f"{name} is not a JSON value (give a number or null)")


def parse_json(text: str | bytes) -> Any:
    """One JSON document, strictly: InputError (a one-line reason) for bad JSON, NaN/Infinity, numbers of more than
    MAX_JSON_DIGITS digits, nesting deeper than MAX_JSON_DEPTH and lone surrogates in any string or key."""
    try:
        value = json.loads(text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant)
    except RecursionError:
        raise InputError(f"the JSON is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"bad JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"the JSON is not UTF-8 ({exc.reason})") from None
    stack = [(value, 1)]  # walk without recursion: depth, and every string and key
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            check_text(item, "a JSON string", todo=None)
        elif isinstance(item, (list, dict)):
            if depth > MAX_JSON_DEPTH:
                raise InputError(f"the JSON is nested deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(item, dict):
                stack.extend((key, depth) for key in item)
                item = item.values()
            stack.extend((child, depth + 1) for child in item)
    return value


def fold(value: Any) -> str:
    """The form a text is compared in (a filter's field name or value, a ticket's field when copies are sought):
    text, white space collapsed, case folded."""
    return " ".join(str(value).split()).casefold()


#: What the CLI and the web UI show in place of a ticket's empty SOLUTION.
NO_SOLUTION = "(no solution recorded)"
#: What they show for a result that copies a higher one (`Recommendation.same_text_as`), before naming it.
SAME_TEXT = "same subject, description and solution as"


@dataclass
class Ticket:
    """A historical ticket: SUBJECT, DESCRIPTION and the SOLUTION that resolved it."""

    id: str
    subject: str
    description: str
    solution: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: what the API answers for a ticket, alone or in a result."""
        return {"id": self.id, "subject": self.subject, "description": self.description, "solution": self.solution,
                "metadata": dict(self.metadata)}

    def text_key(self) -> tuple[str, str, str]:
        """Its subject, description and solution with white space folded and case ignored: two tickets with one
        key read the same to an engineer (copies of one record under two ids)."""
        return fold(self.subject or ""), fold(self.description or ""), fold(self.solution or "")


@dataclass
class Query:
    """A new ticket as a support engineer types it (no solution yet)."""

    subject: str
    description: str
    id: str | None = None

    def __post_init__(self) -> None:
        """InputError for a subject or description that is not Unicode text (`check_text`)."""
        for name in ("subject", "description"):
            value = getattr(self, name)
            if isinstance(value, str):
                check_text(value, f"the {name}")


def component_text(item: Query | Ticket, component: str, solution: bool = True) -> str:
    """The text of `component` ("SUB", "SUB+DESC", "DESC+SOL", ...) of a query or ticket: its non-empty fields
    joined by a newline (a query has no SOL; `solution=False` leaves a ticket's out, as when the ticket asks as a
    query)."""
    values = {"SUB": item.subject, "DESC": item.description,
              "SOL": (getattr(item, "solution", "") or "") if solution else ""}
    return "\n".join(v for v in (values[p] for p in component.split("+")) if v)


def query_text(item: Query | Ticket) -> str:
    """The text a query (or a ticket asking as one) is searched and encoded with: its subject and description,
    never a solution."""
    return component_text(item, "SUB+DESC")


def ticket_text(ticket: Ticket) -> str:
    """A stored ticket's whole text: its non-empty subject, description and solution joined (MiniLM's document,
    and the words a result is said to share with its query)."""
    return component_text(ticket, "SUB+DESC+SOL")


@dataclass
class LabeledPair:
    """A graded judgement of how well ticket `ticket_id` answers query `query_id` (1–5)."""

    query_id: str
    ticket_id: str
    score: float


@dataclass
class Recommendation:
    """One ranked answer to a query, with why it was chosen."""

    ticket: Ticket
    rank: int
    raw_score: float
    score: float  # calibrated, 1–5
    shared_terms: list[str] = field(default_factory=list)
    topics: list[dict[str, Any]] = field(default_factory=list)  # [{"id": int, "weight": float, "words": [...]}]
    bm25: float | None = None
    #: Why it was chosen: channel ("bm25" words in common, "S" meaning, "T" topics, "h" LSTM, "E" word embeddings,
    #: "C" spelling, "V" intent)
    #: → its share of what sets this ticket apart from the query's typical candidate (shares sum to 1, or are
    #: all 0); channels the served model gives weight 0 are absent (`serving.scoring.channel_shares`).
    channel_shares: dict[str, float] = field(default_factory=dict)
    #: The id of a higher result of the same answer whose subject, description and solution read the same
    #: (`Ticket.text_key`): a copy of that ticket, shown as one (None for the first of its text).
    same_text_as: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form used by the CLI and the API."""
        return {
            "rank": self.rank,
            "score": round(float(self.score), 3),
            "raw_score": float(self.raw_score),
            "bm25": None if self.bm25 is None else float(self.bm25),
            "shared_terms": list(self.shared_terms),
            "topics": list(self.topics),
            "channel_shares": {c: round(float(v), 4) for c, v in self.channel_shares.items()},
            "same_text_as": self.same_text_as,
            "ticket": self.ticket.to_dict(),
        }
