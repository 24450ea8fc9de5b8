"""The one settings object, read from TICKETREC_* environment variables with documented defaults."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

from .errors import TicketrecError

#: Every environment variable the settings read, with its default and meaning (the README's table).
ENV_VARS = {
    "TICKETREC_HOME": ("~/.ticketrec", "where the database, models and indexes live"),
    "TICKETREC_DB": ("$TICKETREC_HOME/ticketrec.sqlite3", "the SQLite database (tickets, queries, pairs, feedback, FTS5)"),
    "TICKETREC_MODEL": ("$TICKETREC_HOME/models/current", "the model directory the engine serves"),
    "TICKETREC_PREFILTER": ("index", "BM25 pre-filter backend: index (the postings in each index version), fts5 (SQLite) or elasticsearch"),
    "TICKETREC_ES_URL": ("", "Elasticsearch URL; empty means not used"),
    "TICKETREC_ES_INDEX": ("ticketrec-tickets", "Elasticsearch index name"),
    "TICKETREC_BROKER_URL": ("", "Redis URL of the Celery broker and result backend; empty means in-process scoring"),
    "TICKETREC_CANDIDATES": ("1000", "K, the BM25 candidates the model scores per query; 0 scores the whole knowledge base"),
    "TICKETREC_SHARDS": ("2", "index shards fanned out over Celery workers"),
    "TICKETREC_QUERY_DEADLINE": ("2.0", "seconds a distributed query may take before falling back to in-process scoring"),
    "TICKETREC_KEEP_INDEXES": ("3", "index versions kept on disk"),
    "TICKETREC_INDEX_WORKERS": ("0", "processes that encode tickets during an index build; 0 = one per CPU core (at most 4)"),
    "TICKETREC_REINDEX_AT": ("02:30", "time of the nightly reindex (HH:MM, local time of the beat process)"),
    "TICKETREC_MAX_DESCRIPTION": ("20000", "longest accepted query description in characters"),
    "TICKETREC_SECRET_KEY": ("", "Flask secret key (CSRF); a random one per process when empty"),
}


def _number(env, name: str, default: str, kind=int):
    raw = env.get(name) or default
    try:
        return kind(raw)
    except ValueError:
        raise TicketrecError(f"{name} must be a {kind.__name__}, not {raw!r}; fix or unset it") from None


@dataclass(frozen=True)
class Settings:
    """Runtime configuration. Build it with `Settings.from_env()`; tests pass fields directly."""

    home: Path
    db: Path
    model: Path
    prefilter: str = "index"
    es_url: str = ""
    es_index: str = "ticketrec-tickets"
    broker_url: str = ""
    candidates: int = 1000
    shards: int = 2
    query_deadline: float = 2.0
    keep_indexes: int = 3
    index_workers: int = 0
    reindex_at: str = "02:30"
    max_description: int = 20000
    secret_key: str = ""

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @property
    def indexes_dir(self) -> Path:
        return self.home / "indexes"

    @property
    def encoding_processes(self) -> int:
        """How many processes an index build encodes in: `index_workers`, or one per usable core (at most 4)."""
        if self.index_workers > 0:
            return self.index_workers
        return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "Settings":
        """Read the settings from `env` (default: os.environ)."""
        env = os.environ if env is None else env
        home = Path(env.get("TICKETREC_HOME") or "~/.ticketrec").expanduser()
        return cls(
            home=home,
            db=Path(env.get("TICKETREC_DB") or home / "ticketrec.sqlite3").expanduser(),
            model=Path(env.get("TICKETREC_MODEL") or home / "models" / "current").expanduser(),
            prefilter=(env.get("TICKETREC_PREFILTER") or "index").lower(),
            es_url=env.get("TICKETREC_ES_URL", ""),
            es_index=env.get("TICKETREC_ES_INDEX") or "ticketrec-tickets",
            broker_url=env.get("TICKETREC_BROKER_URL", ""),
            candidates=_number(env, "TICKETREC_CANDIDATES", "1000"),
            shards=_number(env, "TICKETREC_SHARDS", "2"),
            query_deadline=_number(env, "TICKETREC_QUERY_DEADLINE", "2.0", float),
            keep_indexes=_number(env, "TICKETREC_KEEP_INDEXES", "3"),
            index_workers=_number(env, "TICKETREC_INDEX_WORKERS", "0"),
            reindex_at=env.get("TICKETREC_REINDEX_AT") or "02:30",
            max_description=_number(env, "TICKETREC_MAX_DESCRIPTION", "20000"),
            secret_key=env.get("TICKETREC_SECRET_KEY", ""),
        )

    def replace(self, **changes) -> "Settings":
        """A copy with some fields changed."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return Settings(**values)
