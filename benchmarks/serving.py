"""Serving benchmark: index build rate and where its time goes, query latency end to end (in-process and through
Celery) with each stage's median and p95, scoring 1,000 scattered candidates, memory per ticket and how much of the
index is resident, exhaustive scoring against a memory scan, float16 storage's effect on the ranking, and the
precomputed path against the naive one (re-encoding the candidates).

    .venv/bin/python benchmarks/serving.py --kb real --sizes 100000            # the paper configuration (h, E, T)
    .venv/bin/python benchmarks/serving.py --kb real --sizes 100000 --config S # + the pretrained channel S
    .venv/bin/python benchmarks/serving.py --kb real --sizes 10000 --channel DIR  # + an extra channel C or V
    .venv/bin/python benchmarks/serving.py --kb synthetic --sizes 10000 --no-celery --queries 30

Knowledge bases: `--kb real` (default) recombines real SeaMonkey bug reports and SemEval-2016 forum threads by
sentence (`benchmarks/real_kb.py`, needs `../shared/data/`; tens of thousands of word types), `--kb synthetic` the
industrial-service generator (`recommender.data.synthetic`, a few hundred word types). Each size is imported into
a store, indexed by `ticketrec index --full` in a subprocess (its time and peak RSS are the build's), then queried
with queries made the same way from a separate random stream. The model has the paper's dimensions (h 50, E 350,
T 100; `--config S` adds the pretrained sentence encoder, 384-d; `--channel DIR` the extra channel of a char-siamese
(C) or var-siamese (V) model directory, weight 0.3) and is trained briefly on 1,500 tickets of the same kind of
knowledge base with random labels: its quality does not matter here, its shape and vocabulary do.

Every timing excludes warm-up: WARMUP untimed queries first (a server is long-running: the index is loaded and
pinned at open, numba compiled, caches filled). Torch and BLAS run one thread per process; the build encodes in
one process per core (TICKETREC_INDEX_WORKERS). Every table states the knowledge base, the machine and its load
average (1 min, before and after each size: other jobs share this machine), and every ratio names its baseline.
"""
from __future__ import annotations

import argparse
import functools
import json
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import platform
import random
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from recommender.config import Settings  # noqa: E402
from recommender.data.records import Query  # noqa: E402

WARMUP = 5  # untimed queries before timing: a serving process is long-running (warm memory maps, numba, caches)
IMPORT_CHUNK = 50_000  # tickets per import transaction (a 1M knowledge base never sits in one list)
PROFILE_TICKETS = 4000  # tickets of the one-process encoding profile (where the build's time goes)


def percentile(values, q) -> float:
    return float(np.percentile(np.asarray(values) * 1000.0, q))


def load1() -> float:
    return os.getloadavg()[0]


# -- knowledge bases ------------------------------------------------------------------------------------------------
def kb_tickets(kb: str, n: int, seed: int):
    """`n` tickets of the knowledge base `kb`, streamed."""
    if kb == "real":
        from real_kb import iter_real_tickets

        return iter_real_tickets(n, seed)
    from recommender.data.synthetic import generate

    return iter(generate(n_tickets=n, n_queries=0, seed=seed).tickets)


def kb_queries(kb: str, n: int, seed: int) -> list[Query]:
    if kb == "real":
        from real_kb import iter_real_queries

        return [Query(q.subject, q.description) for q in iter_real_queries(n, seed)]
    from recommender.data.synthetic import generate

    return [Query(q.subject, q.description) for q in generate(n_tickets=200, n_queries=n, seed=seed + 1).queries][:n]


def import_kb(store, kb: str, n: int, seed: int) -> float:
    """Import `n` tickets in chunks; tickets/s."""
    from recommender.data.store import Dataset

    started = time.perf_counter()
    chunk = []
    for ticket in kb_tickets(kb, n, seed):
        chunk.append(ticket)
        if len(chunk) == IMPORT_CHUNK:
            store.import_dataset(Dataset(chunk, source=f"bench-{kb}"))
            chunk = []
    if chunk:
        store.import_dataset(Dataset(chunk, source=f"bench-{kb}"))
    return n / (time.perf_counter() - started)


