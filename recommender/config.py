"""The one settings object, read from TICKETREC_* environment variables; one table (`SETTINGS`) holds each
variable's field, default and meaning. `python -m recommender.config` prints the README's table."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping

from .errors import TicketrecError


@dataclass(frozen=True)
class Setting:
    """One row of the settings table: environment variable, `Settings` field, default (as the variable would hold
    it; `$TICKETREC_HOME` stands for the home directory) and meaning."""

    env: str
    field: str
    default: str
    doc: str
    kind: Callable[[str], Any] = str

    def parse(self, raw: str, home: Path | None = None) -> Any:
        """The field's value of the variable's text `raw`; TicketrecError naming the variable when malformed."""
        if self.kind is Path:
            if home is not None:
                raw = raw.replace("$TICKETREC_HOME", str(home))
            return Path(raw).expanduser()
        try:
            return self.kind(raw)
        except ValueError:
            kind = {int: "whole number", float: "number"}.get(self.kind, "value")
            raise TicketrecError(f"{self.env} must be a {kind}, not {raw!r}; fix or unset it") from None


def _lower(raw: str) -> str:
    return raw.lower()


def _column_names(raw: str) -> tuple[str, ...]:
    """A comma-separated list of imported column names, lower-cased as the import stores them; "none" is none."""
    names = tuple(dict.fromkeys(n.strip().lower() for n in raw.split(",") if n.strip()))
    return () if names == ("none",) else names


#: Who may read (search, tickets, status) in the web app and API: `auto` = only signed-in users or API tokens once
#: any account exists (open while there is none), `required` = always, `open` = anyone. Writes always need a user
#: once one exists.
AUTH_READ_MODES = ("auto", "required", "open")


def _auth_read(raw: str) -> str:
    value = raw.strip().lower()
    if value not in AUTH_READ_MODES:
        raise TicketrecError(f"TICKETREC_AUTH_READ must be {', '.join(AUTH_READ_MODES[:-1])} or {AUTH_READ_MODES[-1]}, "
                             f"not {raw!r}; fix or unset it")
    return value


#: How the S channel's sentence encoder runs for new models (recommender/model/pretrained.py: BACKENDS).
ENCODER_BACKENDS = ("onnx-int8", "onnx", "torch", "static")


def _encoder_backend(raw: str) -> str:
    value = raw.strip().lower()
    if value not in ENCODER_BACKENDS:
        raise TicketrecError(f"TICKETREC_ENCODER_BACKEND must be {', '.join(ENCODER_BACKENDS[:-1])} or "
                             f"{ENCODER_BACKENDS[-1]}, not {raw!r}; fix or unset it")
    return value


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
#: `index_pin` for "all": lock the whole index version.
PIN_ALL = 1 << 62


def _size(raw: str) -> int:
    """Bytes of a size written as 0, 512M, 4G (binary units, an optional trailing B) or all (`PIN_ALL`)."""
    text = raw.strip().upper().removesuffix("B")
    if text == "ALL":
        return PIN_ALL
    number, unit = (text[:-1], text[-1]) if text[-1:] in _SIZE_UNITS and text[-1:] else (text, "")
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if not 0 <= value < float(PIN_ALL):  # also NaN and infinity
        raise TicketrecError(f"TICKETREC_INDEX_PIN must be a size such as 0, 800M, 4G or all, not {raw!r}; fix or unset it")
    return int(value * _SIZE_UNITS[unit])


#: How index versions store the vectors (TICKETREC_INDEX_DTYPE): auto = float16 from FLOAT16_FROM tickets up.
INDEX_DTYPES = ("auto", "float16", "float32")
FLOAT16_FROM = 100_000


def _index_dtype(raw: str) -> str:
    value = raw.strip().lower()
    if value not in INDEX_DTYPES:
        raise TicketrecError(f"TICKETREC_INDEX_DTYPE must be auto, float16 or float32, not {raw!r}; fix or unset it")
    return value


#: Every setting, in one table: `Settings` (its field defaults), `Settings.from_env`, the README's configuration
#: table (`markdown_table`, checked by tests/test_config.py) and `ENV_VARS` all derive from it.
SETTINGS: tuple[Setting, ...] = (
    Setting("TICKETREC_HOME", "home", "~/.ticketrec", "where the database, models and indexes live", Path),
    Setting("TICKETREC_DB", "db", "$TICKETREC_HOME/ticketrec.sqlite3",
            "the SQLite database (tickets, queries, pairs, feedback, FTS5)", Path),
    Setting("TICKETREC_MODEL", "model", "$TICKETREC_HOME/models/current", "the model directory the engine serves", Path),
    Setting("TICKETREC_PREFILTER", "prefilter", "index",
            "candidate pre-filter: index (BM25 on the postings in each index version), topics (nearest DocNADE topic "
            "vectors, BM25 from the same postings), fts5 (SQLite BM25) or elasticsearch",
            _lower),
    Setting("TICKETREC_ES_URL", "es_url", "", "Elasticsearch URL; empty means not used"),
    Setting("TICKETREC_ES_INDEX", "es_index", "ticketrec-tickets", "Elasticsearch index name"),
    Setting("TICKETREC_BROKER_URL", "broker_url", "",
            "Redis URL of the Celery broker and result backend; empty means in-process scoring"),
    Setting("TICKETREC_CANDIDATES", "candidates", "1000",
            "K, the BM25 candidates the model scores per query; 0 scores the whole knowledge base", int),
    Setting("TICKETREC_SHARDS", "shards", "2",
            "Celery tasks a query that scores every ticket (K = 0) is split into; up to 10,000 candidates go to one "
            "task, more to one task per 10,000 (at most this many)", int),
    Setting("TICKETREC_QUERY_DEADLINE", "query_deadline", "2.0",
            "seconds a distributed query may take before falling back to in-process scoring", float),
    Setting("TICKETREC_BROKER_RETRY_AFTER", "broker_retry_after", "30.0",
            "seconds the engine scores in-process after the workers failed, before trying them again", float),
    Setting("TICKETREC_KEEP_INDEXES", "keep_indexes", "3", "index versions kept on disk", int),
    Setting("TICKETREC_INDEX_WORKERS", "index_workers", "0",
            "processes that encode tickets during an index build; 0 = one per CPU core (at most 4)", int),
    Setting("TICKETREC_INDEX_DTYPE", "index_dtype", "auto",
            "how index versions store the vectors: float16 (half the memory and bytes read per query; rankings as "
            "float32's, see docs/scaling.md), float32 (exactly the model's numbers), or auto = float16 from 100,000 "
            "tickets up", _index_dtype),
    Setting("TICKETREC_INDEX_PIN", "index_pin", "0",
            "memory each serving process may lock (mlock) for the index version it serves, vectors first: a size "
            "such as 4G, all, or 0 = lock nothing (pages are still loaded at open when the index fits in the "
            "available memory; locking keeps them there under memory pressure)", _size),
    Setting("TICKETREC_REINDEX_AT", "reindex_at", "02:30",
            "time of the nightly reindex (HH:MM, local time of the beat process)"),
    Setting("TICKETREC_MAX_DESCRIPTION", "max_description", "20000",
            "longest accepted query description in characters", int),
    Setting("TICKETREC_MAX_FIELD_CHARS", "max_field_chars", "20000",
            "longest imported ticket description or solution in characters; longer ones are cut (one warning per import)",
            int),
    Setting("TICKETREC_MAX_SUBJECT_CHARS", "max_subject_chars", "1000",
            "longest imported subject in characters; longer ones are cut (one warning per import)", int),
    Setting("TICKETREC_SECRET_KEY", "secret_key", "",
            "Flask secret key (sessions, CSRF); when empty, one generated once into `$TICKETREC_HOME/secret_key` (mode 0600)"),
    Setting("TICKETREC_CARD_FIELDS", "card_fields", "status,state,resolution,category,created,opened,resolved,closed",
            "the ticket metadata (imported columns, lower-cased) each result card shows under its heading when the "
            "ticket has them, in this order, at most four; none shows none", _column_names),
    Setting("TICKETREC_FILTER_FIELDS", "filter_fields", "auto",
            "the ticket metadata the search page offers as filter menus: auto (each imported column with 2 to 30 "
            "distinct values, at most six), a list of columns, or none; the API and `ticketrec recommend --where` "
            "filter on any column", _column_names),
    Setting("TICKETREC_AUTH_READ", "auth_read", "auto",
            "who may search and read tickets and status: auto (signed-in users once any account exists), required "
            "or open; feedback always needs a user once one exists", _auth_read),
    Setting("TICKETREC_ENCODER", "encoder", "",
            "the S channel's sentence encoder for new models: a local sentence-transformers model directory; empty "
            "means the packaged all-MiniLM-L6-v2 (`ticketrec train --encoder DIR` overrides it)"),
    Setting("TICKETREC_ENCODER_BACKEND", "encoder_backend", "onnx-int8",
            "how new models run the S encoder: onnx-int8 (ONNX Runtime, int8 weights), onnx (float32), torch "
            "(sentence-transformers) or static (word-piece vectors distilled from it, model2vec, and fitted to the "
            "knowledge base at training: fastest, least accurate); exports are cached in "
            "`$TICKETREC_HOME/cache/encoders`", _encoder_backend),
)

_BY_FIELD = {s.field: s for s in SETTINGS}

#: Every environment variable the settings read: name → (default, meaning).
ENV_VARS = {s.env: (s.default, s.doc) for s in SETTINGS}


def default(field: str) -> Any:
    """The default value of a `Settings` field (e.g. `default("candidates")` → 1000), parsed from the table."""
    setting = _BY_FIELD[field]
    return setting.parse(setting.default, Path(_BY_FIELD["home"].default).expanduser())


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity where the platform tells it, else the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def markdown_table() -> str:
    """The README's configuration table: variable, default, meaning."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    rows += [f"| `{s.env}` | `{s.default}` | {s.doc} |" for s in SETTINGS]
    return "\n".join(rows)


