"""Celery tasks, registered by name on every app (shared_task): score a shard, reindex, train."""
from __future__ import annotations

from celery import shared_task
from celery.utils.log import get_task_logger

log = get_task_logger(__name__)  # into the worker's log


@shared_task(name="ticketrec.score_shard", bind=True)
def score_shard(self, index_version: str, shard: int, n_shards: int, query_vecs: dict, k: int,
                rows: str | None = None, bm25: str | None = None, bm25_max: float | None = None) -> dict:
    """Top k (ids, scores) of one shard of index `index_version` for an encoded query (`pack_vectors`).

    `rows`/`bm25`: the query's BM25 candidates over the whole index, packed (`pack_array`: int64 rows, float32
    scores); each shard keeps those in its row range; `bm25_max` is the maximum over all of them, so normalisation
    matches in-process scoring. "cold" in the result: this task had to open the version (the warm-up had not).
    """
    cold = not self.resources.is_open(index_version)
    index = self.resources.index(index_version)
    return {**score_one_shard(index, shard, n_shards, query_vecs, k, rows, bm25, bm25_max), "cold": cold}


def score_one_shard(index, shard: int, n_shards: int, query_vecs: dict, k: int, rows: str | None = None,
                    bm25: str | None = None, bm25_max: float | None = None) -> dict:
    """The body of `score_shard` on an open index: its shard's top k as JSON-ready lists."""
    import numpy as np

    from recommender.serving.distributed import unpack_array, unpack_vectors
    from recommender.serving.scoring import rank

    start, stop = index.shard_rows(shard, n_shards)
    best_rows, g, best_bm25 = rank(index.metric_spec, unpack_vectors(query_vecs), index.vectors, k,
                                   None if rows is None else unpack_array(rows, np.int64),
                                   None if bm25 is None else unpack_array(bm25, np.float32),
                                   row_range=(start, stop), bm25_max=bm25_max)
    return {
        "index_version": index.version,
        "shard": shard,
        "ids": [index.ticket_ids[int(r)] for r in best_rows],
        "scores": [float(s) for s in g],
        "bm25": None if best_bm25 is None else [float(b) for b in best_bm25],
    }


def warm_scorer(index) -> None:
    """Score a zero query on a few rows of `index` through `score_one_shard`, so that its imports and the compiled
    scorer (numba's cache) are loaded before the first real shard."""
    import numpy as np

    from recommender.serving.distributed import pack_array, zero_query

    rows = np.arange(min(len(index), 8))
    score_one_shard(index, 0, 1, zero_query(index), 1, rows=pack_array(rows, np.int64),
                    bm25=pack_array(np.zeros(len(rows)), np.float32), bm25_max=None)


@shared_task(name="ticketrec.reindex", bind=True)
def reindex(self, full: bool = False) -> dict:
    """Incremental (or full) rebuild of the ticket index with the current model; the version that serves after."""
    from recommender.serving.reindex import reindex as reindex_here

    result = reindex_here(self.resources.settings, full=full, progress=False)
    log.info("reindex done: %s (%d tickets)", result["version"], result["n_tickets"])
    return result


@shared_task(name="ticketrec.train", bind=True)
def train(self, preset: str = "ml_cl_hET", overrides: dict | None = None, out: str | None = None, seed: int = 0,
          reindex: bool = True) -> dict:
    """Train a model on the store's labelled pairs (a held-out share of queries for early stopping), save it to
    `out` (default: TICKETREC_MODEL) and, when it is TICKETREC_MODEL (the model builds use), build an index version
    with it: the engines serve the model a version carries, so the new model serves once that version is current."""
    from pathlib import Path

    from recommender.serving.reindex import reindex as reindex_here
    from recommender.model.siamese import SiameseConfig
    from recommender.data.store import Store
    from recommender.model.training import train_model

    settings = self.resources.settings
    out_dir = Path(out) if out else settings.model
    store = Store(settings.db)
    try:
        config = SiameseConfig.preset(preset, **(overrides or {}))
        model = train_model(store.dataset(), None, config, out_dir, seed=seed, progress=False)
        result = {"model": str(out_dir), "model_version": model.version,
                  "dev": model.meta.get("training", {}).get("dev")}
        if reindex and out_dir.resolve() == settings.model.resolve():
            result["index_version"] = reindex_here(settings, store, model)["version"]
        return result
    finally:
        store.close()
