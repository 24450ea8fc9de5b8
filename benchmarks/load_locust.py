"""Load scenarios of the web API with locust (benchmarks/locustfile.py), headless on 127.0.0.1, and one table.

    .venv/bin/python benchmarks/load_locust.py                         # 2,000 tickets, 50 users, 60 s per scenario
    .venv/bin/python benchmarks/load_locust.py --seconds 30 --scenarios plain,reindex --first-runs 0

The knowledge base and the server are set up as benchmarks/load.py does (`build_home`, `Server`: gunicorn 2 workers
x 4 threads with web/gunicorn_conf.py), a fresh server per scenario:

- first request: the latency of the first POST sent once the server answers (GET /api/v1/openapi.json, which loads
  no engine), and the slowest of the next workers x threads concurrent ones, with the engine loaded lazily (gunicorn
  without web/gunicorn_conf.py: before) and at start (with it: after); `--first-runs` servers of each kind;
- plain: `--users` locust users posting without pause for `--seconds`;
- reindex: the same, with `ticketrec index --full` started halfway (a new index version is built and switched to
  under load; every answer must name an index version that exists and the model it carries);
- redis killed: a private redis-server, one Celery worker (`ticketrec worker --concurrency 2`) and the server with
  TICKETREC_BROKER_URL set; redis-server is killed (SIGKILL) halfway and answers must keep coming, in-process.

Locust's CSV files (rewritten every 2 s during a run) and the logs go to a temporary directory (`--keep DIR` keeps
them); the table is made of the final figures the locustfile writes when locust quits. Every process this script
starts runs in its own process group and is stopped when it ends, also on Ctrl-C, SIGTERM or an error. The table
gives the 1-min load average before and after each run: the machine's other work changes the figures. `--home DIR`
reuses (or keeps) the knowledge base of an earlier run.
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from load import Process, Server, build_home, load_queries, start_redis  # noqa: E402

RECOMMEND = "/api/v1/recommendations"
SCENARIOS = ("plain", "reindex", "redis")


def post(port: int, body: dict, timeout: float = 120.0) -> tuple[int, dict, float]:
    """(status, JSON answer, seconds) of one POST to the recommendations API on its own connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    started = time.perf_counter()
    try:
        conn.request("POST", RECOMMEND, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        took = time.perf_counter() - started
        return resp.status, (json.loads(data) if data else {}), took
    finally:
        conn.close()


def get_json(port: int, path: str, timeout: float = 30.0) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def wait_answering(server: Server, timeout: float = 120.0) -> float:
    """Seconds from the server's launch until it answers GET /api/v1/openapi.json (a route that loads no engine)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {server.proc.returncode}; see {server.log.name}")
        with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
            if get_json(server.port, "/api/v1/openapi.json", timeout=60)[0] == 200:
                return time.perf_counter() - server.started
        time.sleep(0.05)
    raise RuntimeError(f"gunicorn did not answer within {timeout:.0f} s; see {server.log.name}")


def first_requests(out: Path, env: dict, args, queries: list[dict], lazy: bool, run: int) -> dict:
    """Start a server, time its first request and then a burst of workers x threads concurrent ones, stop it."""
    log = out / f"gunicorn-first-{run}-{'lazy' if lazy else 'at-start'}.log"
    server = Server(ROOT, env, args.workers, args.threads, log, lazy=lazy)
    try:
        ready = wait_answering(server)
        status, _, first = post(server.port, queries[run % len(queries)])
        burst = [None] * (args.workers * args.threads)

        def one(i: int) -> None:
            burst[i] = post(server.port, queries[(run + 1 + i) % len(queries)])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(burst))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        server.stop()
    statuses = [status] + [b[0] for b in burst if b is not None]
    return {"ready": ready, "first": first, "burst_max": max(b[2] for b in burst if b is not None),
            "failures": sum(s != 200 for s in statuses), "requests": len(statuses)}


def wait_workers(server: Server, timeout: float = 180.0) -> list[str]:
    """The Celery workers the server's health check pings, once there is at least one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
            broker = get_json(server.port, "/api/v1/healthz", timeout=60)[1].get("broker", {})
            if broker.get("workers"):
                return broker["workers"]
        time.sleep(0.5)
    raise RuntimeError("no Celery worker answered the server's ping; see worker.log")


def run_locust(port: int, kb: Path, home: Path, out: Path, name: str, users: int, seconds: float, env: dict,
               event=None, event_at: float = 0.5) -> dict:
    """Run the locustfile headless against 127.0.0.1:`port`; `event()` is called `event_at` of the way through.
    Returns the CSV figures of the recommendations and ticket reads, the locustfile's summary and the event's."""
    prefix = out / name
    command = [str(BIN / "locust"), "-f", str(ROOT / "benchmarks" / "locustfile.py"), "--headless",
               "--host", f"http://127.0.0.1:{port}", "--users", str(users), "--spawn-rate", str(users),
               "--run-time", f"{int(seconds)}s", "--stop-timeout", "30", "--csv", str(prefix), "--only-summary",
               "--loglevel", "WARNING", "--exit-code-on-error", "0", "--kb", str(kb),
               "--index-dir", str(home / "indexes"), "--summary", f"{prefix}-summary.json"]
    load_before = os.getloadavg()[0]
    locust = Process(command, out / f"{name}-locust.log", env)
    happened = None
    try:
        if event is not None:
            time.sleep(seconds * event_at)
            happened = event()
        locust.proc.wait(timeout=seconds + 120)
    finally:
        locust.stop()
    load_after = os.getloadavg()[0]
    if locust.proc.returncode:
        raise RuntimeError(f"locust exited with {locust.proc.returncode}; see {locust.log.name}")
    summary = json.loads(Path(f"{prefix}-summary.json").read_text())
    return {"summary": summary, "event": happened, "load": (load_before, load_after)}


def reindex_event(env: dict, out: Path, stack: contextlib.ExitStack):
    """The event that starts `ticketrec index --full` in the background (stopped with everything else); its
    result holds the process and, once it ended, `ended` (perf_counter seconds)."""
    def start() -> dict:
        state = {"started": time.perf_counter()}
        proc = state["process"] = Process([sys.executable, "-m", "recommender.cli", "index", "--full"],
                                          out / "reindex.log", env)
        stack.callback(proc.stop)

        def watch() -> None:
            proc.proc.wait()
            state["ended"] = time.perf_counter()

        threading.Thread(target=watch, daemon=True).start()
        return state
    return start


def table_row(name: str, result: dict, note: str) -> list[str]:
    summary = result["summary"]
    stats = summary["stats"]
    rec = stats.get(RECOMMEND, {"requests": 0, "p50": float("nan"), "p95": float("nan"), "p99": float("nan")})
    read = stats.get("/api/v1/tickets/[id]", {"requests": 0})
    total = stats["Aggregated"]
    mixed = sum(v for k, v in summary["failures"].items() if "version" in k)
    return [name, f"{rec['requests']:,}", f"{read['requests']:,}", f"{total['failures']:,}", f"{total['rps']:.1f}",
            *(f"{rec[q]:.0f}" for q in ("p50", "p95", "p99")), str(len(summary["index_versions"])), str(mixed),
            f"{result['load'][0]:.1f} → {result['load'][1]:.1f}", note]


def modes_note(summary: dict) -> str:
    return "; ".join(f"{mode}: {n:,}" for mode, n in sorted(summary["modes"].items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tickets", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of load per scenario")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=4, help="gunicorn threads per worker")
    parser.add_argument("--first-runs", type=int, default=3, help="servers started per kind to time first requests")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    parser.add_argument("--home", type=Path, default=None, help="TICKETREC_HOME to reuse or keep (default: a temp one)")
    parser.add_argument("--keep", type=Path, default=None, help="folder to keep locust's CSV files and the logs in")
    args = parser.parse_args()
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = sorted(set(scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up below, as on Ctrl-C
    print(f"command: .venv/bin/python benchmarks/load_locust.py {' '.join(sys.argv[1:])}".rstrip(), flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="ticketrec-locust-"))
    home = args.home or tmp / "home"
    out = args.keep or tmp / "out"
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKETREC_")}
    env.update({"TICKETREC_HOME": str(home), "TICKETREC_SECRET_KEY": "load-benchmark", "OMP_NUM_THREADS": "1",
                "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    table: list[list[str]] = []
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        kb = build_home(ROOT, home, env, args.tickets, args.queries, args.seed)
        queries = load_queries(kb)

        firsts: dict[bool, list[dict]] = {True: [], False: []}
        for run in range(args.first_runs):
            for lazy in (True, False):
                firsts[lazy].append(first_requests(out, env, args, queries, lazy, run))
                f = firsts[lazy][-1]
                print(f"  first request ({'lazy load' if lazy else 'load at start'}) run {run + 1}: server answering "
                      f"{f['ready']:.1f} s after launch, first request {f['first']:.2f} s, slowest of the next "
                      f"{args.workers * args.threads} {f['burst_max']:.2f} s", flush=True)
        for lazy in (True, False) if args.first_runs else ():
            runs = firsts[lazy]
            first = [r["first"] for r in runs]
            burst = [r["burst_max"] for r in runs]
            ready = [r["ready"] for r in runs]
            table.append([f"first request after start, {'lazy load (before)' if lazy else 'load at start (after)'}",
                          str(sum(r["requests"] for r in runs)), "–", str(sum(r["failures"] for r in runs)), "–",
                          f"{statistics.median(first) * 1000:.0f}", "–", "–", "–", "–", "–",
                          f"{len(runs)} servers: first request {min(first):.2f}–{max(first):.2f} s, slowest of the "
                          f"next {args.workers * args.threads} {min(burst):.2f}–{max(burst):.2f} s; answering "
                          f"{min(ready):.1f}–{max(ready):.1f} s after launch"])

        for scenario in scenarios:
            scenario_env = dict(env)
            worker = redis = None
            if scenario == "redis":
                redis, url = start_redis(tmp)
                stack.callback(redis.stop)
                scenario_env.update({"TICKETREC_BROKER_URL": url, "TICKETREC_SHARDS": "2"})
                worker = Process([sys.executable, "-m", "recommender.cli", "worker", "--concurrency", "2",
                                  "--loglevel", "warning", "--hostname", f"load-locust-{os.getpid()}@%h"],
                                 out / "worker.log", scenario_env)
                stack.callback(worker.stop)
            server = Server(ROOT, scenario_env, args.workers, args.threads, out / f"gunicorn-{scenario}.log")
            stack.callback(server.stop)
            wait_answering(server)
            if worker is not None:
                print(f"  Celery workers: {', '.join(wait_workers(server))}", flush=True)
            before = sorted(p.name for p in (home / "indexes").iterdir() if (p / "manifest.json").exists())
            event = None
            if scenario == "reindex":
                event = reindex_event(scenario_env, out, stack)
            elif scenario == "redis":
                def event(redis=redis) -> dict:
                    redis.kill()
                    return {"killed_at": time.perf_counter()}
            print(f"  scenario {scenario}: {args.users} users for {args.seconds:.0f} s ...", flush=True)
            result = run_locust(server.port, kb, home, out, scenario, args.users, args.seconds, scenario_env, event)
            server.stop()
            summary = result["summary"]
            if scenario == "plain":
                table.append(table_row("plain", result, modes_note(summary)))
            elif scenario == "reindex":
                proc = result["event"]["process"]
                during = "ended during the run" if "ended" in result["event"] else "still running when the run ended"
                rc = proc.proc.wait(timeout=600)
                while "ended" not in result["event"]:
                    time.sleep(0.05)
                took = result["event"]["ended"] - result["event"]["started"]
                proc.stop()
                after = sorted(p.name for p in (home / "indexes").iterdir() if (p / "manifest.json").exists())
                new = sorted(set(after) - set(before))
                served = ", ".join(f"{v}: {n:,}" for v, n in sorted(summary["index_versions"].items()))
                state = (f"`ticketrec index --full` exit {rc} after {took:.0f} s ({during}), new version "
                         f"{', '.join(new) or 'none'}")
                table.append(table_row("reindex halfway", result, f"{state}; answers per version {served}"))
            else:
                worker.stop()
                reasons = "; ".join(r[:90] for r in summary["fallback_reasons"][:1])
                table.append(table_row("Redis killed halfway (Celery, 2 shards)", result,
                                       f"answers by mode {modes_note(summary)}; first fallback reason: {reasons}"))

    header = ["scenario", "recommendations", "ticket reads", "failures", "req/s", "p50 ms", "p95 ms", "p99 ms",
              "index versions", "mixed versions", "load avg", "notes"]
    print(f"\nserver: gunicorn {args.workers} workers x {args.threads} threads on 127.0.0.1 (web/gunicorn_conf.py), "
          f"{args.tickets:,} tickets; locust {args.users} users, no think time, {args.seconds:.0f} s per scenario; "
          f"{os.cpu_count()} CPU cores shared by server, workers and locust; percentiles of the recommendations, "
          f"failures and req/s of all requests; load avg = 1-min load average before → after")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in table:
        print("| " + " | ".join(row) + " |")
    print(f"\nreproduce: .venv/bin/python benchmarks/load_locust.py {' '.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # everything it started was stopped on the way out (ExitStack)
        sys.exit("interrupted; the servers, workers and locust it started are stopped")
