"""Thin Celery client: score one query on the workers by task name (one task, or a fan-out over the index
shards merged into one top k).

It sends tasks by name ("ticketrec.score_shard", ...) and never imports `workers/` (arrows point one way).
Every failure — broker unreachable, no worker, deadline passed, a shard that errs — becomes
`ServiceUnavailable`, which the engine answers by scoring in-process; its `CircuitBreaker` then keeps queries off
the broker for TICKETREC_BROKER_RETRY_AFTER seconds before one query tries the workers again. A dead Redis costs
one refused connection (or CONNECT_TIMEOUT), never Celery's retries (`client_config`).
"""
from __future__ import annotations

import base64
import logging
import threading
import time
from typing import Callable, Mapping

import numpy as np

from ..config import Settings
from ..errors import ServiceUnavailable

log = logging.getLogger(__name__)

SCORE_SHARD = "ticketrec.score_shard"
REINDEX = "ticketrec.reindex"
TRAIN = "ticketrec.train"

_clients: dict[str, object] = {}
_clients_lock = threading.Lock()


#: Seconds to open a TCP connection to Redis before it counts as unreachable (client and workers).
CONNECT_TIMEOUT = 0.5
#: Seconds a client waits on an open Redis connection (a hung server) before giving up.
CLIENT_SOCKET_TIMEOUT = 5.0


def celery_config(broker_url: str) -> dict:
    """Celery settings shared by the client and the workers: Redis broker and backend, JSON, short connect
    timeouts. How each side retries is its own: `client_config` here, `workers.celery_app` for the workers."""
    return {
        "broker_url": broker_url,
        "result_backend": broker_url,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_expires": 3600,
        "broker_connection_timeout": CONNECT_TIMEOUT,
        "broker_transport_options": {"socket_connect_timeout": CONNECT_TIMEOUT, "socket_timeout": 10.0},
        "redis_socket_connect_timeout": CONNECT_TIMEOUT,
        "redis_socket_timeout": 10.0,
    }


def client_config(broker_url: str) -> dict:
    """`celery_config` for the side that sends tasks (web, CLI): one connection attempt per call, no retry, so a
    dead Redis costs a refused connection (or CONNECT_TIMEOUT), not Celery's default ~20 one-second retries of the
    result backend; the engine's circuit breaker then keeps queries off the broker for a while."""
    conf = celery_config(broker_url)
    conf.update({
        "broker_connection_retry": False,
        "broker_connection_retry_on_startup": False,
        "broker_connection_max_retries": 0,
        "broker_transport_options": {"socket_connect_timeout": CONNECT_TIMEOUT,
                                     "socket_timeout": CLIENT_SOCKET_TIMEOUT},
        "redis_socket_timeout": CLIENT_SOCKET_TIMEOUT,
        "redis_retry_on_timeout": False,
        "result_backend_transport_options": {"retry_policy": {"max_retries": 0}},
        "task_publish_retry": False,
    })
    return conf


def celery_client(broker_url: str):
    """A Celery app used only to send tasks and read results (one per broker URL and process)."""
    with _clients_lock:
        app = _clients.get(broker_url)
        if app is None:
            # celery resolves its names lazily, and not thread-safely: first resolve them here, under the lock
            # (8 threads of a fresh process importing `group` at once failed with ImportError)
            from celery import Celery, group  # noqa: F401
            from celery.exceptions import TimeoutError  # noqa: F401

            app = Celery("ticketrec-client", set_as_current=False)
            app.conf.update(client_config(broker_url))
            _clients[broker_url] = app
        return app


#: Candidates one shard scores before a query is worth a second task. One process scores 1,000 pre-filtered
#: candidates in about 1.3 ms at 1M tickets, while a group of 2 tasks costs about 7 ms more than one task on 2 cores
#: (docs/results/serving.md, "Celery: one task or a fan-out"): splitting pays from about 10,000 candidates, so a
#: pre-filtered query (K ≤ 10,000) goes to one worker and exhaustive scoring (K = 0) is split over TICKETREC_SHARDS.
ROWS_PER_SHARD = 10_000


