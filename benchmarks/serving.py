"""Serving benchmark: index build rate, query latency (in-process and through Celery), exhaustive scoring throughput
against the machine's memory-scan rate, and the precomputed path against the naive one (re-encoding candidates).

    .venv/bin/python benchmarks/serving.py                      # 10k, 100k and 1M tickets (one table)
    .venv/bin/python benchmarks/serving.py --sizes 10000,100000 --queries 30

Synthetic knowledge bases come from `recommender.synthetic.generate`. Sizes above --build-max are not generated
and encoded: their matrices are the --build-max build's rows replicated (the store and the BM25 pre-filter then
hold the --build-max tickets); the table says so in its `note` column. The model has the paper's dimensions
(h 50, E 350, T 100) and is trained briefly on a small synthetic set: its quality does not matter here, its shape
does. Runs single-threaded (torch and BLAS one thread), as on a loaded 2-core machine.
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
from recommender.records import Query  # noqa: E402


def percentile(values, q) -> float:
    return float(np.percentile(np.asarray(values) * 1000.0, q))


def train_bench_model(out: Path, seed: int) -> Path:
    """A model with the paper's dimensions, trained briefly (serving speed depends on its shape only)."""
    import torch

    from recommender.siamese import SiameseConfig
    from recommender.synthetic import generate
    from recommender.training import train_model

    torch.set_num_threads(1)
    data = generate(n_tickets=1500, n_queries=150, seed=seed)
    config = SiameseConfig.preset("ml_cl_hET", epochs=1, topic_epochs=2, w2v_epochs=2)
    train_model(data, None, config, out, seed=seed, progress=True)
    return out


