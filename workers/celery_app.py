"""The Celery app, set up like Flask's Celery example: an init function from the settings, and a task class
that gives every task the resources of its worker process (settings, opened index versions), loaded once.

    celery -A workers.celery_app worker      (or: ticketrec worker)
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict

from celery import Celery, Task

from recommender.config import Settings
from recommender.serving.distributed import celery_config

from .schedule import beat_schedule

log = logging.getLogger(__name__)

#: Index versions a worker process keeps open (immutable directories; the newest is the one asked for most).
OPEN_INDEXES = 2


class WorkerResources:
    """What a worker process loads once and reuses across tasks."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._indexes: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()

    def index(self, version: str):
        """Index `version`, memory-mapped on first use and kept open (LRU of OPEN_INDEXES)."""
        from recommender.serving.index import open_version

        with self._lock:
            idx = self._indexes.get(version)
            if idx is None:
                idx = open_version(self.settings, version)
                idx.warm()  # map its pages once, not during the first queries
                self._indexes[version] = idx
                while len(self._indexes) > OPEN_INDEXES:
                    self._indexes.popitem(last=False)
            else:
                self._indexes.move_to_end(version)
            return idx


class TicketrecTask(Task):
    """Base task: `self.resources` are the worker process's settings and open indexes (built on first use)."""

    _resources: WorkerResources | None = None

    @property
    def resources(self) -> WorkerResources:
        cls = TicketrecTask
        if cls._resources is None:
            cls._resources = WorkerResources(Settings.from_env())
        return cls._resources


def create_celery(settings: Settings | None = None) -> Celery:
    """The Celery app for `settings` (default: the environment): Redis broker/backend, JSON, the beat schedule."""
    settings = settings or Settings.from_env()
    app = Celery("ticketrec", task_cls=TicketrecTask, include=["workers.tasks"])
    conf = celery_config(settings.broker_url) if settings.broker_url else {}
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
