"""First-query latency on a freshly started Celery worker, cold (its processes open the index on the first task)
vs warm (each process opens, maps and scores the current index version at start: `worker_process_init`).

    .venv/bin/python benchmarks/worker_warmup.py                   # 2,000 tickets, 3 runs per mode
    .venv/bin/python benchmarks/worker_warmup.py --runs 5 --home /tmp/warmup-home

A private redis-server on 127.0.0.1 and a demo-sized knowledge base built with the CLI into a temporary
TICKETREC_HOME (as benchmarks/load.py builds it: `synth`, `import`, `train` with few epochs, `index`). Each run
starts one worker (`--concurrency 2`, prefork, as `ticketrec worker`), waits until it answers a ping and then
`--settle` seconds more (a worker is rarely asked in its first second), and times the scoring step of the engine
(`AnswerInfo.timings["score"]`: two shards fanned out and merged) for the first query and a second one. "cold"
starts the same worker with the warm-up signal handler disconnected. Runs alternate cold and warm; medians and
ranges are printed with the machine's load average (other work on the same cores changes the figures).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from load import Process, build_home, load_queries, start_redis  # noqa: E402

#: Starts a worker like `ticketrec worker`; "cold" first disconnects the warm-up (everything else is the same).
LAUNCHER = """
import sys
from celery.signals import worker_process_init
import workers.celery_app as w
if sys.argv[1] == "cold":
    worker_process_init.disconnect(w.warm_worker_process)
w.app.worker_main(["worker", "--concurrency=2", "--loglevel=info", "--pool=prefork", "--without-gossip",
                   "--without-mingle", "--hostname=" + sys.argv[2]])
"""


def one_run(mode: str, n: int, env: dict, engine, queries, settle: float, log: Path) -> dict:
    """Start a worker in `mode`, time its first two queries, stop it."""
    from recommender.data.records import Query
    from recommender.serving.distributed import celery_client

    client = celery_client(engine.settings.broker_url)
    started = time.perf_counter()
    proc = Process([sys.executable, "-c", LAUNCHER, mode, f"warmup-{mode}-{n}-{os.getpid()}@%h"], log, env)
    try:
        while not client.control.ping(timeout=0.2):
            if proc.proc.poll() is not None or time.perf_counter() - started > 120:
                raise SystemExit(f"the {mode} worker did not come up; see {log}")
        ready = time.perf_counter() - started
        time.sleep(settle)
        times = []
        for q in queries[:2]:
            answer = engine.recommend(Query(q["subject"], q["description"]), k=10)
            if answer.info.mode != "celery":
                raise SystemExit(f"a {mode} query was answered in-process: {answer.info.fallback_reason}")
            times.append(answer.info.timings["score"] * 1000.0)
    finally:
        proc.stop(grace=30)
    return {"ready": ready, "first": times[0], "second": times[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tickets", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=3, help="runs per mode (cold and warm alternate)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between the worker's ping and the query")
    parser.add_argument("--home", type=Path, default=None, help="TICKETREC_HOME to reuse or keep (default: a temp one)")
    args = parser.parse_args()

    print(f"command: .venv/bin/python benchmarks/worker_warmup.py {' '.join(sys.argv[1:])}".rstrip(), flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="ticketrec-warmup-"))
    home = args.home or tmp / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKETREC_")}
    env.update({"TICKETREC_HOME": str(home), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TICKETREC_SHARDS": "2"})
    redis = None
    results: dict[str, list[dict]] = {"cold": [], "warm": []}
    try:
        kb = build_home(ROOT, home, env, args.tickets, args.queries, args.seed)
        queries = load_queries(kb)
        redis, url = start_redis(tmp)
        env["TICKETREC_BROKER_URL"] = url
        os.environ.update({k: v for k, v in env.items() if k.startswith("TICKETREC_")})
        from recommender.config import Settings
        from recommender.serving.engine import Recommender

        engine = Recommender(Settings.from_env().replace(query_deadline=120.0))  # never cut a cold query short
        engine.model_for(engine.index)  # the engine's own loading is not what is measured
        load_before = os.getloadavg()[0]
        for n in range(args.runs):
            for mode in ("cold", "warm"):
                run = one_run(mode, n, env, engine, queries, args.settle, tmp / f"worker-{mode}-{n}.log")
                results[mode].append(run)
                print(f"  {mode} run {n + 1}: ready {run['ready']:.1f} s, first query {run['first']:.0f} ms, "
                      f"second {run['second']:.0f} ms", flush=True)
        load_after = os.getloadavg()[0]
    finally:
        if redis is not None:
            redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\n{args.tickets} tickets, 2 shards, a worker with 2 prefork processes started anew per run, first query "
          f"{args.settle:g} s after its first ping answer; {args.runs} runs per mode")
    print(f"machine: {os.cpu_count()} CPU cores; 1-min load average {load_before:.1f} before, {load_after:.1f} after")
    print(f"{'mode':<6} {'worker ready s':>15} {'1st query score ms (range)':>28} {'2nd query score ms':>20}")
    for mode, runs in results.items():
        first = [r["first"] for r in runs]
        spread = f"{statistics.median(first):.0f} ({min(first):.0f}–{max(first):.0f})"
        print(f"{mode:<6} {statistics.median(r['ready'] for r in runs):15.1f} {spread:>28} "
              f"{statistics.median(r['second'] for r in runs):20.0f}")


if __name__ == "__main__":
    main()
