"""Celery over a real Redis: shard scoring equals in-process scoring, reindex runs on a worker, a missing worker is
answered in-process before the deadline; the beat schedule."""
import json
import time

import numpy as np
import pytest
from click.testing import CliRunner

from recommender.config import Settings
from recommender.errors import TicketrecError
from recommender.data.records import Query, Ticket
from recommender.data.store import Dataset, Store
from recommender.serving import distributed


# -- beat schedule and app set-up (no server needed) --------------------------------------------------------------
def test_nightly_reindex_schedule_follows_the_setting(tmp_path):
    from workers.celery_app import create_celery
    from workers.schedule import beat_schedule, parse_reindex_at

    settings = Settings.from_env({"TICKETREC_HOME": str(tmp_path), "TICKETREC_REINDEX_AT": "03:45",
                                  "TICKETREC_BROKER_URL": "redis://127.0.0.1:1/0"})
    entry = beat_schedule(settings)["nightly-reindex"]
    assert entry["task"] == "ticketrec.reindex"
    assert entry["schedule"].hour == {3} and entry["schedule"].minute == {45}
    assert parse_reindex_at("0:05") == (0, 5)
    for bad in ("25:00", "3.45", "", "noon"):
        with pytest.raises(TicketrecError, match="TICKETREC_REINDEX_AT"):
            parse_reindex_at(bad)
    app = create_celery(settings)
    assert app.conf.broker_url == app.conf.result_backend == "redis://127.0.0.1:1/0"
    assert app.conf.beat_schedule["nightly-reindex"]["schedule"].hour == {3}
    assert {"ticketrec.score_shard", "ticketrec.reindex", "ticketrec.train"} <= set(app.tasks)


def test_a_pre_filtered_query_goes_to_one_task_and_the_whole_index_to_every_shard():
    per = distributed.ROWS_PER_SHARD
    assert distributed.shards_for(None, 2) == 2  # K = 0: every ticket, split over the shards
    assert [distributed.shards_for(n, 4) for n in (0, 1000, per, per + 1, 3 * per, 100 * per)] == [1, 1, 1, 2, 3, 4]
    assert distributed.shards_for(1000, 0) == distributed.shards_for(None, 0) == 1


def test_a_task_payload_carries_the_query_and_candidates_exactly():
    rng = np.random.default_rng(0)
    vecs = {"SUB.E": rng.normal(size=(1, 7)).astype(np.float32), "ALL.T": np.float32([[0.0, -1e-30, 3.0e38]])}
    back = distributed.unpack_vectors(json.loads(json.dumps(distributed.pack_vectors(vecs))))
    assert back.keys() == vecs.keys()
    for key, v in vecs.items():
        assert back[key].dtype == np.float32 and back[key].shape == v.shape and np.array_equal(back[key], v)
    rows = np.array([0, 5, 2**40], np.int64)
    assert np.array_equal(distributed.unpack_array(distributed.pack_array(rows, np.int64), np.int64), rows)
    assert distributed.unpack_array(distributed.pack_array([], np.float32), np.float32).shape == (0,)


def test_worker_and_beat_need_a_broker_url(tmp_path):
    runner = CliRunner()
    for command in ("worker", "beat"):
        out = runner.invoke(__import__("recommender.cli").cli.main, [command], env={"TICKETREC_HOME": str(tmp_path),
                                                                                   "TICKETREC_BROKER_URL": ""})
        assert out.exit_code == 1 and "TICKETREC_BROKER_URL" in out.output


# -- real Redis and a real worker ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def redis_url(redis_servers):
    """A private redis-server on 127.0.0.1 (no persistence), stopped at teardown."""
    server = redis_servers()
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def home(tmp_path_factory, tiny_model):
    """(env, settings) of a home with the tiny knowledge base indexed."""
    from recommender.serving.index_build import build_index
    from recommender.model.bundle import TicketModel

    base = tmp_path_factory.mktemp("celery-home")
    env = {"TICKETREC_HOME": str(base / "home"), "TICKETREC_MODEL": str(tiny_model[0]),
           "TICKETREC_CANDIDATES": "20", "TICKETREC_SHARDS": "2", "TICKETREC_QUERY_DEADLINE": "20"}
    settings = Settings.from_env(env)
    with Store(settings.db) as store:
        store.import_dataset(Dataset(tiny_model[1].tickets, source="kb"))
        build_index(store, TicketModel.load(tiny_model[0]), settings, progress=False)
    return env, settings


