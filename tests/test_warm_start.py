"""Load at start (issue 14): under gunicorn with web/gunicorn_conf.py each worker loads its index and model before it
accepts a request, so the first query does not pay for it; a worker that cannot load one still serves and says why."""
import http.client
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import free_port, stop_process
from web import create_app, gunicorn_conf

ROOT = Path(__file__).resolve().parents[1]
GUNICORN = Path(sys.executable).parent / "gunicorn"


class _Worker:
    """What `post_worker_init` uses of a gunicorn worker: the loaded app, the heartbeat and the log."""

    def __init__(self, wsgi):
        self.wsgi = wsgi
        self.log = logging.getLogger("test-gunicorn-worker")
        self.beats = 0

    def notify(self) -> None:
        self.beats += 1


def test_warm_up_loads_the_index_and_the_model_before_any_request(web_engine):
    settings, _ = web_engine
    app = create_app({"TICKETREC_SETTINGS": settings, "TESTING": True})
    services = app.extensions["ticketrec"]
    assert services._engine is None  # nothing is loaded by building the app
    assert services.warm_up() is None
    engine = services._engine
    assert engine is not None and engine._index is not None  # the version is open, its model loaded
    assert engine.model_for(engine._index) is not None


_CELERY_RACE = """
import sys, threading
from web import create_app
from recommender.config import Settings
settings = Settings.from_env().replace(broker_url="redis://127.0.0.1:1/0")  # nothing listens: no connection is made
assert create_app({"TICKETREC_SETTINGS": settings}).extensions["ticketrec"].warm_up() is None
assert "celery" in sys.modules
errors, start = [], threading.Barrier(8)
def first_query():  # what score_on_workers imports, in 8 request threads at once
    start.wait()
    try:
        from celery import group
        from celery.exceptions import TimeoutError
    except ImportError as exc:
        errors.append(str(exc))
threads = [threading.Thread(target=first_query) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print(len(errors), errors[:1])
"""


def test_warm_up_with_a_broker_imports_the_celery_client_before_the_request_threads(web_engine):
    """Without it, first queries importing celery at once failed with "cannot import name 'group'" (a 500 each)
    about half the time in a fresh process; each run is one."""
    settings, _ = web_engine
    env = {**os.environ, "TICKETREC_HOME": str(settings.home), "TICKETREC_CANDIDATES": "0"}
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", _CELERY_RACE], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == "0 []", done.stdout


def test_warm_up_without_an_index_says_why_and_the_app_still_answers(make_web_app):
    app = make_web_app()
    why = app.extensions["ticketrec"].warm_up()
    assert why and "ticketrec index" in why
    resp = app.test_client().post("/api/v1/recommendations", json={"subject": "valve", "description": "leaks"})
    assert resp.status_code == 503 and "ticketrec index" in resp.get_json()["error"]["message"]


def test_the_gunicorn_hook_warms_the_app_and_logs_it(web_engine, caplog):
    settings, _ = web_engine
    worker = _Worker(create_app({"TICKETREC_SETTINGS": settings, "TESTING": True}))
    with caplog.at_level(logging.INFO, logger="test-gunicorn-worker"):
        gunicorn_conf.post_worker_init(worker)
    assert worker.wsgi.extensions["ticketrec"]._engine._index is not None
    assert "index and model loaded" in caplog.text


def test_the_gunicorn_hook_logs_why_nothing_loaded(make_web_app, caplog):
    worker = _Worker(make_web_app())
    with caplog.at_level(logging.INFO, logger="test-gunicorn-worker"):
        gunicorn_conf.post_worker_init(worker)
    assert "nothing loaded at start" in caplog.text and "ticketrec index" in caplog.text


def test_the_gunicorn_hook_leaves_other_apps_alone():
    gunicorn_conf.post_worker_init(_Worker(lambda environ, start_response: []))  # a bare WSGI callable: no error


def test_gunicorn_with_the_project_config_loads_before_the_first_request(web_engine, tmp_path):
    """A real gunicorn on 127.0.0.1: its worker logs the load before any request was sent, then answers."""
    settings, _ = web_engine
    port = free_port()
    log = tmp_path / "gunicorn.log"
    env = {**os.environ, "TICKETREC_HOME": str(settings.home), "TICKETREC_CANDIDATES": "0",
           "TICKETREC_MAX_DESCRIPTION": "500", "TICKETREC_SECRET_KEY": "test", "TICKETREC_BROKER_URL": ""}
    with open(log, "w") as out:
        server = subprocess.Popen([str(GUNICORN), "--config", "python:web.gunicorn_conf", "--bind", f"127.0.0.1:{port}",
                                   "--workers", "1", "--threads", "2", "web:create_app()"], cwd=ROOT, env=env,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "index and model loaded" not in log.read_text():
            assert server.poll() is None, f"gunicorn exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"no load logged at start: {log.read_text()[-2000:]}"
            time.sleep(0.1)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/api/v1/recommendations", json.dumps({"subject": "valve leak", "description":
                     "The valve seal leaks at pressure."}), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        body = json.loads(resp.read())
        conn.close()
        assert resp.status == 200 and body["results"], body
    finally:
        stop_process(server)
    assert "Traceback" not in log.read_text()


@pytest.mark.parametrize("lazy", [False, True])
def test_the_load_benchmark_starts_gunicorn_with_the_project_config_unless_lazy(lazy):
    from load import gunicorn_options  # benchmarks/load.py
    options = gunicorn_options(ROOT, lazy=lazy)
    assert ("python:web.gunicorn_conf" in options) is not lazy
