"""The Celery app, set up like Flask's Celery example: an init function from the settings, and a task class
that gives every task the resources of its worker process (settings, opened index versions), loaded once.

    celery -A workers.celery_app worker      (or: ticketrec worker)

A worker outlives its broker: when Redis goes away it reconnects until Redis is back (it never exits for that),
and each worker process opens, maps and scores the current index version once before it takes a task, and again
for every new version (CURRENT is watched), so the first shard of a query is not the one that pays for it.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict

from celery import Celery, Task
from celery.signals import worker_process_init
from celery.utils.log import get_logger

from recommender.config import Settings
from recommender.serving.distributed import celery_config

from .schedule import beat_schedule

log = get_logger(__name__)  # a child of Celery's logger: its lines go to the worker's log

#: Index versions a worker process keeps open (immutable directories; the newest is the one asked for most).
OPEN_INDEXES = 2
#: Seconds between two looks of a worker process at CURRENT (a new version is warmed before queries ask for it:
#: the engines switch only after loading the version's model, which takes longer).
WATCH_INTERVAL = 1.0
#: Seconds a new worker process may take to start, warm-up included, before Celery replaces it (default 4).
PROCESS_START_TIMEOUT = 120.0


def worker_settings() -> dict:
    """Celery settings of the workers on top of `celery_config`: reconnect to the broker forever (at start-up and
    after losing it), cancel what a lost connection orphaned, give processes time to warm up."""
    return {
        "broker_connection_retry": True,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,  # retry forever: Redis restarting must not end the worker
        "broker_channel_error_retry": True,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_proc_alive_timeout": PROCESS_START_TIMEOUT,
    }


class WorkerResources:
    """What a worker process loads once and reuses across tasks."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._indexes: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()  # guards the dictionaries, never held while a version is opened
        self._opening: dict[str, threading.Lock] = {}
        #: Versions this process opened (a task that finds its version open did not pay for opening it).
        self.opened = 0
        self._watcher: threading.Thread | None = None
        self._stop_watching = threading.Event()

    def is_open(self, version: str) -> bool:
        """Whether `version` is open in this process already."""
        with self._lock:
            return version in self._indexes

    def index(self, version: str):
        """Index `version`, memory-mapped and warmed on first use and kept open (LRU of OPEN_INDEXES). One thread
        opens a version; tasks for the versions already open do not wait for it."""
        from recommender.serving.index import open_version

        with self._lock:
            idx = self._indexes.get(version)
            if idx is not None:
                self._indexes.move_to_end(version)
                return idx
            opening = self._opening.setdefault(version, threading.Lock())
        with opening:
            with self._lock:
                idx = self._indexes.get(version)
            if idx is None:
                idx = open_version(self.settings, version)
                idx.warm()  # map its pages once, not during the first queries
                with self._lock:
                    self._indexes[version] = idx
                    self.opened += 1
                    self._opening.pop(version, None)
                    while len(self._indexes) > OPEN_INDEXES:
                        self._indexes.popitem(last=False)
        return idx

    def warm_up(self, version: str | None = None) -> str | None:
        """Open and warm `version` (default: CURRENT) and score one dummy query on it, so that opening, page
        faults and loading the compiled scorer are paid now, not by a query; the version, or None if none yet."""
        from recommender.serving.index import current_version

        from .tasks import warm_scorer

        version = version or current_version(self.settings)
        if version is None:
            log.info("no index version yet; nothing to warm")
            return None
        started = time.perf_counter()
        index = self.index(version)
        warm_scorer(index)
        log.info("warmed index %s (%d tickets) in %.2fs", version, len(index), time.perf_counter() - started)
        return version

    def watch_current(self, warmed: str | None, interval: float = WATCH_INTERVAL) -> None:
        """Warm each new CURRENT version (after `warmed`) in a background thread of this process (one per process)."""
        if self._watcher is not None:
            return

        def loop(warmed: str | None) -> None:
            from recommender.serving.index import current_version

            while not self._stop_watching.wait(interval):
                latest = current_version(self.settings)
                if latest and latest != warmed:
                    warmed = latest
                    try:
                        self.warm_up(latest)
                    except Exception as exc:  # a broken version: the tasks that ask for it report it
                        log.warning("could not warm index %s: %s", latest, exc)

        self._watcher = threading.Thread(target=loop, args=(warmed,), name="ticketrec-index-watch", daemon=True)
        self._watcher.start()

    def stop_watching(self) -> None:
        """End the thread of `watch_current` (a worker process never needs to: it dies with the process)."""
        self._stop_watching.set()
        if self._watcher is not None:
            self._watcher.join()


class TicketrecTask(Task):
    """Base task: `self.resources` are the worker process's settings and open indexes (built on first use)."""

    _resources: WorkerResources | None = None

    @property
    def resources(self) -> WorkerResources:
        return resources()


def resources() -> WorkerResources:
    """This process's WorkerResources (created on first use)."""
    cls = TicketrecTask
    if cls._resources is None:
        cls._resources = WorkerResources(Settings.from_env())
    return cls._resources


@worker_process_init.connect
def warm_worker_process(**_) -> None:
    """Before a new worker process takes its first task: warm the current index version, then watch CURRENT."""
    res = resources()
    warmed = None
    try:
        warmed = res.warm_up()
    except Exception as exc:  # never keep a worker from starting: the tasks report a broken index themselves
        log.warning("could not warm the current index: %s", exc)
    res.watch_current(warmed)


def create_celery(settings: Settings | None = None) -> Celery:
    """The Celery app for `settings` (default: the environment): Redis broker/backend, JSON, the beat schedule."""
    settings = settings or Settings.from_env()
    app = Celery("ticketrec", task_cls=TicketrecTask, include=["workers.tasks"])
    conf = celery_config(settings.broker_url) if settings.broker_url else {}
    conf.update(worker_settings())
    conf.update(
        worker_prefetch_multiplier=1,
        task_acks_late=False,
        worker_hijack_root_logger=False,
        enable_utc=False,  # TICKETREC_REINDEX_AT is the beat process's local time
        beat_schedule=beat_schedule(settings),
        beat_schedule_filename=str(settings.home / "celerybeat-schedule"),
    )
    app.conf.update(conf)
    app.set_default()
    from . import tasks  # noqa: F401  (registers the shared tasks on this app)

    return app


app = create_celery()
