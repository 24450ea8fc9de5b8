"""Serving benchmark: index build rate, query latency (in-process and through Celery), exhaustive scoring throughput
against the machine's memory-scan rate, and the precomputed path against the naive one (re-encoding candidates).

    .venv/bin/python benchmarks/serving.py                      # 10k, 100k and 1M tickets (one table)
    .venv/bin/python benchmarks/serving.py --sizes 10000,100000 --queries 30

Every size is a real synthetic knowledge base from `recommender.data.synthetic.generate`: imported into the store,
encoded and indexed (vectors and BM25 postings), then queried. The model has the paper's dimensions (h 50, E 350,
T 100) and is trained briefly on a small synthetic set: its quality does not matter here, its shape does. Torch
and BLAS run one thread per process; the build encodes in one process per core (TICKETREC_INDEX_WORKERS).
The default pre-filter is the index's own BM25 postings; the FTS5 column times the store's FTS5 pre-filter
alone on the same queries, for comparison.
"""
from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recommender.config import Settings  # noqa: E402
from recommender.data.records import Query  # noqa: E402


def percentile(values, q) -> float:
    return float(np.percentile(np.asarray(values) * 1000.0, q))


def train_bench_model(out: Path, seed: int) -> Path:
    """A model with the paper's dimensions, trained briefly (serving speed depends on its shape only)."""
    import torch

    from recommender.model.siamese import SiameseConfig
    from recommender.data.synthetic import generate
    from recommender.model.training import train_model

    torch.set_num_threads(1)
    data = generate(n_tickets=1500, n_queries=150, seed=seed)
    config = SiameseConfig.preset("ml_cl_hET", epochs=1, topic_epochs=2, w2v_epochs=2)
    train_model(data, None, config, out, seed=seed, progress=True)
    return out


class CeleryCluster:
    """A private redis-server and one `ticketrec worker --concurrency 2` for the Celery rows."""

    def __init__(self, env: dict, workdir: Path):
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{port}/0"
        self.redis = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                       "no", "--dir", str(workdir)], stdout=subprocess.DEVNULL)
        time.sleep(0.5)
        self.log = open(workdir / "worker.log", "w")
        self.worker = subprocess.Popen([sys.executable, "-m", "recommender.cli", "worker", "--concurrency", "2",
                                        "--loglevel", "warning", "--hostname", f"bench{os.getpid()}@%h"],
                                       cwd=ROOT, env={**os.environ, **env, "TICKETREC_BROKER_URL": self.url},
                                       stdout=self.log, stderr=subprocess.STDOUT)
        from recommender.serving.distributed import celery_client

        client = celery_client(self.url)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if client.control.ping(timeout=0.5):
                return
        self.close()
        raise RuntimeError(f"the Celery worker did not start; see {workdir / 'worker.log'}")

    def close(self) -> None:
        for proc in (self.worker, self.redis):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.log.close()


WARMUP = 5  # untimed queries before timing: a serving process is long-running (warm memory maps, numba, caches)


def time_queries(engine, queries, k=10) -> tuple[list[float], dict, dict]:
    """(seconds per query, answering modes, median ms per stage) after WARMUP untimed queries."""
    for q in queries[:WARMUP]:
        engine.recommend(q, k=k)
    times, modes, stages = [], {}, {}
    for q in queries:
        t = time.perf_counter()
        info = engine.recommend(q, k=k).info
        times.append(time.perf_counter() - t)
        modes[info.mode] = modes.get(info.mode, 0) + 1
        if info.fallback_reason:
            modes["fallback_reason"] = info.fallback_reason
        for stage, seconds in info.timings.items():
            stages.setdefault(stage, []).append(seconds * 1000.0)
    return times, modes, {stage: round(float(np.median(v)), 1) for stage, v in stages.items()}