@pytest.fixture(scope="module")
def worker(redis_url, home, celery_workers):
    """`ticketrec worker --concurrency 2` as a subprocess against the private Redis; its broker URL."""
    started = celery_workers(home[0], redis_url)
    yield redis_url
    started.stop()


def _engines(home, broker_url, **changes):
    from recommender.serving.engine import Recommender

    _, settings = home
    local = Recommender(settings.replace(**changes))
    remote = Recommender(settings.replace(broker_url=broker_url, **changes))
    return local, remote


@pytest.mark.integration
@pytest.mark.parametrize("candidates, rows_per_shard", [(0, distributed.ROWS_PER_SHARD), (20, distributed.ROWS_PER_SHARD),
                                                        (20, 10)],
                         ids=["every-ticket-on-2-shards", "candidates-in-one-task", "candidates-on-2-shards"])
def test_scores_through_workers_equal_in_process_scores(home, worker, tiny_model, candidates, rows_per_shard,
                                                        monkeypatch):
    monkeypatch.setattr(distributed, "ROWS_PER_SHARD", rows_per_shard)
    local, remote = _engines(home, worker, candidates=candidates)
    for q in tiny_model[1].queries[:3]:
        query = Query(q.subject, q.description)
        expected = local.recommend(query, k=6)
        got = remote.recommend(query, k=6)
        assert got.info.mode == "celery" and expected.info.mode == "in-process", got.info
        assert [r.ticket.id for r in got] == [r.ticket.id for r in expected]
        assert [r.raw_score for r in got] == pytest.approx([r.raw_score for r in expected], abs=1e-6)
        assert [r.bm25 for r in got] == [r.bm25 for r in expected]


@pytest.mark.integration
@pytest.mark.parametrize("rows_per_shard", [distributed.ROWS_PER_SHARD, 3], ids=["one-task", "several-shards"])
def test_a_filtered_query_scores_on_the_workers_as_in_process(home, worker, tiny_model, rows_per_shard, monkeypatch):
    """The filter leaves out the query's best BM25 ticket, so the workers must normalise BM25 by the maximum they
    are sent (the unfiltered one), not by the filtered candidates' own."""
    from recommender.data.filters import parse_filter
    from recommender.serving.searchers import make_searcher

    monkeypatch.setattr(distributed, "ROWS_PER_SHARD", rows_per_shard)
    local, remote = _engines(home, worker)
    tickets = {t.id: t for t in tiny_model[1].tickets}
    for q in tiny_model[1].queries[:3]:
        query = Query(q.subject, q.description)
        top_id = make_searcher(home[1], None, local.index).search(f"{q.subject}\n{q.description}", 1)[0][0]
        where = parse_filter([f"subsystem!={tickets[top_id].metadata['subsystem']}"])
        expected, got = local.recommend(query, k=5, where=where), remote.recommend(query, k=5, where=where)
        assert got.info.mode == "celery" and expected.info.mode == "in-process", got.info
        assert [r.ticket.id for r in got] == [r.ticket.id for r in expected] and top_id not in [r.ticket.id for r in got]
        assert [r.raw_score for r in got] == pytest.approx([r.raw_score for r in expected], abs=1e-6)


@pytest.mark.integration
def test_a_queue_without_workers_is_answered_in_process_by_the_deadline(home, worker, tiny_model):
    lonely = worker.rsplit("/", 1)[0] + "/5"  # same Redis, a database no worker listens on
    local, remote = _engines(home, lonely, query_deadline=0.5)
    query = Query(tiny_model[1].queries[0].subject, tiny_model[1].queries[0].description)
    started = time.monotonic()
    got = remote.recommend(query, k=4)
    assert time.monotonic() - started < 15
    assert got.info.mode == "in-process" and "deadline" in got.info.fallback_reason
    assert [r.ticket.id for r in got] == [r.ticket.id for r in local.recommend(query, k=4)]