def train_bench_model(kb: str, config: str, out: Path, seed: int, channel_dirs=()) -> Path:
    """A model with the paper's dimensions (+ S for `config` "S", + the extra channel of each of `channel_dirs`),
    trained briefly on 1,500 tickets of the same kind of knowledge base (real: random labels; synthetic: the
    generator's). Its shape and vocabulary matter here."""
    import torch

    from recommender.data.records import LabeledPair
    from recommender.data.store import Dataset
    from recommender.data.synthetic import generate
    from recommender.model.extra_channels import load_channel_encoder
    from recommender.model.siamese import SiameseConfig
    from recommender.model.training import train_model

    torch.set_num_threads(1)
    encoders = dict(load_channel_encoder(d) for d in channel_dirs)
    if kb == "real":
        from real_kb import iter_real_queries, real_tickets

        tickets = real_tickets(1500, seed=seed + 99)  # another stream than the benchmark's knowledge base
        queries = list(iter_real_queries(150, seed=seed + 99))
        rng = random.Random(seed)
        pairs = [LabeledPair(q.id, tickets[rng.randrange(len(tickets))].id, float(rng.randint(1, 5)))
                 for q in queries for _ in range(10)]
        data = Dataset(tickets, queries, pairs, "bench-real")
    else:
        data = generate(n_tickets=1500, n_queries=150, seed=seed)
    channels = {"h": 0.7, "E": 0.1, "T": 0.2, **({"S": 0.3} if config == "S" else {}), **{c: 0.3 for c in encoders}}
    cfg = SiameseConfig.preset("ml_cl_hET", channels=channels, epochs=1, topic_epochs=2, w2v_epochs=2)
    train_model(data, None, cfg, out, seed=seed, progress=False, channel_encoders=encoders)
    return out


# -- the build ------------------------------------------------------------------------------------------------------
def run_build(env: dict, dtype: str, workers: int | None) -> tuple[float, float, float]:
    """`ticketrec index --full` in a subprocess: (seconds, CPU seconds of it and its encoding processes, peak RSS
    in GiB of its largest process)."""
    cmd = [sys.executable, "-m", "recommender.cli", "index", "--full"]
    if dtype != "auto":
        cmd.append(f"--{dtype}")
    if workers:
        cmd += ["--workers", str(workers)]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE if os.environ.get("BENCH_QUIET") else None)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    if proc.returncode:
        raise RuntimeError(f"`{' '.join(cmd)}` exited {proc.returncode}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 2**20


def encoding_profile(model, kb: str, seed: int, n: int) -> dict:
    """Where one process's encoding time goes on `n` tickets (seconds per stage, tickets/s): the build's work per
    ticket, without its fetching, writing and process fan-out."""
    from recommender.lexical.postings import ticket_terms
    from recommender.model import siamese

    spent: dict[str, float] = {}

    def timed(owner, name, label):
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t

        setattr(owner, name, wrapper)
        return owner, name, original

    tickets = list(kb_tickets(kb, n, seed + 7))
    model._ensure_inference()
    model.encode_tickets(tickets[:256])  # untimed: caches, lazy loads
    patched = [timed(model.featurizer, "ticket_tokens", "tokenise (words + Punkt)"),
               timed(model.featurizer.splitter, "split", "  of which Punkt sentence split"),
               timed(model.featurizer, "batch", "batch (ids, characters)"),
               timed(model.net.embedder, "forward", "word vectors (word2vec + char BiLSTM)"),
               timed(siamese, "lstm_last_state", "LSTM h"), timed(siamese, "sum_emb", "SumEMB E")]
    if model.topic_model is not None:
        patched.append(timed(model.topic_model, "transform", "DocNADE T"))
    if "S" in model.siamese_config.active_channels:
        encoder = model.sentence_encoder()
        patched.append(timed(encoder, "encode_groups", "sentence encoder S"))
    spent.clear()
    try:
        started = time.perf_counter()
        for start in range(0, len(tickets), 512):
            model.encode_tickets(tickets[start : start + 512])
        total = time.perf_counter() - started
        t = time.perf_counter()
        ticket_terms(tickets)
        spent["BM25 terms (Porter stems)"] = time.perf_counter() - t
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)
    return {"tickets": len(tickets), "encode_seconds": total, "stages": spent}


# -- queries --------------------------------------------------------------------------------------------------------
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
        deadline = time.monotonic() + 300  # each worker process opens and warms the index before it answers
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


def time_queries(engine, queries, k=10, cpu: list | None = None) -> tuple[list[float], dict, dict]:
    """(seconds per query, answering modes, {stage: (median ms, p95 ms)}) after WARMUP untimed queries; `cpu`
    collects each query's CPU seconds in this thread (what the query costs without the machine's other jobs)."""
    for q in queries[:WARMUP]:
        engine.recommend(q, k=k)
    times, modes, stages = [], {}, {}
    for q in queries:
        t, c = time.perf_counter(), time.thread_time()
        info = engine.recommend(q, k=k).info
        times.append(time.perf_counter() - t)
        if cpu is not None:
            cpu.append(time.thread_time() - c)
        modes[info.mode] = modes.get(info.mode, 0) + 1
        if info.fallback_reason:
            modes["fallback_reason"] = info.fallback_reason
        for stage, seconds in info.timings.items():
            stages.setdefault(stage, []).append(seconds * 1000.0)
    return times, modes, {stage: (round(float(np.median(v)), 2), round(float(np.percentile(v, 95)), 2))
                          for stage, v in stages.items()}