def scan_rates(index, spec, query_vecs, repeats=3) -> tuple[float, float]:
    """(exhaustive scoring tickets/s, numpy-sum memory scan tickets/s) over the same matrices, best of `repeats`."""
    from recommender.serving.scoring import score_candidates

    keys = {f"{b}.{c}" for _, b, _ in spec["pairs"] for c in spec["channels"]}
    if keys != set(index.vectors):
        raise RuntimeError(f"the metric reads {sorted(keys)}, the index holds {sorted(index.vectors)}: the scan "
                           "over the whole packed matrix would not be the same bytes")
    matrix = np.asarray(index.vectors.matrix)
    n = len(index)
    index.warm()
    score_t = min(_timed(lambda: score_candidates(spec, query_vecs, index.vectors)) for _ in range(repeats))
    scan_t = min(_timed(lambda: float(matrix.sum())) for _ in range(repeats))
    return n / score_t, n / scan_t


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def naive_vs_precomputed(engine, queries, k_candidates: int) -> tuple[float, float]:
    """Seconds per query of scoring K candidates: naive (fetch + re-encode + score) vs precomputed rows."""
    from recommender.serving.scoring import score_candidates

    model, index, store = engine.model, engine.index, engine.store
    qv0 = model.encode_queries([queries[0]])
    score_candidates(index.metric_spec, qv0, index.vectors, np.arange(min(10, len(index))))  # warm (numba)
    model.encode_tickets(store.get_tickets(index.ticket_ids[:64]))  # warm the naive path too
    naive, fast = [], []
    for q in queries:
        qv = model.encode_queries([q])
        hits = engine.searcher.search(f"{q.subject}\n{q.description}", k_candidates)
        ids = [tid for tid, _ in hits]
        bm25 = np.array([s for _, s in hits], np.float32)
        rows, pos = index.rows_for(ids)
        score_candidates(index.metric_spec, qv, index.vectors, rows, bm25[pos])  # untimed: warm these rows' pages
        t = time.perf_counter()
        score_candidates(index.metric_spec, qv, index.vectors, rows, bm25[pos])
        fast.append(time.perf_counter() - t)
        t = time.perf_counter()
        tickets = store.get_tickets(ids)
        tv = model.encode_tickets(tickets)
        reps = {key: np.repeat(v, len(tickets), axis=0) for key, v in qv.items()}
        model.score_encoded(reps, tv, bm25 / max(float(bm25.max()), 1e-9))
        naive.append(time.perf_counter() - t)
    return float(np.median(naive)), float(np.median(fast))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000", help="comma-separated knowledge-base sizes")
    ap.add_argument("--queries", type=int, default=50, help="timed queries per row")
    ap.add_argument("--naive-queries", type=int, default=3, help="queries for the naive path (slow)")
    ap.add_argument("--no-celery", action="store_true", help="skip the Celery rows")
    ap.add_argument("--build-workers", type=int, default=None,
                    help="encoding processes of the index build (default: one per core, as `ticketrec index`)")
    ap.add_argument("--fts5-queries", type=int, default=10, help="queries timed on the FTS5 pre-filter alone")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--workdir", default=None, help="where homes are built (default: a temp dir, deleted)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from recommender.serving.engine import Recommender
    from recommender.serving.index import build_index, open_current
    from recommender.model.bundle import TicketModel
    from recommender.lexical.searchers import Fts5Searcher
    from recommender.serving.scoring import HAVE_NUMBA
    from recommender.data.store import Dataset, Store
    from recommender.data.synthetic import generate

    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ticketrec-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"workdir {workdir}; numba {'on' if HAVE_NUMBA else 'OFF (numpy fallback)'}", file=sys.stderr)
    model_dir = train_bench_model(workdir / "model", args.seed)
    model = TicketModel.load(model_dir)
    queries_ds = generate(n_tickets=200, n_queries=max(args.queries, args.naive_queries, 2), seed=args.seed + 1)
    queries = [Query(q.subject, q.description) for q in queries_ds.queries][: args.queries]

    rows_out = []
    try:
        for n in sizes:
            home = workdir / f"home-{n}"
            env = {"TICKETREC_HOME": str(home), "TICKETREC_MODEL": str(model_dir)}
            settings = Settings.from_env(env)
            store = Store(settings.db)
            print(f"generating and importing {n:,} tickets", file=sys.stderr)
            tickets = generate(n_tickets=n, n_queries=0, seed=args.seed).tickets
            t = time.perf_counter()
            store.import_dataset(Dataset(tickets, source="bench"))
            import_rate = n / (time.perf_counter() - t)
            del tickets
            store.close()
            store = Store(settings.db)
            t = time.perf_counter()
            build_index(store, model, settings, incremental=False, progress=True, workers=args.build_workers)
            rate = n / (time.perf_counter() - t)
            workers = args.build_workers or settings.encoding_processes
            row = {"tickets": n, "import": import_rate, "build": rate, "build_workers": workers}
            fts5 = Fts5Searcher(store)
            fts5_times = []
            for q in queries[: args.fts5_queries]:
                t = time.perf_counter()
                fts5.search(f"{q.subject}\n{q.description}", 1000)
                fts5_times.append(time.perf_counter() - t)
            row["fts5_p50"] = percentile(fts5_times, 50)
            for k_cand in (1000, 0):
                engine = Recommender(settings.replace(candidates=k_cand), store=store, model=model)
                times, _, stages = time_queries(engine, queries)
                row[f"p50_K{k_cand}"], row[f"p95_K{k_cand}"] = percentile(times, 50), percentile(times, 95)
                row[f"stages_K{k_cand}"] = stages
            engine = Recommender(settings.replace(candidates=0), store=store, model=model)
            index = open_current(settings)
            qv = model.encode_queries([queries[0]])
            row["score_rate"], row["scan_rate"] = scan_rates(index, index.metric_spec, qv)
            engine1000 = Recommender(settings.replace(candidates=1000), store=store, model=model)
            row["naive_s"], row["fast_s"] = naive_vs_precomputed(engine1000, queries[: args.naive_queries], 1000)
            if not args.no_celery:
                cluster = CeleryCluster(env, workdir)
                try:
                    for k_cand in (1000, 0):
                        remote = Recommender(settings.replace(candidates=k_cand, broker_url=cluster.url,
                                                              query_deadline=30.0), store=store, model=model)
                        times, modes, _ = time_queries(remote, queries)
                        if set(modes) != {"celery"}:
                            raise RuntimeError(f"Celery rows fell back in-process: {modes}")
                        row[f"cel_p50_K{k_cand}"], row[f"cel_p95_K{k_cand}"] = percentile(times, 50), percentile(times, 95)
                finally:
                    cluster.close()
            store.close()
            rows_out.append(row)
            print(json.dumps(row), file=sys.stderr)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    print_table(rows_out, args)


