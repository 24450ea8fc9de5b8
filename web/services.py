"""What the web app needs from the core library, in one object per app: the store, the engine, versions, status.

The engine is heavy (it maps the index and loads the model that index version carries), so it is built once: at
start under gunicorn (`warm_up`, called by web/gunicorn_conf.py before a worker accepts requests), else on the first
request that needs it; a missing model or index is reported as a `TicketrecError` the pages turn into a clear
message. The engine is safe to call from every request thread at once: no lock is taken here around a query, and
each answer names the index and model versions that made it.
"""
from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from recommender.config import Settings
from recommender.errors import TicketrecError
from recommender.data.filters import TicketFilter
from recommender.data.records import Query, Recommendation
from recommender.data.store import Store, query_key
from recommender.serving.engine import mark_copies

#: How many recent queries the search page offers to reuse.
RECENT_QUERIES = 8
#: How many owners' (users', anonymous browser sessions') recent queries are kept; the least recently active go.
RECENT_OWNERS = 1000
#: How many filter menus the search page offers at most when TICKETREC_FILTER_FIELDS is auto.
MAX_FILTER_MENUS = 6


@dataclass(frozen=True)
class RecentQuery:
    """A query of "Recent queries", with the filter menus' choices it was asked with (field → value)."""

    query: Query
    chosen: dict[str, str]


@dataclass
class RecommendResult:
    """The answer to one query as the pages and the API show it."""

    query: Query
    key: str
    results: list[Recommendation]
    took_ms: float
    model_version: str
    index_version: str
    #: How the engine answered (`recommender.serving.engine.AnswerInfo`: pre-filter, scoring mode, timings).
    info: Any = None


