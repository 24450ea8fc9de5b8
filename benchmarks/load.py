"""Load benchmark of the web API: gunicorn (2 workers x 4 threads) over a demo-sized synthetic knowledge base,
N client threads posting to /api/v1/recommendations for a bounded time; requests/s, latency percentiles, errors.

    .venv/bin/python benchmarks/load.py                       # 2,000 tickets, 50 clients, 30 s
    .venv/bin/python benchmarks/load.py --clients 20 --seconds 10

The knowledge base is built with the CLI into a temporary TICKETREC_HOME (`ticketrec synth`, `import`, `train`
with the product's default architecture but few epochs, `index`); its quality does not matter here, its shape
does. `--home DIR` reuses (or keeps) a home set up by an earlier run instead of the temporary one; `--code DIR` runs
the setup and the server from another copy of the code (e.g. a snapshot taken before a change), so two versions
can be measured in turn on the same machine. gunicorn runs with the project's settings (web/gunicorn_conf.py: each
worker loads the index and model as it starts) where that code has them; `--lazy-load` leaves them out (each worker
loads on its first request). The server and everything else this script starts are stopped when
it ends, also on Ctrl-C or an error. The machine's load average is printed beside the table: other work on the
same cores changes the figures.
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
#: Training overrides: the product's default dimensions (h 50, E 350, T 100, BM25), few epochs (speed only).
TRAIN_CONFIG = {"epochs": 1, "w2v_epochs": 2, "topic_epochs": 2, "weights": "fixed"}


def _ticketrec(code: Path, env: dict, *args: str) -> None:
    """One CLI command of the code in `code` (python -m puts that directory first on the path)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "recommender.cli", *args], cwd=code, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise RuntimeError(f"ticketrec {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    print(f"  ticketrec {' '.join(args[:2])} ... {time.perf_counter() - started:.1f} s", flush=True)


def build_home(code: Path, home: Path, env: dict, tickets: int, queries: int, seed: int) -> Path:
    """Synthetic KB → store → model → index, all with the CLI; returns the JSONL file (its queries are the load)."""
    kb = home / "kb.jsonl"
    if (home / "indexes" / "CURRENT").exists() and kb.exists():
        print(f"reusing {home}")
        return kb
    home.mkdir(parents=True, exist_ok=True)
    print(f"setting up {home}")
    (home / "train-config.json").write_text(json.dumps(TRAIN_CONFIG))
    _ticketrec(code, env, "synth", "--tickets", str(tickets), "--queries", str(queries), "--seed", str(seed),
               "--out", str(kb))
    _ticketrec(code, env, "import", str(kb), "--quiet")
    _ticketrec(code, env, "train", "--train", str(kb), "--out", str(home / "models" / "current"), "--preset", "default",
               "--config", str(home / "train-config.json"), "--seed", str(seed))
    _ticketrec(code, env, "index")
    return kb


def load_queries(kb: Path) -> list[dict]:
    out = []
    with open(kb, encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec.get("type") == "query":
                out.append({"subject": rec["subject"], "description": rec["description"], "k": 10})
    if not out:
        raise SystemExit(f"no queries found in {kb}")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gunicorn_options(code: Path, lazy: bool = False) -> list[str]:
    """The project's gunicorn settings (web/gunicorn_conf.py, where `code` has it, unless `lazy`) and no control
    socket (gunicorn 27+; several benchmark servers must not share one)."""
    import gunicorn

    project = not lazy and (code / "web" / "gunicorn_conf.py").exists()
    options = ["--config", "python:web.gunicorn_conf"] if project else []
    return options + (["--no-control-socket"] if gunicorn.version_info >= (27,) else [])


class Process:
    """A child in its own process group (Ctrl-C reaches only this script), stopped group-wide by `stop`."""

    def __init__(self, command: list[str], log: Path, env: dict, cwd: Path = ROOT):
        self.command = command
        self.log = open(log, "w")
        self.proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def kill(self) -> None:
        """SIGKILL the group now (a crash, not a shutdown)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the group, SIGKILL it after `grace` seconds."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill()
            except ProcessLookupError:
                pass
        self.log.close()


def start_redis(workdir: Path) -> tuple[Process, str]:
    """A private redis-server on 127.0.0.1 (no persistence); its URL."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    proc = Process([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                    "--dir", str(workdir)], workdir / "redis.log", os.environ.copy(), cwd=workdir)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc, f"redis://127.0.0.1:{port}/0"
        time.sleep(0.05)
    proc.stop()
    raise SystemExit(f"redis-server did not start; see {workdir / 'redis.log'}")


class Server:
    """gunicorn 'web:create_app()' in its own process group, stopped (group-wide) by `stop`; `lazy`: without
    web/gunicorn_conf.py (each worker loads the engine on its first request instead of at start)."""

    def __init__(self, code: Path, env: dict, workers: int, threads: int, log: Path, lazy: bool = False):
        self.port = free_port()
        self.started = time.perf_counter()
        self.log = open(log, "w")
        self.command = [str(BIN / "gunicorn"), *gunicorn_options(code, lazy), "--bind", f"127.0.0.1:{self.port}",
                        "--workers", str(workers), "--threads", str(threads), "--timeout", "60", "web:create_app()"]
        self.proc = subprocess.Popen(self.command, cwd=code, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {self.proc.returncode}; see {self.log.name}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                conn.request("GET", "/api/v1/healthz")
                status = conn.getresponse().status
                conn.close()
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"gunicorn did not answer /api/v1/healthz within {timeout:.0f} s; see {self.log.name}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        self.log.close()


def run_load(port: int, queries: list[dict], clients: int, seconds: float) -> dict:
    """`clients` threads, each with its own keep-alive connection, post queries until the time is up."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    statuses: dict[str, int] = {}
    lock = threading.Lock()
    start = threading.Event()
    stop_at = [0.0]

    def client(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        j = i
        start.wait()
        while time.perf_counter() < stop_at[0]:
            body = json.dumps(queries[j % len(queries)])
            j += clients
            t0 = time.perf_counter()
            try:
                conn.request("POST", "/api/v1/recommendations", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                status = resp.status
            except (OSError, http.client.HTTPException) as exc:
                status = type(exc).__name__
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            if status == 200:
                latencies[i].append(time.perf_counter() - t0)
            else:
                errors[i] += 1
                with lock:
                    statuses[str(status)] = statuses.get(str(status), 0) + 1
        conn.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    began = time.perf_counter()
    stop_at[0] = began + seconds
    start.set()
    for t in threads:
        t.join(timeout=seconds + 90)
    wall = time.perf_counter() - began
    lat = np.array([x for part in latencies for x in part]) * 1000.0
    return {"ok": int(lat.size), "errors": int(sum(errors)), "statuses": statuses, "wall": wall,
            "rps": lat.size / wall, **{f"p{q}": float(np.percentile(lat, q)) if lat.size else float("nan")
                                        for q in (50, 95, 99)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tickets", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before the measured run")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=4, help="gunicorn threads per worker")
    parser.add_argument("--home", type=Path, default=None, help="TICKETREC_HOME to reuse or keep (default: a temp one)")
    parser.add_argument("--code", type=Path, default=ROOT, help="directory holding the recommender/ and web/ to run")
    parser.add_argument("--lazy-load", action="store_true",
                        help="start gunicorn without web/gunicorn_conf.py (engines load on their first request)")
    args = parser.parse_args()

    print(f"command: .venv/bin/python benchmarks/load.py {' '.join(sys.argv[1:])}".rstrip(), flush=True)
    tmp = None if args.home else Path(tempfile.mkdtemp(prefix="ticketrec-load-"))
    home = args.home or tmp / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKETREC_")}
    env.update({"TICKETREC_HOME": str(home), "TICKETREC_SECRET_KEY": "load-benchmark", "OMP_NUM_THREADS": "1",
                "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    server = None
    try:
        kb = build_home(args.code.resolve(), home, env, args.tickets, args.queries, args.seed)
        queries = load_queries(kb)
        server = Server(args.code.resolve(), env, args.workers, args.threads, home / "gunicorn.log", args.lazy_load)
        server.wait_ready()
        if args.warmup > 0:  # every worker loads its engine and maps the index before the clock starts
            run_load(server.port, queries, min(args.clients, 2 * args.workers * args.threads), args.warmup)
        load_before = os.getloadavg()[0]
        result = run_load(server.port, queries, args.clients, args.seconds)
        load_after = os.getloadavg()[0]
    finally:
        if server is not None:
            server.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    print(f"\nserver: gunicorn {args.workers} workers x {args.threads} threads on 127.0.0.1, {args.tickets} tickets; "
          f"{args.clients} client threads for {result['wall']:.1f} s; code from {args.code}")
    print(f"machine: {os.cpu_count()} CPU cores (server and clients share them); 1-min load average "
          f"{load_before:.1f} before the run, {load_after:.1f} after")
    print(f"{'requests/s':>10}  {'p50 ms':>8}  {'p95 ms':>8}  {'p99 ms':>8}  {'ok':>6}  {'errors':>6}")
    print(f"{result['rps']:10.1f}  {result['p50']:8.1f}  {result['p95']:8.1f}  {result['p99']:8.1f}  "
          f"{result['ok']:6d}  {result['errors']:6d}")
    if result["statuses"]:
        print("errors by status: " + ", ".join(f"{k}: {v}" for k, v in sorted(result["statuses"].items())))


if __name__ == "__main__":
    main()
