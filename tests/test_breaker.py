"""Redis dead, workers cold (issue 14): the engine's circuit breaker on the Celery path, fail-fast client settings,
workers that reconnect instead of exiting, and worker processes that warm their index before the first task."""
import re
import socket
import time

import pytest

from recommender.config import Settings
from recommender.data.records import Query, Ticket
from recommender.data.store import Dataset, Store
from recommender.serving import distributed
from recommender.serving.distributed import CircuitBreaker, celery_client, client_config


# -- the state machine, on an injected clock ----------------------------------------------------------------------
class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_a_failure_and_tries_once_after_the_back_off():
    clock = Clock()
    breaker = CircuitBreaker(30.0, clock=clock, wall=lambda: time.mktime((2024, 5, 1, 14, 2, 11, 0, 0, -1)))
    assert breaker.state == "closed" and breaker.allow() and breaker.reason() is None
    assert breaker.snapshot() == {"state": "closed"}

    breaker.failure("broker unreachable at redis://127.0.0.1:1/0 (Connection refused)")
    assert breaker.state == "open" and not breaker.allow() and not breaker.allow()
    assert breaker.reason() == ("circuit open: broker unreachable at redis://127.0.0.1:1/0 (Connection refused) "
                                "since 14:02:11; retrying the workers in 30s")
    clock.now += 29.5
    assert breaker.state == "open" and not breaker.allow()
    assert breaker.snapshot() == {"state": "open", "since": "14:02:11", "retry_in": 0.5, "reason": breaker.reason()}

    clock.now += 0.5  # the back-off is over: half-open, one trial at a time
    assert breaker.state == "half-open"
    assert breaker.allow() and not breaker.allow()  # the trial; the others stay in-process meanwhile
    breaker.failure("broker unreachable at redis://127.0.0.1:1/0 (Connection refused)")
    assert breaker.state == "open" and not breaker.allow()
    assert "since 14:02:11" in breaker.reason()  # still the start of the outage

    clock.now += 30.0
    assert breaker.allow()
    breaker.success()
    assert breaker.state == "closed" and breaker.allow() and breaker.allow() and breaker.reason() is None


def test_the_engine_trips_its_breaker_once_and_stays_off_the_broker(celery_home, tiny_model, monkeypatch):
    """A dead broker: the first query pays one (refused) connection, the next ones none, until the back-off ends."""
    from recommender.serving import engine as engine_mod
    from recommender.serving.engine import Recommender

    clock = Clock()
    monkeypatch.setattr(engine_mod, "monotonic", clock)
    attempts = _count_attempts(monkeypatch)
    _, settings = celery_home
    engine = Recommender(settings.replace(broker_url=_dead_broker(), broker_retry_after=5.0))
    query = Query(tiny_model[1].queries[0].subject, tiny_model[1].queries[0].description)
    first = engine.recommend(query, k=3).info
    assert first.mode == "in-process" and first.fallback_reason.startswith("broker unreachable at redis://127.0.0.1")
    for _ in range(3):
        info = engine.recommend(query, k=3).info
        assert info.mode == "in-process" and info.fallback_reason.startswith("circuit open: broker unreachable")
        assert re.search(r"since \d\d:\d\d:\d\d; retrying the workers in 5s", info.fallback_reason)
    assert len(attempts) == 1 and engine.breaker.state == "open"
    clock.now += 5.0
    assert engine.recommend(query, k=3).info.fallback_reason.startswith("broker unreachable")  # the trial
    assert len(attempts) == 2 and engine.breaker.state == "open"


def test_the_client_makes_one_connection_attempt_and_the_workers_retry_forever(tmp_path):
    """Fail fast where a query waits (no Celery retries of the result backend: those cost ~19 s per query); never
    give up where a worker waits for Redis to come back."""
    from workers.celery_app import create_celery

    url = "redis://127.0.0.1:1/0"
    conf = client_config(url)
    assert conf["broker_connection_retry"] is False and conf["task_publish_retry"] is False
    assert conf["broker_connection_timeout"] < 1 and conf["redis_socket_connect_timeout"] < 1
    assert conf["broker_transport_options"]["socket_connect_timeout"] < 1
    client = celery_client(url)
    assert client.backend.retry_policy["max_retries"] == 0  # what the result backend really uses
    assert client.conf.broker_connection_timeout < 1

    workers = create_celery(Settings.from_env({"TICKETREC_HOME": str(tmp_path), "TICKETREC_BROKER_URL": url})).conf
    assert workers.broker_connection_retry and workers.broker_connection_retry_on_startup
    assert workers.broker_connection_max_retries is None  # forever
    assert workers.worker_cancel_long_running_tasks_on_connection_loss
    assert workers.worker_proc_alive_timeout >= 60  # room for the warm-up of a large index


# -- worker warm-up, in-process -----------------------------------------------------------------------------------
def test_a_worker_process_warms_the_current_version_and_each_new_one(kb_home, tiny_model):
    from recommender.model.bundle import TicketModel
    from recommender.serving.index import current_version
    from recommender.serving.index_build import build_index
    from workers.celery_app import WorkerResources

    settings, store = kb_home
    model = TicketModel.load(tiny_model[0])
    first = build_index(store, model, settings, progress=False)
    resources = WorkerResources(settings)
    assert resources.warm_up() == first and resources.is_open(first) and resources.opened == 1
    resources.index(first)
    assert resources.opened == 1  # the first task finds it open

    resources.watch_current(first, interval=0.02)
    try:
        store.import_dataset(Dataset([Ticket("WARM-1", "Bearing noise", "The bearing hums at full speed.",
                                             "Regrease the bearing.")], source="new"))
        second = build_index(store, model, settings, progress=False)
        assert current_version(settings) == second != first
        deadline = time.monotonic() + 30
        while not resources.is_open(second) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        resources.stop_watching()
    assert resources.is_open(second) and resources.opened == 2  # opened by the watcher, before any task asked