def scan_rates(index, spec, query_vecs, repeats=3) -> tuple[float, float]:
    """(exhaustive scoring tickets/s, memory scan tickets/s) over the same matrix, best of `repeats`; the scan is
    numpy summing the matrix's bytes as 64-bit integers (one pass at memory speed whatever the dtype: numpy's own
    float16 sum converts element by element, far slower than the memory)."""
    from recommender.serving.scoring import score_candidates

    keys = index.model.served_keys("ticket")  # what the metric reads, and the topic pre-filter's T vector
    if keys != set(index.vectors):
        raise RuntimeError(f"the metric reads {sorted(keys)}, the index holds {sorted(index.vectors)}: the scan "
                           "over the whole packed matrix would not be the same bytes")
    flat = np.asarray(index.vectors.matrix).reshape(-1).view(np.uint8)
    words = flat[: flat.size - flat.size % 8].view(np.uint64)
    n = len(index)
    score_t = min(_timed(lambda: score_candidates(spec, query_vecs, index.vectors)) for _ in range(repeats))
    scan_t = min(_timed(lambda: int(words.sum())) for _ in range(repeats))
    return n / score_t, n / scan_t


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def float16_agreement(engine, queries, k: int = 10) -> dict:
    """float16 storage against float32 on the same candidates (a float32 index): each query's K candidates scored
    from the stored rows and from the same rows rounded to float16 (what a float16 index stores; its kernel widens
    them exactly and sums in float32). Mean top-k overlap, share of identical top k, max relative change of g."""
    from recommender.serving.scoring import PackedVectors, score_candidates, top_k

    index, model = engine.index, engine.model
    overlaps, identical, rel = [], 0, 0.0
    for q in queries:
        rows, bm25 = engine.candidates(q, index)
        if rows is None:
            continue
        qv = model.encode_queries([q])
        g32 = score_candidates(index.metric_spec, qv, index.vectors, rows, bm25)
        half = PackedVectors(np.asarray(index.vectors.matrix[np.sort(rows)], dtype=np.float16), index.vectors.dims)
        g16 = np.empty_like(g32)
        order = np.argsort(rows, kind="stable")
        g16[order] = score_candidates(index.metric_spec, qv, half, None, bm25[order])
        a, b = top_k(g32, k).tolist(), top_k(g16, k).tolist()
        overlaps.append(len(set(a) & set(b)) / max(1, len(a)))
        identical += a == b
        rel = max(rel, float(np.max(np.abs(g16 - g32) / g32)))
    return {"queries": len(overlaps), "overlap": float(np.mean(overlaps)) if overlaps else float("nan"),
            "identical": identical / max(1, len(overlaps)), "max_rel_g": rel}


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


def duplicates_float16(model_dir: str, kb: str, links: str, mapping: dict[str, str]) -> list[dict]:
    """The duplicates protocol (`ticketrec evaluate --kb ... --duplicates ...`: each ticket of a duplicate pair queries
    the knowledge base minus itself through the engine) with the same model over a float32 and a float16 index.
    Rows: MRR@10, Acc@1/10 and each query's partner rank, per dtype."""
    from recommender.data.importers import load, load_links
    from recommender.evaluation.duplicates import EngineRanker, evaluate_duplicates
    from recommender.model.bundle import TicketModel

    data = load(kb, mapping=mapping, progress=False)
    pairs = load_links(links, None, known_ids=[t.id for t in data.tickets], warn=lambda message: None)
    model = TicketModel.load(model_dir)
    rankers = {}
    try:
        for dtype in ("float32", "float16"):
            rankers[dtype] = EngineRanker(model, data.tickets, Settings.from_env().replace(index_dtype=dtype))
            assert rankers[dtype].engine.index.manifest["dtype"] == dtype
        return evaluate_duplicates(data.tickets, pairs, rankers, n_boot=1000, seed=0, progress=False)
    finally:
        for ranker in rankers.values():
            ranker.close()


