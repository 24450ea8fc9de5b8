"""gunicorn settings of the web app: `gunicorn --config python:web.gunicorn_conf [options] 'web:create_app()'`.

Each worker loads its engine (the index version, the model it carries, the query encoders) when it starts, before
it accepts a request (`post_worker_init`), so no query waits seconds for it; a worker that cannot load one still
starts and answers 503 saying why, as it would without this file. Command-line options (--workers, --threads,
--bind, --timeout) are given where gunicorn is started (docker-compose.yml, benchmarks/load.py).
"""
from __future__ import annotations

import threading
import time


def post_worker_init(worker) -> None:
    """Warm the worker's engine (`TicketrecServices.warm_up`); gunicorn's heartbeat goes on meanwhile, so a long
    load is not taken for a hung worker (--timeout)."""
    services = getattr(worker.wsgi, "extensions", {}).get("ticketrec")
    if services is None:  # not the ticketrec app (or wrapped in a middleware): nothing to warm
        return
    outcome: dict[str, object] = {}
    done = threading.Event()

    def warm() -> None:
        try:
            outcome["error"] = services.warm_up()
        except Exception as exc:  # logged; the worker serves anyway and each request says what is wrong
            outcome["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            done.set()

    started = time.perf_counter()
    threading.Thread(target=warm, name="ticketrec-warm-up", daemon=True).start()
    while not done.wait(1.0):
        worker.notify()
    if outcome.get("error"):
        worker.log.warning("ticketrec: nothing loaded at start (%s); queries will be answered 503 until it can be",
                           outcome["error"])
    else:
        worker.log.info("ticketrec: index and model loaded in %.1f s", time.perf_counter() - started)
