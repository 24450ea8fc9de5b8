"""The floor of a Celery round trip on this machine: what the distributed path costs before ticketrec does any work.

A private redis-server and a Celery worker (prefork pool, 2 processes, as `ticketrec worker` runs) with one task
that does nothing; the client sends one such task alone (as the engine sends a pre-filtered query) or a group of 2
(as it fans a query out to 2 shards) and waits for the results, with the same result settings as
`serving.distributed.score_on_workers`. Timed from sending to every result in hand, after 10 untimed rounds; with
an empty payload and with 1,000 integers and 1,000 floats per task (a query's BM25 candidates and their scores),
either as JSON lists of numbers or packed as ticketrec sends them (`distributed.pack_array`), for the polling
intervals given.

    .venv/bin/python benchmarks/celery_floor.py [--groups 100] [--intervals 0.005,0.001]

Compare with the Celery rows of `benchmarks/serving.py` (docs/results/serving.md): in-process scoring of 1,000
candidates takes about 1.5 ms, so this floor is most of what the distributed path adds.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

APP = '''
import os
from celery import Celery

app = Celery("floor", broker=os.environ["FLOOR_URL"], backend=os.environ["FLOOR_URL"])
app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"],
                worker_prefetch_multiplier=1)


@app.task(name="floor.noop")
def noop(rows=None, scores=None):
    return {"n": len(rows or [])}
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=100, help="timed rounds per row (after 10 untimed)")
    ap.add_argument("--intervals", default="0.005,0.001", help="result polling intervals (s), comma-separated; "
                    "0.005 is ticketrec's")
    args = ap.parse_args()
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("error: redis-server is not installed (make system-deps)")
    work = Path(tempfile.mkdtemp(prefix="ticketrec-celery-floor-"))
    (work / "floorapp.py").write_text(APP)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"redis://127.0.0.1:{port}/0"
    os.environ["FLOOR_URL"] = url
    redis = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                              "--dir", str(work)], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "floorapp", "worker", "--concurrency", "2",
                               "--pool", "prefork", "--loglevel", "warning", "--without-gossip", "--without-mingle"],
                              cwd=work, env={**os.environ, "PYTHONPATH": str(work)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sys.path.insert(0, str(work))
    from celery import group
    from floorapp import app, noop

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import numpy as np

    from recommender.serving.distributed import pack_array

    rows = []
    try:
        deadline = time.monotonic() + 120
        while not app.control.ping(timeout=0.5):
            if time.monotonic() > deadline:
                raise SystemExit("error: the Celery worker did not start")
        ids, scores = np.arange(0, 10**6, 1000, dtype=np.int64), np.linspace(0.1, 9.9, 1000, dtype=np.float32)
        payloads = {"none": (),
                    "1,000 ids + 1,000 scores, JSON lists": (ids.tolist(), scores.tolist()),
                    "1,000 ids + 1,000 scores, packed": (pack_array(ids, np.int64), pack_array(scores, np.float32))}
        for interval in [float(x) for x in args.intervals.split(",") if x.strip()]:
            for tasks in (1, 2):
                for name, task_args in payloads.items():
                    load = os.getloadavg()[0]
                    times = []
                    for i in range(args.groups + 10):
                        started = time.perf_counter()
                        job = noop.s(*task_args) if tasks == 1 else group([noop.s(*task_args) for _ in range(tasks)])
                        result = job.apply_async()
                        result.get(timeout=10, interval=interval, propagate=True, disable_sync_subtasks=False)
                        if i >= 10:
                            times.append((time.perf_counter() - started) * 1000)
                        result.forget()
                    times.sort()
                    rows.append((interval, "1 task" if tasks == 1 else f"a group of {tasks}", name,
                                 statistics.median(times), times[int(0.95 * (len(times) - 1))], load))
    finally:
        worker.terminate()
        redis.terminate()
        worker.wait(30)
        redis.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nCelery round-trip floor: no-op tasks, prefork worker of 2 processes, private Redis; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {args.groups} timed rounds per row "
          "after 10 untimed\n")
    print("| result polling interval | tasks per round | payload per task | p50 ms | p95 ms | load (1 min) before |")
    print("|---|---|---|---|---|---|")
    for interval, tasks, name, p50, p95, load in rows:
        print(f"| {interval * 1000:g} ms | {tasks} | {name} | {p50:.1f} | {p95:.1f} | {load:.2f} |")
    print("Command: .venv/bin/python benchmarks/celery_floor.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