def print_table(rows, args) -> None:
    def pair(r, a, b):
        return f"{r[a]:.1f} / {r[b]:.1f}" if a in r else "–"

    print()
    print(f"ticketrec serving benchmark — {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, numpy {np.__version__}; one thread per process; "
          f"{args.queries} queries, k=10")
    head = ("| tickets | build tickets/s | p50/p95 ms K=1000 | p50/p95 ms K=0 | Celery(2) p50/p95 ms K=1000 | "
            "Celery(2) p50/p95 ms K=0 | exhaustive scoring tickets/s | memory scan tickets/s | scoring/scan | "
            "naive ms/query | precomputed ms/query | speed-up | FTS5 pre-filter p50 ms |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        print(f"| {r['tickets']:,} | {r['build']:,.0f} | {pair(r, 'p50_K1000', 'p95_K1000')} | {pair(r, 'p50_K0', 'p95_K0')} | "
              f"{pair(r, 'cel_p50_K1000', 'cel_p95_K1000')} | {pair(r, 'cel_p50_K0', 'cel_p95_K0')} | "
              f"{r['score_rate']:,.0f} | {r['scan_rate']:,.0f} | {r['score_rate'] / r['scan_rate']:.0%} | "
              f"{r['naive_s'] * 1000:.0f} | {r['fast_s'] * 1000:.2f} | {r['naive_s'] / r['fast_s']:,.0f}× | "
              f"{r['fts5_p50']:.0f} |")
    print()
    print("Build = a full build of a knowledge base already in the store (fetch, tokenise, encode, BM25 postings, "
          f"write, verify) with {', '.join(str(r['build_workers']) for r in rows)} encoding process(es); "
          f"importing into the store ran at {', '.join(format(r['import'], ',.0f') for r in rows)} tickets/s.")
    print(f"Latency = Recommender.recommend end to end (encode the query, BM25 pre-filter on the index's postings, "
          f"score, fetch, explain), measured after {WARMUP} untimed warm-up queries; K=0 scores every ticket. "
          "Speed-up = naive (fetch + re-encode the 1,000 candidates + score) over precomputed (score the 1,000 "
          "stored rows, after one untimed pass over them). FTS5 column: the store's FTS5 pre-filter alone "
          f"(K=1000, {args.fts5_queries} queries), for comparison.")
    print("Median ms per stage, K=1000:", {r["tickets"]: r.get("stages_K1000") for r in rows})
    print("Median ms per stage, K=0:", {r["tickets"]: r.get("stages_K0") for r in rows})
    print("Command: .venv/bin/python benchmarks/serving.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