# -- the real thing: Redis stopped and started again under a real worker -----------------------------------------
BACKOFF = 1.0  # TICKETREC_BROKER_RETRY_AFTER for this test: short, so the workers are tried again soon


@pytest.fixture(scope="module")
def celery_home(tmp_path_factory, tiny_model):
    """(env, settings) of a home with the tiny knowledge base indexed."""
    from recommender.model.bundle import TicketModel
    from recommender.serving.index_build import build_index

    base = tmp_path_factory.mktemp("breaker-home")
    env = {"TICKETREC_HOME": str(base / "home"), "TICKETREC_MODEL": str(tiny_model[0]),
           "TICKETREC_CANDIDATES": "20", "TICKETREC_SHARDS": "2", "TICKETREC_QUERY_DEADLINE": "10",
           "TICKETREC_BROKER_RETRY_AFTER": str(BACKOFF)}
    settings = Settings.from_env(env)
    with Store(settings.db) as store:
        store.import_dataset(Dataset(tiny_model[1].tickets, source="kb"))
        build_index(store, TicketModel.load(tiny_model[0]), settings, progress=False)
    return env, settings


@pytest.mark.integration
def test_redis_down_is_answered_in_process_and_the_workers_come_back(celery_home, tiny_model, redis_servers,
                                                                     celery_workers, monkeypatch):
    from web import create_app

    from recommender.serving.engine import Recommender
    from recommender.serving.index import current_version

    env, settings = celery_home
    redis = redis_servers()
    worker = celery_workers(env, redis.url)
    settings = settings.replace(broker_url=redis.url)
    version = current_version(settings)

    # warm before the first task: the first shards found the version open, and the process that ran each one had
    # logged its warm-up before it
    parts = [celery_client(redis.url).send_task(distributed.SCORE_SHARD, args=(version, shard, 2, _zero_query(
        settings), 3)).get(timeout=30) for shard in range(2)]
    assert [p["cold"] for p in parts] == [False, False]
    done = r"INFO/(ForkPoolWorker-\d+)\] Task ticketrec.score_shard\[\S+\] succeeded"
    deadline = time.monotonic() + 30  # a task logs "succeeded" just after its result is stored
    while len(re.findall(done, worker.log())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    log = worker.log()
    ran = re.findall(done, log)
    assert len(ran) == 2, log
    for process in ran:
        warmed = log.find(f"INFO/{process}] warmed index {version}")
        assert 0 <= warmed < log.find(f"INFO/{process}] Task ticketrec.score_shard"), log

    engine = Recommender(settings)
    api = create_app({"TESTING": True, "TICKETREC_SETTINGS": settings, "TICKETREC_ENGINE": engine}).test_client()
    query = Query(tiny_model[1].queries[0].subject, tiny_model[1].queries[0].description)
    expected = [r.ticket.id for r in Recommender(settings.replace(broker_url="")).recommend(query, k=5)]
    up = engine.recommend(query, k=5)
    assert up.info.mode == "celery" and [r.ticket.id for r in up] == expected
    assert api.get("/api/v1/healthz").get_json()["status"] == "ok"

    redis.stop()
    attempts = _count_attempts(monkeypatch)
    first = engine.recommend(query, k=5)
    assert first.info.mode == "in-process" and first.info.fallback_reason.startswith("broker unreachable")
    assert [r.ticket.id for r in first] == expected
    for _ in range(3):
        down = engine.recommend(query, k=5)
        assert down.info.mode == "in-process" and [r.ticket.id for r in down] == expected
        assert down.info.fallback_reason.startswith("circuit open: broker unreachable"), down.info.fallback_reason
    assert len(attempts) == 1  # only the first query tried the dead broker
    health = api.get("/api/v1/healthz")
    body = health.get_json()
    assert health.status_code == 200 and body["status"] == "degraded"
    assert body["broker"]["breaker"]["state"] == "open" and body["broker"]["detail"].startswith("circuit open")
    assert "Degraded" in api.get("/status").get_data(as_text=True)
    assert worker.alive()

    redis.start()  # the same port: the worker reconnects by itself
    deadline = time.monotonic() + 60
    while not celery_client(redis.url).control.ping(timeout=0.5) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert worker.alive(), worker.log()
    back = None
    while time.monotonic() < deadline:
        back = engine.recommend(query, k=5)
        if back.info.mode == "celery":
            break
        time.sleep(BACKOFF / 4)
    assert back.info.mode == "celery" and back.info.fallback_reason is None, back.info
    assert [r.ticket.id for r in back] == expected and engine.breaker.state == "closed"
    assert api.get("/api/v1/healthz").get_json()["broker"]["breaker"] == {"state": "closed"}


def _count_attempts(monkeypatch) -> list:
    """Record every call of the distributed path (each one is a connection attempt to the broker)."""
    calls = []
    real = distributed.score_on_workers

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(distributed, "score_on_workers", spy)
    return calls


def _dead_broker() -> str:
    """A Redis URL on a port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"redis://127.0.0.1:{s.getsockname()[1]}/0"


def _zero_query(settings) -> dict:
    """A zero query vector for every key the current index's metric reads (packed for a score_shard task)."""
    from recommender.serving.index import open_current

    return distributed.zero_query(open_current(settings))