@dataclass(frozen=True)
class Settings:
    """Runtime configuration. Build it with `Settings.from_env()`; tests pass fields directly. Each field is a
    row of `SETTINGS` (its variable, default and meaning)."""

    home: Path
    db: Path
    model: Path
    prefilter: str = default("prefilter")
    es_url: str = default("es_url")
    es_index: str = default("es_index")
    broker_url: str = default("broker_url")
    candidates: int = default("candidates")
    shards: int = default("shards")
    query_deadline: float = default("query_deadline")
    keep_indexes: int = default("keep_indexes")
    index_workers: int = default("index_workers")
    index_pin: int = default("index_pin")
    index_dtype: str = default("index_dtype")
    reindex_at: str = default("reindex_at")
    max_description: int = default("max_description")
    max_field_chars: int = default("max_field_chars")
    max_subject_chars: int = default("max_subject_chars")
    secret_key: str = default("secret_key")
    broker_retry_after: float = default("broker_retry_after")
    auth_read: str = default("auth_read")
    card_fields: tuple[str, ...] = default("card_fields")
    filter_fields: tuple[str, ...] = default("filter_fields")
    encoder: str = default("encoder")
    encoder_backend: str = default("encoder_backend")

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
        return min(4, usable_cpus())

    def vector_dtype(self, n_tickets: int) -> str:
        """How an index version of `n_tickets` tickets stores its vectors: `index_dtype`, with auto resolved."""
        if self.index_dtype != "auto":
            return self.index_dtype
        return "float16" if n_tickets >= FLOAT16_FROM else "float32"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        """Read the settings from `env` (default: os.environ); an unset or empty variable takes its default."""
        env = os.environ if env is None else env
        home = _BY_FIELD["home"].parse(env.get("TICKETREC_HOME") or _BY_FIELD["home"].default)
        return cls(**{s.field: s.parse(env.get(s.env) or s.default, home) for s in SETTINGS})

    def replace(self, **changes) -> "Settings":
        """A copy with some fields changed."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return Settings(**values)


if __name__ == "__main__":
    print(markdown_table())