def shards_for(n_rows: int | None, shards: int) -> int:
    """How many shards score one query: `shards` for the whole index (`n_rows` None), else one per
    ROWS_PER_SHARD candidates, from 1 to `shards`."""
    shards = max(1, shards)
    if n_rows is None:
        return shards
    return min(shards, max(1, -(-n_rows // ROWS_PER_SHARD)))


def pack_array(values, dtype) -> str:
    """A 1-d array as base64 of its little-endian bytes: a JSON string 3× shorter than a list of numbers, and
    encoded and decoded in microseconds instead of the milliseconds a list of 1,000 floats takes each way."""
    return base64.b64encode(np.ascontiguousarray(values, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()).decode()


def unpack_array(data: str, dtype) -> np.ndarray:
    """Inverse of `pack_array` (a writable array in the machine's byte order)."""
    return np.frombuffer(base64.b64decode(data), dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)


def pack_vectors(vecs: Mapping[str, np.ndarray]) -> dict[str, str]:
    """An encoded query (one row per key) for a task's JSON payload: key → `pack_array` of its float32 row."""
    return {key: pack_array(np.asarray(v).reshape(-1), np.float32) for key, v in vecs.items()}


def zero_query(index) -> dict[str, str]:
    """A packed all-zero query for every query key the metric of `index` reads (a worker's warm-up, tests)."""
    dims, spec = index.vectors.dims, index.metric_spec
    return pack_vectors({f"{a}.{c}": np.zeros(dims[f"{b}.{c}"], np.float32) for a, b, _ in spec["pairs"]
                         for c in spec["channels"] if f"{b}.{c}" in dims})


def unpack_vectors(data: Mapping[str, str]) -> dict[str, np.ndarray]:
    """Inverse of `pack_vectors`: key → float32 [1, d]."""
    return {key: unpack_array(v, np.float32).reshape(1, -1) for key, v in data.items()}


def score_on_workers(settings: Settings, index_version: str, query_vecs: Mapping[str, np.ndarray], k: int,
                     rows: np.ndarray | None = None, bm25: np.ndarray | None = None,
                     n_shards: int | None = None, deadline: float | None = None,
                     bm25_max: float | None = None) -> list[tuple[str, float, float | None]]:
    """Score one encoded query on Celery workers; the merged top k as (ticket id, g, bm25), best first.

    `rows`/`bm25`: the BM25 candidate rows of index `index_version` (all rows when None), normalised by `bm25_max`
    (default: their maximum; a filtered query gives the unfiltered one). `n_shards` tasks score
    it (default: `shards_for` the candidates; one task is sent alone, several as a group). Raises
    ServiceUnavailable when the broker cannot be reached or the shards do not all answer within `deadline`.
    """
    if not settings.broker_url:
        raise ServiceUnavailable("TICKETREC_BROKER_URL is not set; distributed scoring is off")
    n_shards = max(1, n_shards or shards_for(None if rows is None else len(rows), settings.shards))
    deadline = settings.query_deadline if deadline is None else deadline
    started = time.monotonic()
    app = celery_client(settings.broker_url)  # first: it resolves celery's names under a lock
    from celery import group
    from celery.exceptions import TimeoutError as CeleryTimeout

    if bm25_max is None and bm25 is not None and len(bm25):
        bm25_max = float(np.max(bm25))
    kwargs = {"rows": None if rows is None else pack_array(rows, np.int64),
              "bm25": None if bm25 is None else pack_array(bm25, np.float32),
              "bm25_max": None if bm25_max is None else float(bm25_max)}
    payload = pack_vectors(query_vecs)
    tasks = [app.signature(SCORE_SHARD, args=(index_version, shard, n_shards, payload, int(k)), kwargs=kwargs)
             for shard in range(n_shards)]
    job = tasks[0] if n_shards == 1 else group(tasks, app=app)
    result = None
    try:
        result = job.apply_async(retry=False, expires=max(deadline, 1.0))
        remaining = max(0.01, deadline - (time.monotonic() - started))
        parts = result.get(timeout=remaining, interval=0.005, propagate=True, disable_sync_subtasks=False)
        parts = [parts] if n_shards == 1 else parts
    except CeleryTimeout:
        _abandon(result)
        raise ServiceUnavailable(f"the Celery workers did not answer within the {deadline:g}s deadline "
                                 f"(none running, or overloaded)") from None
    except Exception as exc:  # kombu/redis connection errors, a shard's own error
        _abandon(result, revoke=False)
        lost = connection_error(exc)
        if lost is not None:
            _unsubscribe_all(app)
            raise ServiceUnavailable(f"broker unreachable at {_safe_url(settings.broker_url)} "
                                     f"({_one_line(lost)})") from exc
        raise ServiceUnavailable(f"distributed scoring failed via {_safe_url(settings.broker_url)}: "
                                 f"{type(exc).__name__}: {_one_line(exc)}") from exc
    merged: list[tuple[str, float, float | None]] = []
    for part in parts:
        if part.get("index_version") != index_version:
            raise ServiceUnavailable(f"a worker scored index {part.get('index_version')} instead of {index_version}")
        bm = part.get("bm25") or [None] * len(part["ids"])
        merged.extend(zip(part["ids"], part["scores"], bm))
    merged.sort(key=lambda item: -item[1])
    _abandon(result, revoke=False)  # drop the stored results (the answer is in hand even if Redis just died)
    return merged[:k]


def send_task(settings: Settings, name: str, args=(), kwargs=None):
    """Queue a task by name (reindex, train) and return its AsyncResult; ServiceUnavailable if the broker is down."""
    if not settings.broker_url:
        raise ServiceUnavailable("TICKETREC_BROKER_URL is not set; start a Redis broker and set it, or run in-process")
    try:
        return celery_client(settings.broker_url).send_task(name, args=args, kwargs=kwargs or {}, retry=False)
    except Exception as exc:
        raise ServiceUnavailable(f"cannot queue {name} via {_safe_url(settings.broker_url)}: {exc}; "
                                 "is Redis running?") from exc


def _abandon(result, revoke: bool = True) -> None:
    """Stop waiting for a task or group: revoke its unstarted shards (broker alive) and drop stored results."""
    if result is None:
        return
    try:
        if revoke:
            result.revoke()
        result.forget()
    except Exception:  # the broker may be the thing that failed
        pass


def _unsubscribe_all(app) -> None:
    """After the result backend's connection died: forget its pub/sub subscriptions, so that the AsyncResults
    of the failed query, when garbage-collected, do not try to unsubscribe over the dead connection (a traceback
    each in the log); a new connection subscribes afresh."""
    consumer = getattr(app.backend, "result_consumer", None)
    subscribed = getattr(consumer, "subscribed_to", None)
    if isinstance(subscribed, set):
        subscribed.clear()


def connection_error(exc: BaseException | None) -> BaseException | None:
    """The connection failure behind `exc` (refused, timed out, reset: redis-py's or the socket's), or None when
    `exc` is something else (a shard's own error, a timeout waiting for workers)."""
    from redis.exceptions import ConnectionError as RedisConnectionError, TimeoutError as RedisTimeout

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (RedisConnectionError, RedisTimeout, OSError)):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


class CircuitBreaker:
    """Whether queries may go to the Celery workers: closed (yes) → open after a failure (no: in-process, for
    `backoff` seconds) → half-open (one query tries the workers) → closed when it succeeds, open again when not.

    Thread-safe; `clock` (monotonic seconds) and `wall` (epoch seconds, for "since HH:MM:SS") can be replaced.
    """

    CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"

    def __init__(self, backoff: float, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.backoff = float(backoff)
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._open = False
        self._retry_at = 0.0
        self._trial = False  # the half-open trial is under way
        self._since: float | None = None  # wall time of the failure that opened the circuit
        self._failure: str | None = None  # the latest failure

    @property
    def state(self) -> str:
        """closed, open (within the back-off) or half-open (the back-off is over: the next query tries)."""
        with self._lock:
            return self._state()

    def _state(self) -> str:
        if not self._open:
            return self.CLOSED
        return self.HALF_OPEN if self._clock() >= self._retry_at else self.OPEN

    def allow(self) -> bool:
        """May this query use the workers? Closed: yes. Half-open: yes for one query at a time (the trial); it
        must report `success()` or `failure()`. Open: no."""
        with self._lock:
            state = self._state()
            if state == self.CLOSED:
                return True
            if state == self.HALF_OPEN and not self._trial:
                self._trial = True
                return True
            return False

    def success(self) -> None:
        """The workers answered: close the circuit."""
        with self._lock:
            if self._open:
                log.info("the Celery workers answer again; the circuit is closed")
            self._open, self._trial, self._since, self._failure = False, False, None, None

    def failure(self, reason: str) -> None:
        """The broker or the workers failed: open the circuit for `backoff` seconds (from now)."""
        with self._lock:
            if not self._open:
                self._since = self._wall()
            self._open, self._trial, self._failure = True, False, reason
            self._retry_at = self._clock() + self.backoff

    def reason(self) -> str | None:
        """Why queries are answered in-process, e.g. "circuit open: broker unreachable at redis://… (…) since
        14:02:11; retrying the workers in 27s"; None when closed."""
        with self._lock:
            return self._reason()

    def _reason(self) -> str | None:
        if not self._open:
            return None
        left = max(0.0, self._retry_at - self._clock())
        when = f"in {left:.0f}s" if left > 0 else "with the next query"
        return f"circuit open: {self._failure} since {self._since_text()}; retrying the workers {when}"

    def _since_text(self) -> str:
        return time.strftime("%H:%M:%S", time.localtime(self._since))

    def snapshot(self) -> dict:
        """The state for the health data: {"state"}, and while not closed "since" (HH:MM:SS), "retry_in"
        (seconds) and "reason"."""
        with self._lock:
            state = self._state()
            if state == self.CLOSED:
                return {"state": state}
            return {"state": state, "since": self._since_text(),
                    "retry_in": round(max(0.0, self._retry_at - self._clock()), 1), "reason": self._reason()}


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _safe_url(url: str) -> str:
    """The broker URL without its password, for messages and logs."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