def kernel_rows(n: int, workdir: Path, queries: int = 200, k: int = 1000, seed: int = 3) -> list[dict]:
    """Scoring K scattered candidates of an n-row index of the paper's layout (SUB/DESC/SOL × h 50, E 350, T 100;
    Table 2's 5 pairs × 3 channels), as served: memory-mapped .npy files of random vectors, float32 and float16,
    each query a new random set of K rows. Variants: the candidates in BM25 (random) order or sorted by row; float16
    read as stored (the kernel widens it) or gathered and widened to float32 by numpy first (the previous path);
    pages loaded at open, or dropped from the page cache first (cold): faulted in one by one as the kernel reads the
    rows, or requested together first (MADV_WILLNEED: `scoring.prefetch_rows`, what serving does once it sees
    candidate pages missing). Median and p95 ms per query."""
    from recommender.serving.residency import _populate
    from recommender.serving.scoring import PackedVectors, _distances_packed, metric_plan, prefetch_rows

    widths = {"h": 50, "E": 350, "T": 100}
    dims = {f"{c}.{ch}": w for c in ("SUB", "DESC", "SOL") for ch, w in widths.items()}
    spec = {"pairs": [["SUB", "SUB", 0.3], ["DESC", "DESC", 0.3], ["SUB", "DESC", 0.2], ["SUB", "SOL", 0.1],
                      ["DESC", "SOL", 0.1]], "channels": {"h": 0.7, "E": 0.1, "T": 0.2}, "bm25": 0.0}
    rng = np.random.default_rng(seed)
    query = {f"{c}.{ch}": rng.standard_normal((1, w)).astype(np.float32) * 0.3
             for c in ("SUB", "DESC") for ch, w in widths.items()}
    plan = metric_plan(spec, query, dims)
    paths = {}
    for dtype in ("float32", "float16"):
        path = workdir / f"kernel-{n}-{dtype}.npy"
        paths[dtype] = path
        if not path.exists():
            out = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(n, sum(dims.values())))
            for start in range(0, n, 65536):  # distinct random rows (no repeated pages)
                stop = min(n, start + 65536)
                out[start:stop] = rng.standard_normal((stop - start, out.shape[1]), dtype=np.float32) * 0.3
            out.flush()
            del out

    def drop(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def widened(packed, rows, out):  # the path before this issue: numpy gathers and widens, then the kernel
        block = np.ascontiguousarray(np.asarray(packed.matrix)[rows], dtype=np.float32)
        _distances_packed(PackedVectors(block, packed.dims), plan, None, out)

    variants = [("float32", "BM25 order", "loaded", False), ("float32", "sorted", "loaded", False),
                ("float16", "sorted", "loaded", False), ("float16", "widened first (previous path)", "loaded", False),
                ("float32", "sorted", "cold", False), ("float32", "sorted", "cold", True),
                ("float16", "sorted", "cold", False), ("float16", "sorted", "cold", True)]
    never = float("inf")  # residency_checked in the future: the automatic prefetch stays off unless a row asks
    rows_out = []
    for dtype, order, state, prefetch in variants:
        matrix = np.load(paths[dtype], mmap_mode="r")
        packed = PackedVectors(matrix, dims)
        packed.residency_checked = never  # each variant decides itself whether to prefetch
        out = np.zeros(k, np.float32)
        _distances_packed(packed, plan, np.arange(k, dtype=np.int64), out)  # compile, untimed
        if state == "loaded":
            _populate(matrix)
        times = []
        for _ in range(queries if state == "loaded" else max(10, queries // 10)):
            if state == "cold":
                drop(paths[dtype])
            rows = rng.integers(0, n, k).astype(np.int64)
            out[:] = 0
            t = time.perf_counter()
            if prefetch:
                prefetch_rows(matrix, rows)
            if order.startswith("widened"):
                widened(packed, np.sort(rows), out)
            elif order == "BM25 order":  # the kernel as it was: rows in the order given
                from recommender.serving.scoring import _l1_packed, kernel_terms

                _l1_packed(np.asarray(matrix), rows, *kernel_terms(packed, plan), out)
            else:
                _distances_packed(packed, plan, rows, out)
            times.append(time.perf_counter() - t)
        rows_out.append({"dtype": dtype, "order": order, "pages": state + (" + MADV_WILLNEED" if prefetch else ""),
                         "p50": percentile(times, 50), "p95": percentile(times, 95), "queries": len(times)})
        del packed, matrix
    return rows_out



def loading_phases(settings: Settings, model, queries: list[Query], per_phase: int = 50) -> list[dict]:
    """What loading the index at open buys, on one index version: (1) an engine whose version was loaded with
    MADV_POPULATE_READ alone, (2) the same engine after every page was read once (`TicketIndex.warm`, which also
    reads them), (3) a new engine with the whole version locked (TICKETREC_INDEX_PIN=all). Each phase answers its own
    `per_phase` queries after 5 untimed ones; medians and p95 per stage (ms)."""
    from recommender.config import PIN_ALL
    from recommender.serving import residency
    from recommender.serving.engine import Recommender

    def phase(name, engine, batch):
        for q in batch[:WARMUP]:
            engine.recommend(q)
        times, stages = [], {}
        for q in batch[WARMUP:]:
            t = time.perf_counter()
            info = engine.recommend(q).info
            times.append(time.perf_counter() - t)
            for stage, seconds in info.timings.items():
                stages.setdefault(stage, []).append(seconds * 1000.0)
        return {"phase": name, "load": load1(), "p50": percentile(times, 50), "p95": percentile(times, 95),
                **{stage: (float(np.median(v)), float(np.percentile(v, 95))) for stage, v in stages.items()}}

    size = per_phase + WARMUP
    batches = [queries[i * size : (i + 1) * size] for i in range(3)]
    touch = residency._touch
    residency._touch = lambda arr: None
    try:
        engine = Recommender(settings, model=model)
        rows = [phase("opened with MADV_POPULATE_READ alone", engine, batches[0])]
    finally:
        residency._touch = touch
    started = time.perf_counter()
    engine.index.warm()
    rows.append(phase(f"the same engine after reading every page ({time.perf_counter() - started:.1f} s)", engine,
                      batches[1]))
    locked = Recommender(settings.replace(index_pin=PIN_ALL), model=model)
    rows.append(phase("a new engine, version locked (TICKETREC_INDEX_PIN=all)", locked, batches[2]))
    return rows


def index_bytes(index) -> dict:
    """Bytes per ticket of the version's vectors and of its BM25 postings, from its manifest."""
    files = index.manifest.get("files") or {}
    n = max(1, len(index))
    postings = sum(e["bytes"] for name, e in files.items() if name.startswith("bm25_"))
    return {"vectors": files.get("vectors.npy", {}).get("bytes", 0) / n, "postings": postings / n}


# -- main -----------------------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kb", choices=("real", "synthetic"), default="real",
                    help="real-vocabulary knowledge base (benchmarks/real_kb.py, needs ../shared/data) or synthetic")
    ap.add_argument("--config", choices=("paper", "S"), default="paper",
                    help="the paper's channels h, E, T, or with the pretrained sentence encoder S as well")
    ap.add_argument("--sizes", default="100000,1000000", help="comma-separated knowledge-base sizes")
    ap.add_argument("--dtype", choices=("auto", "float32", "float16"), default="auto",
                    help="how the index stores the vectors (`ticketrec index --float16/--float32`; default: "
                         "TICKETREC_INDEX_DTYPE's default, auto = float16 from 100,000 tickets up)")
    ap.add_argument("--pin", default="0", help="TICKETREC_INDEX_PIN of the serving processes (e.g. 0, 4G, all)")
    ap.add_argument("--queries", type=int, default=50, help="timed queries per row")
    ap.add_argument("--naive-queries", type=int, default=3, help="queries for the naive path (slow)")
    ap.add_argument("--no-celery", action="store_true", help="skip the Celery rows")
    ap.add_argument("--no-exhaustive", action="store_true", help="skip K=0 (every ticket scored)")
    ap.add_argument("--build-workers", type=int, default=None,
                    help="encoding processes of the index build (default: one per core, as `ticketrec index`)")
    ap.add_argument("--fts5-queries", type=int, default=10, help="queries timed on the FTS5 pre-filter alone")
    ap.add_argument("--profile-tickets", type=int, default=PROFILE_TICKETS,
                    help="tickets of the one-process encoding profile (0: skip it)")
    ap.add_argument("--model", default=None, help="use this model directory instead of training one")
    ap.add_argument("--channel", action="append", default=[], metavar="DIR",
                    help="add the extra channel of this char-siamese or var-siamese model directory to the trained "
                         "model (weight 0.3; repeat for both)")
    ap.add_argument("--no-touch", action="store_true",
                    help="load the index at open with MADV_POPULATE_READ alone, without reading every page (the "
                         "serving processes of this run; for comparison with the default)")
    ap.add_argument("--loading", action="store_true",
                    help="only this, with --workdir and --model of a previous run: query its index of --sizes tickets "
                         "loaded with MADV_POPULATE_READ alone, then after reading every page, then locked")
    ap.add_argument("--reuse-index", action="store_true",
                    help="with --workdir: query the index a previous run built there (no build row)")
    ap.add_argument("--float16-duplicates", metavar="MODEL_DIR", default=None,
                    help="only this: SeaMonkey duplicates (../shared/data/seamonkey) ranked by MODEL_DIR over a float32 "
                         "and a float16 index (MRR@10, Acc@k, partner ranks); no serving rows")
    ap.add_argument("--kernel", type=int, default=0, metavar="N",
                    help="only this: scoring 1,000 scattered candidates of an N-row index of random vectors in the "
                         "paper's layout (float32/float16, sorted or not, loaded or cold); no serving rows")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--workdir", default=None, help="where homes are built (default: a temp dir, deleted)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from recommender.config import _size
    from recommender.data.store import Store
    from recommender.lexical.searchers import Fts5Searcher
    from recommender.model.bundle import TicketModel
    from recommender.serving.engine import Recommender
    from recommender.serving.scoring import HAVE_NUMBA

    if args.no_touch:
        from recommender.serving import residency

        residency._touch = lambda arr: None
    if args.kernel:
        workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ticketrec-kernel-"))
        workdir.mkdir(parents=True, exist_ok=True)
        before = load1()
        try:
            rows = kernel_rows(args.kernel, workdir)
        finally:
            if args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)
        print(f"\nScoring 1,000 scattered candidates of {args.kernel:,} rows (random vectors, the paper's layout: "
              f"1,500 values a row, 15 terms), one thread; load {before:.1f}–{load1():.1f}; "
              f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores:\n")
        print("| vectors | candidate order | pages | p50 ms | p95 ms | queries |\n|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['dtype']} | {r['order']} | {r['pages']} | {r['p50']:.2f} | {r['p95']:.2f} | {r['queries']} |")
        print("\nloaded = pages mapped and read at open (`TicketIndex.warm`); cold = the file's pages dropped from the "
              "page cache (posix_fadvise DONTNEED) before each query, so every candidate's pages come from disk.")
        print("Command: .venv/bin/python benchmarks/serving.py " + " ".join(sys.argv[1:]))
        return
    if args.float16_duplicates:
        from shared_data import SEAMONKEY, SEAMONKEY_LINKS, SEAMONKEY_MAP

        rows = duplicates_float16(args.float16_duplicates, str(SEAMONKEY), str(SEAMONKEY_LINKS), SEAMONKEY_MAP)
        print(f"\nSeaMonkey duplicates, model {args.float16_duplicates}, the same engine over a float32 and a float16 "
              f"index (load {load1():.1f}):\n")
        print("| index | MRR@10 [95 % CI] | Acc@1 | Acc@10 |\n|---|---|---|---|")
        for row in rows:
            print(f"| {row['system']} | {row['MRR@10']:.4f} [{row['MRR@10_low']:.3f}, {row['MRR@10_high']:.3f}] | "
                  f"{row['Acc@1']:.4f} | {row['Acc@10']:.4f} |")
        same = sum(a == b for a, b in zip(rows[0]["ranks"], rows[1]["ranks"]))
        print(f"\nThe partner's rank is the same for {same} of {len(rows[0]['ranks'])} queries.")
        print("Command: .venv/bin/python benchmarks/serving.py " + " ".join(sys.argv[1:]))
        return
    if args.kb == "real":
        from real_kb import available

        if not available():
            raise SystemExit("error: the real-vocabulary knowledge base needs ../shared/data (SeaMonkey, SemEval-2016); "
                             "use --kb synthetic without it")
    pin = _size(args.pin)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if args.loading:
        if not (args.workdir and args.model):
            raise SystemExit("error: --loading queries the index of a previous run: give its --workdir and --model")
        n = sizes[0]
        home = Path(args.workdir) / f"home-{args.kb}-{n}"
        settings = Settings.from_env({"TICKETREC_HOME": str(home), "TICKETREC_MODEL": args.model})
        rows = loading_phases(settings, TicketModel.load(args.model), kb_queries(args.kb, 3 * (50 + WARMUP), args.seed + 5))
        print(f"\nLoading at open: {n:,} {args.kb} tickets, the index in {home} (its pages last read by whatever ran "
              "before: the first phase depends on how long they sat unread); in-process, K=1000, "
              f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores:\n")
        print("| phase | load (1 min) | p50 / p95 ms | encode / pre-filter / score / tickets p50 ms | score p95 ms |\n"
              "|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['phase']} | {r['load']:.1f} | {r['p50']:.1f} / {r['p95']:.1f} | {r['encode'][0]:.1f} / "
                  f"{r['prefilter'][0]:.1f} / {r['score'][0]:.1f} / {r['tickets'][0]:.1f} | {r['score'][1]:.1f} |")
        print("Command: .venv/bin/python benchmarks/serving.py " + " ".join(sys.argv[1:]))
        return
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ticketrec-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"workdir {workdir}; numba {'on' if HAVE_NUMBA else 'OFF (numpy fallback)'}", file=sys.stderr)
    model_dir = (Path(args.model) if args.model
                 else train_bench_model(args.kb, args.config, workdir / "model", args.seed, args.channel))
    model = TicketModel.load(model_dir)
    args.extra_channels = sorted(model.channel_encoders)
    queries = kb_queries(args.kb, max(args.queries, args.naive_queries, 2), args.seed)[: args.queries]
    profile = (encoding_profile(model, args.kb, args.seed, args.profile_tickets) if args.profile_tickets else None)
    if profile:
        print(json.dumps(profile), file=sys.stderr)

    rows_out = []
    try:
        for n in sizes:
            home = workdir / f"home-{args.kb}-{n}"
            env = {"TICKETREC_HOME": str(home), "TICKETREC_MODEL": str(model_dir), "TICKETREC_INDEX_PIN": args.pin}
            settings = Settings.from_env(env)
            row: dict = {"tickets": n, "load_before": load1()}
            with Store(settings.db) as store:
                if store.stats()["tickets"] != n:
                    print(f"importing {n:,} {args.kb} tickets", file=sys.stderr)
                    row["import"] = import_kb(store, args.kb, n, args.seed)
            if not args.reuse_index or not (home / "indexes" / "CURRENT").exists():
                print(f"building the index of {n:,} tickets", file=sys.stderr)
                seconds, cpu_seconds, rss = run_build(env, args.dtype, args.build_workers)
                row.update(build=n / seconds, build_cpu_ms=cpu_seconds * 1000 / n, build_rss=rss,
                           build_workers=args.build_workers or settings.encoding_processes)
            store = Store(settings.db)
            fts5 = Fts5Searcher(store)
            fts5_times = []
            for q in queries[: args.fts5_queries]:
                t = time.perf_counter()
                fts5.search(f"{q.subject}\n{q.description}", 1000)
                fts5_times.append(time.perf_counter() - t)
            row["fts5_p50"] = percentile(fts5_times, 50) if fts5_times else float("nan")
            engine = Recommender(settings.replace(candidates=1000, index_pin=pin), store=store, model=model)
            index = engine.index  # opened, loaded into memory and pinned as a server does
            row["warm"] = dict(index.warmed or {})
            row["memory"] = index.memory()
            row["bytes"] = index_bytes(index)
            row["dtype"] = index.manifest["dtype"]
            cpu: list[float] = []
            times, _, stages = time_queries(engine, queries, cpu=cpu)
            row["p50_K1000"], row["p95_K1000"], row["stages_K1000"] = percentile(times, 50), percentile(times, 95), stages
            row["cpu_p50_K1000"], row["cpu_p95_K1000"] = percentile(cpu, 50), percentile(cpu, 95)
            if row["dtype"] == "float32":
                row["fp16"] = float16_agreement(engine, queries)
            row["naive_s"], row["fast_s"] = naive_vs_precomputed(engine, queries[: args.naive_queries], 1000)
            if not args.no_exhaustive:
                exhaustive = Recommender(settings.replace(candidates=0, index_pin=pin), store=store, model=model,
                                         index=index)
                times, _, stages = time_queries(exhaustive, queries)
                row["p50_K0"], row["p95_K0"], row["stages_K0"] = percentile(times, 50), percentile(times, 95), stages
                row["score_rate"], row["scan_rate"] = scan_rates(index, index.metric_spec,
                                                                 model.encode_queries([queries[0]]))
            if not args.no_celery:
                cluster = CeleryCluster(env, workdir)
                try:
                    remote = Recommender(settings.replace(candidates=1000, broker_url=cluster.url, query_deadline=30.0,
                                                          index_pin=pin), store=store, model=model, index=index)
                    times, modes, stages = time_queries(remote, queries)
                    if set(modes) != {"celery"}:
                        raise RuntimeError(f"Celery rows fell back in-process: {modes}")
                    row["cel_p50_K1000"], row["cel_p95_K1000"] = percentile(times, 50), percentile(times, 95)
                    row["stages_cel"] = stages
                finally:
                    cluster.close()
            store.close()
            row["load_after"] = load1()
            rows_out.append(row)
            print(json.dumps(row), file=sys.stderr)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    print_table(rows_out, profile, args)


def print_table(rows, profile, args) -> None:
    def pair(r, a, b, fmt=".1f"):
        return f"{r[a]:{fmt}} / {r[b]:{fmt}}" if a in r else "–"

    def stage(r, key, name):
        return "/".join(f"{v:.1f}" for v in r[key][name]) if key in r and name in r[key] else "–"

    kb = ("real-vocabulary (benchmarks/real_kb.py: SeaMonkey + SemEval-2016 sentences recombined)" if args.kb == "real"
          else "synthetic (recommender.data.synthetic)")
    config = "paper configuration (h, E, T)" if args.config == "paper" else "h, E, T + pretrained S"
    if args.extra_channels:
        config += " + extra channel(s) " + ", ".join(args.extra_channels) + " (weight 0.3)"
    print()
    print(f"ticketrec serving benchmark — knowledge base: {kb}; model: {config}; index dtype {args.dtype}, "
          f"TICKETREC_INDEX_PIN={args.pin}{', pages not read at open (--no-touch)' if args.no_touch else ''}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, numpy {np.__version__}; one thread per process; {args.queries} timed "
          f"queries after {WARMUP} untimed warm-up queries (excluded), k=10")
    print()
    head = ("| tickets | index dtype | load (1 min) before–after | build tickets/s (CPU ms/ticket; peak RSS GiB) | "
            "p50/p95 ms K=1000 | CPU ms/query p50/p95 | encode / pre-filter / score / tickets ms, p50/p95 | "
            "p50/p95 ms K=0 | Celery(2) p50/p95 ms K=1000 | "
            "Celery p95 / in-process p95 | index bytes/ticket: vectors + postings | resident after open |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        ratio = f"{r['cel_p95_K1000'] / r['p95_K1000']:.2f}×" if "cel_p95_K1000" in r else "–"
        mem = r["memory"]
        resident = f"{mem['resident_bytes'] / mem['bytes']:.0%}" if mem.get("resident_bytes") is not None else "?"
        locked = f", {mem['locked_bytes'] / 2**30:.2f} GiB locked" if mem.get("locked_bytes") else ", none locked"
        build = (f"{r['build']:,.0f} ({r['build_cpu_ms']:.2f}; {r['build_rss']:.1f})" if "build" in r
                 else "– (index reused)")
        print(f"| {r['tickets']:,} | {r['dtype']} | {r['load_before']:.1f}–{r['load_after']:.1f} | {build} | "
              f"{pair(r, 'p50_K1000', 'p95_K1000')} | {pair(r, 'cpu_p50_K1000', 'cpu_p95_K1000')} | "
              f"{stage(r, 'stages_K1000', 'encode')} / {stage(r, 'stages_K1000', 'prefilter')} / "
              f"{stage(r, 'stages_K1000', 'score')} / {stage(r, 'stages_K1000', 'tickets')} | "
              f"{pair(r, 'p50_K0', 'p95_K0')} | {pair(r, 'cel_p50_K1000', 'cel_p95_K1000')} | {ratio} | "
              f"{r['bytes']['vectors']:,.0f} + {r['bytes']['postings']:,.0f} | {resident}{locked} |")
    print()
    head = ("| tickets | exhaustive scoring / memory scan of the same matrix | naive ms/query | precomputed "
            "ms/query | naive / precomputed | FTS5 pre-filter alone p50 ms | float16 vs float32: top-10 overlap, "
            "identical top 10, max Δg/g |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        scan = f"{r['score_rate']:,.0f} / {r['scan_rate']:,.0f} tickets/s = {r['score_rate'] / r['scan_rate']:.0%}" \
            if "score_rate" in r else "–"
        fp16 = (f"{r['fp16']['overlap']:.4f}, {r['fp16']['identical']:.0%} of {r['fp16']['queries']}, "
                f"{r['fp16']['max_rel_g']:.1e}") if "fp16" in r else "– (index is float16)"
        print(f"| {r['tickets']:,} | {scan} | {r['naive_s'] * 1000:.0f} | {r['fast_s'] * 1000:.2f} | "
              f"{r['naive_s'] / r['fast_s']:,.0f}× | {r['fts5_p50']:.0f} | {fp16} |")
    print()
    print(f"Build = `ticketrec index --full` in a subprocess over a knowledge base already in the store (fetch, "
          f"tokenise, encode, BM25 postings, write, checksum, verify) with "
          f"{', '.join(str(r.get('build_workers', '–')) for r in rows)} encoding process(es); CPU ms/ticket = the "
          "CPU time of the build and its encoding processes per ticket (2 idle cores would build about 2,000 / it "
          "tickets/s); peak RSS = its largest process (mapped index pages included). Importing into the store: "
          + ", ".join(f"{r['import']:,.0f} tickets/s" if "import" in r else "already there" for r in rows) + ".")
    print("Latency = Recommender.recommend end to end (encode the query, BM25 pre-filter on the index's postings, "
          "score, fetch the tickets and explain), in-process unless marked Celery (one worker, 2 processes, "
          "TICKETREC_SHARDS=2, a private redis-server; a query's 1,000 candidates go to one task: "
          "distributed.shards_for); CPU ms/query = this thread's CPU time per in-process query "
          "(its latency without the machine's other jobs, up to cache effects); "
          "K=0 scores every ticket. Stage figures are medians/p95 over "
          "the same queries. The Celery ratio's baseline is the in-process p95 of the same row. Exhaustive scoring's "
          "baseline is numpy summing the same matrix's bytes once as 64-bit integers (a memory scan); naive's "
          "baseline is precomputed scoring of "
          "the same 1,000 stored rows after one untimed pass over them. FTS5 column: the store's FTS5 pre-filter "
          f"alone (K=1000, {args.fts5_queries} queries), for comparison.")
    if profile:
        total = profile["encode_seconds"] + profile["stages"].get("BM25 terms (Porter stems)", 0.0)
        parts = "; ".join(f"{name.strip()} {seconds / total:.0%}" for name, seconds in profile["stages"].items())
        print(f"Where one encoding process spends a build's per-ticket work ({profile['tickets']:,} {args.kb} tickets, "
              f"{profile['tickets'] / total:,.0f} tickets/s in one process, shares of its time; stages nest as "
              f"listed): {parts}.")
    print("Command: .venv/bin/python benchmarks/serving.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