@pytest.mark.integration
def test_reindex_runs_on_a_worker_and_the_engine_follows(home, worker):
    from recommender.serving.index import current_version

    env, settings = home
    before = current_version(settings)
    with Store(settings.db) as store:
        store.import_dataset(Dataset([Ticket("CEL-1", "Hydraulic accumulator", "The hydraulic accumulator loses "
                                             "nitrogen precharge overnight.", "Recharge and replace the bladder.")],
                                     source="new"))
    out = CliRunner().invoke(__import__("recommender.cli").cli.main, ["reindex"],
                             env={**env, "TICKETREC_BROKER_URL": worker})
    assert out.exit_code == 0, out.output
    info = json.loads(out.output)
    assert info["version"] != before and info["encoded"] == 1 and info["n_tickets"] == 81
    assert current_version(settings) == info["version"]
    _, remote = _engines(home, worker)
    results = remote.recommend(Query("hydraulic accumulator", "accumulator loses nitrogen precharge"), k=3)
    assert results.info.mode == "celery" and results.info.index_version == info["version"]
    assert "CEL-1" in [r.ticket.id for r in results]


@pytest.mark.integration
def test_a_reindex_asked_over_the_api_is_queued_for_a_worker_and_followed_to_its_end(home, worker):
    from recommender.serving.index import current_version
    from recommender.serving.index_build import _build_lock
    from web import create_app

    _, settings = home
    settings = settings.replace(broker_url=worker)
    with Store(settings.db) as store:
        store.add_user("integration", "integration password")
        headers = {"Authorization": f"Bearer {store.create_token('integration', 'tickets')[1]}"}
    api = create_app({"TESTING": True, "TICKETREC_SETTINGS": settings, "TICKETREC_REPORT_ROOTS": []}).test_client()
    sent = {"subject": "Cooling fan rattles", "description": "The cooling fan rattles loudly at start-up.",
            "solution": "Tightened the fan's mounting bolts."}
    assert api.put("/api/v1/tickets/CEL-API-1", json=sent, headers=headers).status_code == 201
    before = current_version(settings)

    def follow(task_id: str) -> dict:
        """GET the queued task until it has ended (a minute at most)."""
        deadline = time.monotonic() + 60
        while (state := api.get(f"/api/v1/reindex/{task_id}", headers=headers).get_json())["state"] in ("pending",
                                                                                                           "running"):
            assert time.monotonic() < deadline, state
            time.sleep(0.2)
        return state

    queued = api.post("/api/v1/reindex", headers=headers)
    assert queued.status_code == 202, queued.get_data(as_text=True)
    task_id = queued.get_json()["task_id"]
    assert queued.get_json() == {"task_id": task_id, "state": "pending"}
    assert queued.headers["Location"].endswith(f"/api/v1/reindex/{task_id}")
    state = follow(task_id)
    assert state["state"] == "done", state
    assert state["result"]["version"] == current_version(settings) != before and state["result"]["encoded"] == 1
    assert "path" not in state["result"]
    assert api.put("/api/v1/tickets/CEL-API-1", json=sent, headers=headers).get_json()["indexed"] is True

    with _build_lock(settings.indexes_dir):  # another build holds the lock: the task fails
        state = follow(api.post("/api/v1/reindex", headers=headers).get_json()["task_id"])
    assert state["state"] == "failed" and "another index build is running" in state["error"], state
    # an id the result backend does not hold cannot be told from a queued one (Celery's PENDING)
    unknown = api.get("/api/v1/reindex/0b7e7c1e-7d4f-4a8e-9c3a-2f1d5e6a7b8c", headers=headers).get_json()
    assert unknown == {"task_id": "0b7e7c1e-7d4f-4a8e-9c3a-2f1d5e6a7b8c", "state": "pending"}