def replicate_index(settings: Settings, base_version: str, n: int) -> str:
    """A new index version of n rows made by tiling the rows of `base_version` (ids repeat)."""
    from recommender.index import MANIFEST, IDS_FILE, UPDATED_FILE, open_version, switch_current, _new_version_name, \
        list_versions

    base = open_version(settings, base_version)
    m = len(base)
    version = _new_version_name(list_versions(settings))
    tmp = settings.indexes_dir / f".tmp-{version}"
    tmp.mkdir()
    reps = -(-n // m)
    for key, mat in base.vectors.items():
        out = np.lib.format.open_memmap(tmp / f"{key}.npy", mode="w+", dtype=mat.dtype, shape=(n, mat.shape[1]))
        for r in range(reps):
            start, stop = r * m, min(n, (r + 1) * m)
            out[start:stop] = mat[: stop - start]
        out.flush()
        del out
    ids = (base.ticket_ids * reps)[:n]
    (tmp / IDS_FILE).write_text(json.dumps(ids))
    np.save(tmp / UPDATED_FILE, np.resize(np.asarray(base.updated_at), n))
    manifest = dict(base.manifest, version=version, n_tickets=n, replicated_from=base_version)
    (tmp / MANIFEST).write_text(json.dumps(manifest))
    os.rename(tmp, settings.indexes_dir / version)
    switch_current(settings, version)
    return version


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
        from recommender.distributed import celery_client

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


def time_queries(engine, queries, k=10) -> tuple[list[float], dict]:
    for q in queries[:WARMUP]:
        engine.recommend(q, k=k)
    times, modes = [], {}
    for q in queries:
        t = time.perf_counter()
        engine.recommend(q, k=k)
        times.append(time.perf_counter() - t)
        modes[engine.last_info["mode"]] = modes.get(engine.last_info["mode"], 0) + 1
    return times, modes


def scan_rates(index, spec, query_vecs, repeats=3) -> tuple[float, float]:
    """(exhaustive scoring tickets/s, numpy-sum memory scan tickets/s) over the same matrices, best of `repeats`."""
    from recommender.scoring import score_candidates

    keys = sorted({f"{b}.{c}" for _, b, _ in spec["pairs"] for c in spec["channels"]})
    mats = {k: index.vectors[k] for k in keys}
    n = len(index)
    for m in mats.values():  # fault the pages in once
        float(np.asarray(m).sum())
    score_t = min(_timed(lambda: score_candidates(spec, query_vecs, mats)) for _ in range(repeats))
    scan_t = min(_timed(lambda: [float(np.asarray(m).sum()) for m in mats.values()]) for _ in range(repeats))
    return n / score_t, n / scan_t


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def naive_vs_precomputed(engine, queries, k_candidates: int) -> tuple[float, float]:
    """Seconds per query of scoring K candidates: naive (fetch + re-encode + score) vs precomputed rows."""
    from recommender.scoring import score_candidates

    model, index, store = engine.model, engine.index, engine.store
    qv0 = model.encode_queries([queries[0]])
    score_candidates(index.metric_spec, qv0, index.vectors, np.arange(min(10, len(index))))  # warm (numba)
    model.encode_tickets(store.get_tickets(index.ticket_ids[:64]))  # warm the naive path too
    naive, fast = [], []
    for q in queries:
        qv = model.encode_queries([q])
        hits = engine.prefilter.candidates(f"{q.subject}\n{q.description}", k_candidates)
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
    ap.add_argument("--build-max", type=int, default=100_000, help="largest KB generated and encoded; bigger "
                                                                  "sizes replicate its rows")
    ap.add_argument("--queries", type=int, default=50, help="timed queries per row")
    ap.add_argument("--naive-queries", type=int, default=3, help="queries for the naive path (slow)")
    ap.add_argument("--no-celery", action="store_true", help="skip the Celery rows")
    ap.add_argument("--build-workers", type=int, default=1, help="encoding processes of the index build")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--workdir", default=None, help="where homes are built (default: a temp dir, deleted)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from recommender.engine import Recommender
    from recommender.index import build_index, open_current
    from recommender.model import TicketModel
    from recommender.scoring import HAVE_NUMBA
    from recommender.store import Dataset, Store
    from recommender.synthetic import generate

    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ticketrec-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"workdir {workdir}; numba {'on' if HAVE_NUMBA else 'OFF (numpy fallback)'}", file=sys.stderr)
    model_dir = train_bench_model(workdir / "model", args.seed)
    model = TicketModel.load(model_dir)
    queries_ds = generate(n_tickets=200, n_queries=max(args.queries, args.naive_queries, 2), seed=args.seed + 1)
    queries = [Query(q.subject, q.description) for q in queries_ds.queries][: args.queries]

    rows_out = []
    built: dict[int, tuple[str, float, Path]] = {}  # build size → (version, rate, home)
    try:
        for n in sizes:
            build_n = min(n, args.build_max)
            if build_n not in built:
                home = workdir / f"home-{build_n}"
                env = {"TICKETREC_HOME": str(home), "TICKETREC_MODEL": str(model_dir)}
                settings = Settings.from_env(env)
                store = Store(settings.db)
                print(f"generating {build_n} tickets", file=sys.stderr)
                store.import_dataset(Dataset(generate(n_tickets=build_n, n_queries=0, seed=args.seed).tickets,
                                             source="bench"))
                t = time.perf_counter()
                version = build_index(store, model, settings, incremental=False, progress=True,
                                      workers=args.build_workers)
                rate = build_n / (time.perf_counter() - t)
                store.close()
                built[build_n] = (version, rate, home)
            version, rate, home = built[build_n]
            env = {"TICKETREC_HOME": str(home), "TICKETREC_MODEL": str(model_dir)}
            settings = Settings.from_env(env)
            note = ""
            if n > build_n:
                print(f"replicating {build_n} → {n} rows", file=sys.stderr)
                replicate_index(settings, version, n)
                note = (f"REPLICATED: the {build_n // 1000}k encoded rows tiled ×{-(-n // build_n)} (ids repeat); "
                        f"store/BM25 hold {build_n // 1000}k; build rate is the {build_n // 1000}k build's")
            else:
                from recommender.index import switch_current

                switch_current(settings, version)
            store = Store(settings.db)
            row = {"tickets": n, "build": rate, "note": note}
            for k_cand in (1000, 0):
                engine = Recommender(settings.replace(candidates=k_cand), store=store, model=model)
                times, _ = time_queries(engine, queries)
                row[f"p50_K{k_cand}"], row[f"p95_K{k_cand}"] = percentile(times, 50), percentile(times, 95)
                if k_cand == 1000:
                    parts = engine.last_info["timings"]
                    row["last_parts"] = {p: round(v * 1000, 1) for p, v in parts.items()}
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
                        times, modes = time_queries(remote, queries)
                        if set(modes) != {"celery"}:
                            raise RuntimeError(f"Celery rows fell back in-process: {modes} "
                                               f"({remote.last_info.get('fallback_reason')})")
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
    def f(v, fmt="{:,.0f}"):
        return "–" if v is None else fmt.format(v)

    print()
    print(f"ticketrec serving benchmark — {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, numpy {np.__version__}; single-threaded scoring; "
          f"{args.queries} queries, k=10")
    head = ("| tickets | build tickets/s | p50/p95 ms K=1000 | p50/p95 ms K=0 | Celery(2) p50/p95 ms K=1000 | "
            "Celery(2) p50/p95 ms K=0 | exhaustive scoring tickets/s | memory scan tickets/s | scoring/scan | "
            "naive ms/query | precomputed ms/query | speed-up | note |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        cel1 = f"{r['cel_p50_K1000']:.1f} / {r['cel_p95_K1000']:.1f}" if "cel_p50_K1000" in r else "–"
        cel0 = f"{r['cel_p50_K0']:.1f} / {r['cel_p95_K0']:.1f}" if "cel_p50_K0" in r else "–"
        print(f"| {r['tickets']:,} | {f(r['build'])} | {r['p50_K1000']:.1f} / {r['p95_K1000']:.1f} | "
              f"{r['p50_K0']:.1f} / {r['p95_K0']:.1f} | {cel1} | {cel0} | {f(r['score_rate'])} | {f(r['scan_rate'])} | "
              f"{r['score_rate'] / r['scan_rate']:.0%} | {r['naive_s'] * 1000:.0f} | {r['fast_s'] * 1000:.2f} | "
              f"{r['naive_s'] / r['fast_s']:,.0f}× | {r['note']} |")
    print()
    print(f"Index build with {args.build_workers} encoding process(es). Every latency is measured after {WARMUP} untimed "
          "warm-up queries, and the precomputed path after one untimed pass over the same rows (warm memory map, "
          "as in a long-running server); cold first reads are not in these figures.")
    print("Latency = Recommender.recommend end to end (encode query, BM25 pre-filter, score, fetch, explain); "
          "K=0 scores every ticket. Build = fetch + encode + write of a full build. Speed-up = naive "
          "(fetch + re-encode the 1,000 candidates + score) over precomputed (score the 1,000 stored rows).")
    print("Last K=1000 query, ms per stage:", {r["tickets"]: r.get("last_parts") for r in rows})
    print("Command: .venv/bin/python benchmarks/serving.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
