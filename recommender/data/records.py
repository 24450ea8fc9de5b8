"""Plain records that flow through ticketrec: tickets, queries, labelled pairs, recommendations."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The paper's 1–5 relatedness scale.
YES, REL, NO = 5.0, 3.0, 1.0
LABEL_SCORES = {"YES": YES, "REL": REL, "NO": NO}


@dataclass
class Ticket:
    """A historical ticket: SUBJECT, DESCRIPTION and the SOLUTION that resolved it."""

    id: str
    subject: str
    description: str
    solution: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Query:
    """A new ticket as a support engineer types it (no solution yet)."""

    subject: str
    description: str
    id: str | None = None


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
    #: Why it was chosen: channel ("bm25" words in common, "S" meaning, "T" topics, "h" LSTM, "E" word embeddings)
    #: → its share of what sets this ticket apart from the query's typical candidate (shares sum to 1, or are
    #: all 0); channels the served model gives weight 0 are absent (`serving.scoring.channel_shares`).
    channel_shares: dict[str, float] = field(default_factory=dict)

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
            "ticket": {
                "id": self.ticket.id,
                "subject": self.ticket.subject,
                "description": self.ticket.description,
                "solution": self.ticket.solution,
            },
        }
