"""Thin Celery client: fan one query out over the index shards by task name, merge their top k.

It sends tasks by name ("ticketrec.score_shard", ...) and never imports `workers/` (arrows point one way).
Every failure — broker unreachable, no worker, deadline passed, a shard that errs — becomes
`ServiceUnavailable`, which the engine answers by scoring in-process.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Mapping

import numpy as np

from ..config import Settings
from ..errors import ServiceUnavailable

log = logging.getLogger(__name__)

SCORE_SHARD = "ticketrec.score_shard"
REINDEX = "ticketrec.reindex"
TRAIN = "ticketrec.train"

_clients: dict[str, object] = {}
_clients_lock = threading.Lock()


def celery_config(broker_url: str) -> dict:
    """Celery settings shared by the client and the workers: Redis broker and backend, JSON, fail fast."""
    return {
        "broker_url": broker_url,
        "result_backend": broker_url,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_expires": 3600,
        "broker_connection_retry": False,
        "broker_connection_retry_on_startup": True,
        "broker_connection_timeout": 2.0,
        "broker_transport_options": {"socket_connect_timeout": 2.0, "socket_timeout": 10.0},
        "redis_socket_connect_timeout": 2.0,
        "redis_socket_timeout": 10.0,
        "task_publish_retry": False,
    }


def celery_client(broker_url: str):
    """A Celery app used only to send tasks and read results (one per broker URL and process)."""
    with _clients_lock:
        app = _clients.get(broker_url)
        if app is None:
            from celery import Celery

            app = Celery("ticketrec-client", set_as_current=False)
            app.conf.update(celery_config(broker_url))
            _clients[broker_url] = app
        return app


def pack_vectors(vecs: Mapping[str, np.ndarray]) -> dict[str, list[float]]:
    """An encoded query (one row per key) as JSON-ready lists; float32 → float → float32 is exact."""
    return {key: np.asarray(v, dtype=np.float32).reshape(-1).tolist() for key, v in vecs.items()}


def unpack_vectors(data: Mapping[str, list[float]]) -> dict[str, np.ndarray]:
    """Inverse of `pack_vectors`: key → float32 [1, d]."""
    return {key: np.asarray(v, dtype=np.float32).reshape(1, -1) for key, v in data.items()}


def score_on_workers(settings: Settings, index_version: str, query_vecs: Mapping[str, np.ndarray], k: int,
                     rows: np.ndarray | None = None, bm25: np.ndarray | None = None,
                     n_shards: int | None = None, deadline: float | None = None) -> list[tuple[str, float, float | None]]:
    """Score one encoded query on `n_shards` Celery workers; the merged top k as (ticket id, g, bm25), best first.

    `rows`/`bm25`: the BM25 candidate rows of index `index_version` (all rows when None). Raises
    ServiceUnavailable when the broker cannot be reached or the shards do not all answer within `deadline`.
    """
    if not settings.broker_url:
        raise ServiceUnavailable("TICKETREC_BROKER_URL is not set; distributed scoring is off")
    n_shards = max(1, n_shards or settings.shards)
    deadline = settings.query_deadline if deadline is None else deadline
    started = time.monotonic()
    from celery import group
    from celery.exceptions import TimeoutError as CeleryTimeout

    app = celery_client(settings.broker_url)
    rows_list = None if rows is None else np.asarray(rows, dtype=np.int64).tolist()
    bm25_list = None if bm25 is None else np.asarray(bm25, dtype=np.float32).tolist()
    bm25_max = None if bm25 is None or len(bm25_list) == 0 else float(max(bm25_list))
    payload = pack_vectors(query_vecs)
    jobs = group([
        app.signature(SCORE_SHARD, args=(index_version, shard, n_shards, payload, int(k)),
                      kwargs={"rows": rows_list, "bm25": bm25_list, "bm25_max": bm25_max})
        for shard in range(n_shards)
    ], app=app)
    result = None
    try:
        result = jobs.apply_async(retry=False, expires=max(deadline, 1.0))
        remaining = max(0.01, deadline - (time.monotonic() - started))
        parts = result.get(timeout=remaining, interval=0.005, propagate=True, disable_sync_subtasks=False)
    except CeleryTimeout:
        _abandon(result)
        raise ServiceUnavailable(f"the Celery workers did not answer within the {deadline:g}s deadline "
                                 f"(none running, or overloaded)") from None
    except Exception as exc:  # kombu/redis connection errors, a shard's own error
        _abandon(result, revoke=False)
        raise ServiceUnavailable(f"distributed scoring failed via {_safe_url(settings.broker_url)}: "
                                 f"{type(exc).__name__}: {exc}") from exc
    merged: list[tuple[str, float, float | None]] = []
    for part in parts:
        if part.get("index_version") != index_version:
            raise ServiceUnavailable(f"a worker scored index {part.get('index_version')} instead of {index_version}")
        bm = part.get("bm25") or [None] * len(part["ids"])
        merged.extend(zip(part["ids"], part["scores"], bm))
    merged.sort(key=lambda item: -item[1])
    result.forget()
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
    """Stop waiting for a group: revoke its unstarted shards (broker alive) and drop stored results."""
    if result is None:
        return
    try:
        if revoke:
            result.revoke()
        result.forget()
    except Exception:  # the broker may be the thing that failed
        pass


def _safe_url(url: str) -> str:
    """The broker URL without its password, for messages and logs."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
