"""The Celery beat schedule: the nightly incremental reindex at TICKETREC_REINDEX_AT (HH:MM, beat's local time)."""
from __future__ import annotations

import re

from celery.schedules import crontab

from recommender.config import Settings
from recommender.errors import TicketrecError

_HHMM = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")


def parse_reindex_at(value: str) -> tuple[int, int]:
    """(hour, minute) of an HH:MM string; TicketrecError naming the variable when malformed."""
    match = _HHMM.match((value or "").strip())
    if not match:
        raise TicketrecError(f"TICKETREC_REINDEX_AT must be HH:MM (24-hour), not {value!r}")
    return int(match.group(1)), int(match.group(2))


def beat_schedule(settings: Settings) -> dict:
    """Celery's `beat_schedule` setting: one entry, the nightly reindex."""
    hour, minute = parse_reindex_at(settings.reindex_at)
    return {
        "nightly-reindex": {
            "task": "ticketrec.reindex",
            "schedule": crontab(hour=hour, minute=minute),
            "options": {"expires": 6 * 3600},
        }
    }
