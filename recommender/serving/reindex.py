"""Reindex: the one body behind `ticketrec index`/`reindex` and the Celery reindex task.

Build a new index version of the store's tickets with a model, switch CURRENT to it and prune old versions
(`build_index` does the three, under its lock), then describe the version that serves afterwards.
"""
from __future__ import annotations

import time
from pathlib import Path

from ..config import Settings
from ..data.store import Store
from ..model.bundle import TicketModel
from .index import TicketIndex, current_version, open_current
from .index_build import build_index, stored_tickets, unchanged_rows


def default_model_dir(settings: Settings) -> Path:
    """The model a build uses when none is named: TICKETREC_MODEL when it holds one, else the serving version's."""
    if (settings.model / "config.json").exists() or current_version(settings) is None:
        return settings.model
    return open_current(settings).model_dir


def reindex(settings: Settings, store: Store | None = None, model: TicketModel | str | Path | None = None, *,
            full: bool = False, float16: bool | None = None, workers: int | None = None, progress: bool = False) -> dict:
    """Index the store's tickets (only new or changed ones unless `full`) and switch to the new version.

    `store`: default, the settings' database (opened and closed here). `model`: a loaded model or its directory
    (default: TICKETREC_MODEL, or, when there is none, the model the serving version carries, so that a nightly
    reindex after `ticketrec index --model DIR` keeps that model). An Elasticsearch pre-filter is fed the tickets as well; FTS5 and the index's own
    postings need no feeding. `float16` None: TICKETREC_INDEX_DTYPE decides (`build_index`). Returns the serving version's description: version, path, n_tickets, encoded,
    reused, dtype, model_version and seconds.
    """
    started = time.time()
    if store is None:
        with Store(settings.db) as own:
            return reindex(settings, own, model, full=full, float16=float16, workers=workers, progress=progress)
    if not isinstance(model, TicketModel):
        model = TicketModel.load(Path(model) if model else default_model_dir(settings))
    prefilter = None
    if settings.prefilter in ("elasticsearch", "es"):
        from .searchers import make_searcher

        prefilter = make_searcher(settings, store)
    version = build_index(store, model, settings, incremental=not full, float16=float16, progress=progress,
                          prefilter=prefilter, workers=workers)
    index = open_current(settings)
    return {"version": version, "path": str(index.path), "n_tickets": len(index),
            "encoded": index.manifest.get("encoded"), "reused": index.manifest.get("reused"),
            "dtype": index.manifest.get("dtype"), "model_version": index.model_version,
            "seconds": round(time.time() - started, 2)}


def model_age(config: dict | None, store: Store) -> dict:
    """When the model of `config` was trained, on how many tickets, and how many of the store's tickets were added or
    changed since: {"trained_at", "tickets", "changed_since"}, each None where unknown (all of them without a
    config)."""
    facts = TicketModel.training_facts(config) if config else {"trained_at": None, "tickets": None}
    since = facts["trained_at"]
    return {**facts, "changed_since": store.tickets_changed_since(since) if since is not None else None}


def pending_changes(settings: Settings, store: Store, index: TicketIndex) -> dict:
    """What a reindex would change in `index`: the store's tickets new or changed since it was built, the tickets
    it holds that the store no longer does (removed), and the version of the model in TICKETREC_MODEL when that is
    another than the one `index` carries (None when they are the same, or TICKETREC_MODEL holds none): `ticketrec
    index` would build with it."""
    ids, updated = stored_tickets(store)
    kept = unchanged_rows(index, ids, updated) >= 0
    lookup = index.row_of
    new = sum(1 for tid in ids if tid not in lookup)
    build_model = TicketModel.saved_version(settings.model)
    return {"store_tickets": len(ids), "new": new, "changed": len(ids) - int(kept.sum()) - new,
            "removed": len(index) - (len(ids) - new),
            "other_model": build_model if build_model and build_model != index.model_version else None}