class TicketrecServices:
    """The core library as one web app sees it; stored in `app.extensions["ticketrec"]`."""

    def __init__(self, settings: Settings, engine: Any = None, engine_factory: Callable[[Settings], Any] | None = None,
                 report_roots: Sequence[Path] | None = None):
        self.settings = settings
        #: Where evaluation reports are looked for: this home's reports/, then the repository's docs/results.
        self.report_roots = list(report_roots) if report_roots is not None else [
            settings.home / "reports", Path(__file__).resolve().parents[1] / "docs" / "results"]
        self._engine = engine
        self._engine_factory = engine_factory
        self._engine_lock = threading.Lock()  # the engine is built once; queries then run without a lock
        self._local = threading.local()
        self._recent: OrderedDict[str, OrderedDict[str, Query]] = OrderedDict()  # owner → query key → query
        self._recent_lock = threading.Lock()

    # -- store: one connection per thread (SQLite transactions must not interleave) ------------------
    def store(self) -> Store:
        """This thread's store."""
        store = getattr(self._local, "store", None)
        if store is None:
            store = Store(self.settings.db)
            self._local.store = store
        return store

    def close_store(self) -> None:
        """Close this thread's store (at the end of each request; the next one reopens it, ~1 ms)."""
        store = getattr(self._local, "store", None)
        if store is not None:
            store.close()
            self._local.store = None

    # -- engine ----------------------------------------------------------------------------------------
    def engine(self) -> Any:
        """The recommender engine (built once; it loads its model and index lazily)."""
        if self._engine is not None:
            return self._engine
        with self._engine_lock:
            if self._engine is None:
                factory = self._engine_factory or _default_engine_factory
                self._engine = factory(self.settings)
        return self._engine

    def engine_or_error(self) -> tuple[Any, str | None]:
        """(engine, None) when it can answer queries (model and matching index load), else (None, why)."""
        try:
            engine = self.engine()
            engine.index  # loads the model and the index and checks that they belong together
        except TicketrecError as exc:
            return None, str(exc)
        return engine, None

    def warm_up(self) -> str | None:
        """Load now what the first query would load: the engine, its index version and model, the query encoders and
        the BM25 pre-filter (one throw-away query is encoded and pre-filtered; nothing is scored or stored). None when
        it can serve, else why not (the app still starts; its pages and /api/v1/healthz say why)."""
        engine, error = self.engine_or_error()
        if engine is None:
            return error
        query = Query("Warm-up query", "Load the query encoders and the pre-filter at start.")
        try:
            index = engine.index
            engine.model_for(index).encode_queries([query])
            engine.searcher.search_rows(f"{query.subject}\n{query.description}", 10, index)
        except TicketrecError as exc:
            return str(exc)
        if self.settings.broker_url:  # the Celery client (no connection): celery's first import is not thread-safe,
            try:  # and first queries importing it at once failed ("cannot import name 'group' from 'celery'")
                from recommender.serving.distributed import celery_client
            except ImportError:  # no distributed client installed: queries are scored in-process anyway
                return None
            celery_client(self.settings.broker_url)
        return None

    def versions(self) -> tuple[str, str]:
        """(model version, index version) being served (of one index version: the model it carries), or empty
        strings when none can be loaded."""
        engine, _ = self.engine_or_error()
        if engine is None:
            return "", ""
        index = engine.index
        return str(index.model_version), str(index.version)

    def recommend(self, subject: str, description: str, k: int = 10, exclude: str | None = None,
                  where: TicketFilter | None = None) -> RecommendResult:
        """Rank the knowledge base for one query (optionally leaving out one ticket: its own neighbours; with
        `where`, only the tickets whose metadata passes it)."""
        engine = self.engine()
        query = Query(subject, description)
        started = time.perf_counter()
        answer = engine.recommend(query, k=k + 1 if exclude else k, where=where)
        took_ms = (time.perf_counter() - started) * 1000.0
        results = list(answer.items)
        if exclude is not None:
            left_out = [r.ticket for r in results if r.ticket.id == exclude]
            results = [r for r in results if r.ticket.id != exclude][:k]
            for rank, rec in enumerate(results, start=1):
                rec.rank = rank
            mark_copies(results, before=left_out)  # a copy of the left-out ticket copies it, not a result
        info = answer.info
        return RecommendResult(query, query_key(subject, description), results, took_ms, str(info.model_version),
                               str(info.index_version), info)

    def filter_choices(self) -> dict[str, list[tuple[str, int]]]:
        """The filter menus of the search page: field → [(value, tickets)] for the fields TICKETREC_FILTER_FIELDS
        names that the served tickets hold (`auto`: those with 2 to `filters.MAX_CHOICES` values, at most
        `MAX_FILTER_MENUS`); empty when nothing can be served."""
        names = self.settings.filter_fields
        if not names:
            return {}
        engine, _ = self.engine_or_error()
        if engine is None:
            return {}
        try:
            table = engine.metadata_table(engine.index)
        except TicketrecError:
            return {}
        choices = table.choices()
        if names == ("auto",):
            return dict(list(choices.items())[:MAX_FILTER_MENUS])
        return {name: choices[name] for name in names if name in choices}

    def topic_words(self, k: int = 10) -> list[list[str]]:
        """Top `k` words of every DocNADE topic of the served model (the model of the served index version)."""
        return self.engine().model.topic_words(k)

    def topics_weigh(self) -> bool:
        """Whether the served metric gives the topic channel T a weight above 0 (else topics move no ranking)."""
        return self.engine().model.metric_spec().get("channels", {}).get("T", 0) > 0

    # -- recent queries (this process; each owner's own, offered for reuse on the search page) ------------
    def remember(self, query: Query, owner: str | None, chosen: dict[str, str] | None = None) -> str:
        """Add `query` to `owner`'s recent queries (`auth.recent_owner()`; None: not remembered), with the filter
        menus' choices it was asked with (`chosen`: field → value), which reusing it chooses again."""
        key = query_key(query.subject, query.description)
        if owner is None:
            return key
        with self._recent_lock:
            recent = self._recent.pop(owner, None) or OrderedDict()
            self._recent[owner] = recent  # the most recently active owner last
            recent.pop(key, None)
            recent[key] = RecentQuery(Query(query.subject, query.description), dict(chosen or {}))
            while len(recent) > RECENT_QUERIES:
                recent.popitem(last=False)
            while len(self._recent) > RECENT_OWNERS:
                self._recent.popitem(last=False)
        return key

    def recent(self, owner: str | None) -> list[tuple[str, RecentQuery]]:
        """`owner`'s recent queries, newest first, as (query_key, query and its filter choices)."""
        with self._recent_lock:
            return list(reversed(self._recent.get(owner, {}).items()))

    def recent_query(self, key: str, owner: str | None) -> RecentQuery | None:
        """One of `owner`'s recent queries, or None."""
        with self._recent_lock:
            return self._recent.get(owner, {}).get(key)

    # -- feedback ------------------------------------------------------------------------------------
    def feedback_given(self, subject: str, description: str) -> dict[str, str]:
        """ticket id → the latest label already given for this query."""
        return {fb.ticket_id: fb.label for fb in self.store().feedback(query_key(subject, description))}

    # -- status --------------------------------------------------------------------------------------
    def index_info(self) -> dict[str, Any] | None:
        """Version, size and build time of the served index, or None when none can be loaded; with a "warning" when
        the served version is not the one it should be (CURRENT failed verification and an older good version
        serves, or the served version's files changed on disk)."""
        engine, _ = self.engine_or_error()
        if engine is None:
            return None
        index = engine.index
        manifest = dict(getattr(index, "manifest", {}) or {})
        info = {
            "version": str(index.version),
            "size": len(index),
            "created": manifest.get("created_at"),
            "model_version": manifest.get("model_version"),
        }
        from recommender.serving.index import serving_warning

        warning = serving_warning(self.settings, index) if hasattr(index, "changed_files") else None
        return {**info, "warning": warning} if warning else info

    def pending_changes(self) -> dict[str, Any] | None:
        """What the next reindex would change in the served index (`serving.reindex.pending_changes`: the store's
        tickets new or changed since its build, another model in TICKETREC_MODEL), or None when none is served.
        It reads every ticket's update time (0.3 s at 100,000 tickets): for the status page, not the health check."""
        engine, _ = self.engine_or_error()
        index = getattr(engine, "index", None) if engine is not None else None
        if index is None or not hasattr(index, "row_of"):
            return None
        from recommender.serving.reindex import pending_changes

        return pending_changes(self.settings, self.store(), index)

    def indexed(self, ticket_id: str) -> bool | None:
        """Whether the served index holds the ticket `ticket_id` as the store has it now (after an import or a PUT
        that changed it, not until the next reindex); None when no index is served."""
        engine, _ = self.engine_or_error()
        index = getattr(engine, "index", None) if engine is not None else None
        if index is None or not hasattr(index, "row_of"):
            return None
        updated = self.store().ticket_updated_at(ticket_id)
        if updated is None:
            return False
        from recommender.serving.index_build import unchanged_rows

        return bool(unchanged_rows(index, [ticket_id], [updated])[0] >= 0)

    # -- reindex ------------------------------------------------------------------------------------------
    def reindex(self) -> tuple[bool, dict[str, Any]]:
        """Bring the store's new and changed tickets into the served index (an incremental reindex, as `ticketrec
        reindex`): in this process when no broker is set, (True, the serving version's description with "built",
        false when nothing had changed); else queued for a Celery worker, (False, {"task_id"}). Raises
        IndexBusyError while another build runs, and ModelError, IndexStateError or ServiceUnavailable when it can
        neither build nor queue."""
        if not self.settings.broker_url:
            from recommender.serving.index import current_version
            from recommender.serving.reindex import reindex

            before = current_version(self.settings)
            result = _public_reindex(reindex(self.settings, self.store()))
            return True, {**result, "built": result["version"] != before}
        from recommender.serving.distributed import REINDEX, send_task

        return False, {"task_id": send_task(self.settings, REINDEX, kwargs={"full": False}).id}

    def reindex_task(self, task_id: str) -> dict[str, Any] | None:
        """A queued reindex as the broker's result backend has it: {"task_id", "state"} with "result" (the new
        version's description) once done or "error" once failed; None when no broker is set (nothing is queued).
        States: pending (queued, or an id the backend does not hold: results are kept an hour), running, done,
        failed. Raises ServiceUnavailable when the backend cannot be read."""
        if not self.settings.broker_url:
            return None
        from recommender.errors import ServiceUnavailable
        from recommender.serving.distributed import celery_client

        try:
            found = celery_client(self.settings.broker_url).AsyncResult(task_id)
            state, value = found.state, found.result
        except Exception as exc:
            raise ServiceUnavailable(f"cannot read the reindex task's state from the broker: {exc}") from exc
        body: dict[str, Any] = {"task_id": task_id, "state": _TASK_STATES.get(state, "pending")}
        if body["state"] == "done":
            body["result"] = _public_reindex(value if isinstance(value, dict) else {})
        elif body["state"] == "failed":
            body["error"] = f"{type(value).__name__}: {value}" if isinstance(value, BaseException) else str(value)
        return body

    def model_info(self) -> dict[str, Any] | None:
        """Version and training-data fingerprint of the served model, when it was trained, on how many tickets, and
        how many of the store's tickets were added or changed since (None where unknown); None when no model can be
        loaded."""
        engine, _ = self.engine_or_error()
        if engine is None:
            return None
        from recommender.serving.reindex import model_age

        model = engine.model
        config = dict(model.config or {})
        age = model_age(config, self.store())
        return {
            "version": str(model.version),
            "data_fingerprint": config.get("data_fingerprint"),
            "created": age["trained_at"],
            "trained_on": age["tickets"],
            "changed_since": age["changed_since"],
        }

    def broker_state(self) -> dict[str, Any]:
        """Where scoring runs: in-process, or the Celery workers that answered a ping. While the engine's circuit
        breaker is open (the broker failed a moment ago) nothing is pinged: not ok, with the breaker's reason."""
        if not self.settings.broker_url:
            return {"mode": "in-process", "ok": True, "workers": []}
        breaker = getattr(self._engine, "breaker", None)  # the engine's, once built (health does not build it)
        circuit = breaker.snapshot() if breaker is not None else None
        if circuit is not None and circuit["state"] == "open":
            return {"mode": "celery", "ok": False, "workers": [], "detail": circuit["reason"], "breaker": circuit}
        state = self._ping_workers()
        return {**state, "breaker": circuit} if circuit is not None else state

    def _ping_workers(self) -> dict[str, Any]:
        """The broker state from a ping of the Celery workers."""
        try:
            from recommender.serving import distributed
        except ImportError:  # the thin client is not there: nothing can fan out
            return {"mode": "in-process", "ok": True, "workers": [], "detail": "no distributed client installed"}
        ping = getattr(distributed, "ping_workers", None)
        try:
            if ping is not None:
                seen = ping(self.settings) if _takes_argument(ping) else ping()
            elif hasattr(distributed, "celery_client"):
                seen = distributed.celery_client(self.settings.broker_url).control.inspect(timeout=1.0).ping()
            else:
                return {"mode": "celery", "ok": None, "workers": [], "detail": "the distributed client cannot ping workers"}
        except Exception as exc:  # a dead broker is a state to show, not a crash
            return {"mode": "celery", "ok": False, "workers": [], "detail": f"broker unreachable: {exc}"}
        workers = sorted(seen) if isinstance(seen, (dict, list, set, tuple)) else []
        detail = None if workers else "the broker answered but no worker replied to a ping; start `ticketrec worker`"
        return {"mode": "celery", "ok": bool(workers), "workers": workers, **({"detail": detail} if detail else {})}

    def report_dirs(self) -> list[Path]:
        """Folders that may hold evaluation reports, newest report first."""
        candidates = [p for root in self.report_roots for pattern in ("report.md", "*/report.md")
                      for p in Path(root).glob(pattern)]
        candidates.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        return [p.parent for p in candidates]

    def latest_report(self) -> dict[str, Any] | None:
        """The newest evaluation report: its folder, text and plot file names; "own" when it lies in this home's
        reports/ (else it is one of the repository's, docs/results, of another knowledge base), and the version of
        the model it evaluated when its results.json names one."""
        dirs = self.report_dirs()
        if not dirs:
            return None
        folder = dirs[0]
        report = folder / "report.md"
        try:
            evaluated = json.loads((folder / "results.json").read_text(encoding="utf-8")).get("model") or {}
        except (OSError, ValueError, AttributeError):
            evaluated = {}
        return {
            "folder": folder,
            "name": folder.name,
            "text": report.read_text(encoding="utf-8", errors="replace"),
            "modified": report.stat().st_mtime,
            "plots": sorted(p.name for p in folder.glob("*.png")),
            "own": folder.resolve().is_relative_to((self.settings.home / "reports").resolve()),
            "model_version": evaluated.get("version") if isinstance(evaluated, dict) else None,
        }


def _takes_argument(func: Callable) -> bool:
    import inspect

    try:
        params = [p for p in inspect.signature(func).parameters.values() if p.default is inspect.Parameter.empty
                  and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return False
    return len(params) >= 1


def _default_engine_factory(settings: Settings) -> Any:
    """Build the engine the way the CLI does; a missing engine module is reported, not raised as ImportError."""
    try:
        from recommender.serving.engine import Recommender
    except ImportError as exc:
        raise TicketrecError(f"the recommender engine is not installed ({exc}); reinstall ticketrec") from exc
    return Recommender(settings)


#: Celery's task states as the API names them.
_TASK_STATES = {"PENDING": "pending", "RETRY": "pending", "RECEIVED": "running", "STARTED": "running",
                "SUCCESS": "done", "FAILURE": "failed", "REVOKED": "failed"}
#: What the API tells of a reindex: its description without the server's paths.
_REINDEX_FIELDS = ("version", "n_tickets", "encoded", "reused", "dtype", "model_version", "seconds")


def _public_reindex(result: dict[str, Any]) -> dict[str, Any]:
    return {name: result.get(name) for name in _REINDEX_FIELDS}
