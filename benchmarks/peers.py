"""ticketrec's BM25 postings and their peers, side by side in one sitting, on the real-vocabulary knowledge base.

For each size (default 100k and 1M tickets of `benchmarks/real_kb.py`, seed 0) every system builds its index
from the same tickets and answers the same queries (`real_kb.iter_real_queries`: subject + description, 1–6 real
sentences), one system at a time, each in a fresh process (its peak RSS is
its own), one query at a time on one thread:

    ticketrec   the index version's BM25 postings (`recommender.lexical.postings`): eager float32 impacts, windows of
                rows, block-max MaxScore from 131,072 tickets on (the default "auto"); the rows below it time each
                `top_k` method: skipping, no skipping (every posting added), one accumulator without windows
    bm25s       bm25s (numba backend, k1 1.2, b 0.75, Lucene IDF, its English stop words, no stemmer), one text:
                subject + description + solution
    tantivy     tantivy-py, one field (subject + description + solution), its en_stem tokenizer, one writer thread
    fts5        SQLite FTS5 through ticketrec's own `Fts5Searcher` (porter unicode61, column weights 2/1/1)
    faiss       faiss IndexFlatIP, exact inner product over unit vectors of the S channel's shape (384 floats);
                random vectors (encoding 1M tickets with MiniLM is infeasible on 2 cores), said so in the table

Build: the index from the tickets' text (the knowledge base is generated before the clock starts), single-threaded
where the peer lets us choose; ticketrec's memory-mapped postings are then mapped in, as a serving process does.
Query p50 / p95: wall time of one call (query analysis included) after WARMUP queries that are not counted.
Ratios name their baseline (bm25s for the lexical systems). Bytes per ticket: the index files on disk (bm25s: its
saved index; faiss: the vectors). Peak RSS: the process's maximum resident set (build and queries; Python and the
libraries included). Top-10 overlap: the share of ticketrec's top 10 that the
system also returns in its top 10, mean over the queries (the analysers, fields and IDF differ: docs/results/bm25.md).

    .venv/bin/python benchmarks/peers.py                                   # 100k and 1M (1M: several GB, minutes)
    .venv/bin/python benchmarks/peers.py --sizes 20000 --queries 100 --systems ticketrec bm25s

The peers come from the optional `bench` extra: `make bench-deps` (pip install -e '.[bench]'); a missing one is
reported in its row with that command, and the others still run.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import real_kb  # noqa: E402

SYSTEMS = ("ticketrec", "bm25s", "tantivy", "fts5", "faiss")
#: The Python module each system needs (the `bench` extra provides the peers).
MODULES = {"bm25s": "bm25s", "tantivy": "tantivy", "faiss": "faiss"}
KS = (10, 1000)
#: ticketrec's other `top_k` methods, timed in the same process (rows of their own).
VARIANTS = {"maxscore": "ticketrec (skipping)", "windowed": "ticketrec (no skipping)",
            "exhaustive": "ticketrec (one accumulator, no windows)"}
WARMUP = 10
#: The S channel's width (all-MiniLM-L6-v2).
S_DIM = 384
#: Queries whose top 10 is compared across systems.
OVERLAP_QUERIES = 100
INSTALL = "make bench-deps  (or: .venv/bin/pip install -e '.[bench]')"


def _texts(n_queries: int, seed: int) -> list[str]:
    return [f"{q.subject}\n{q.description}" for q in real_kb.iter_real_queries(n_queries, seed)]


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def _chunks(n: int, seed: int, size: int = 512):
    """(first row, tickets) of the knowledge base, `size` at a time: the systems' build clocks stop while it is made."""
    chunk, start = [], 0
    for ticket in real_kb.iter_real_tickets(n, seed):
        chunk.append(ticket)
        if len(chunk) == size:
            yield start, chunk
            start, chunk = start + size, []
    if chunk:
        yield start, chunk


def _time_queries(search, texts: list[str], k: int) -> tuple[list[float], list[list[int]]]:
    """Wall seconds of `search(text, k)` per query of texts[WARMUP:] (the first WARMUP run before, uncounted);
    the top 10 rows of each timed query."""
    for text in texts[:WARMUP]:
        search(text, k)
    seconds, tops = [], []
    for text in texts[WARMUP:]:
        started = time.perf_counter()
        rows = search(text, k)
        seconds.append(time.perf_counter() - started)
        tops.append([int(r) for r in rows[:10]])
    return seconds, tops


# -- the systems (each runs in its own process: `--child`) --------------------------------------------------------
def _ticketrec(n: int, seed: int, work: Path, texts: list[str], fts5_queries: int) -> dict:
    from recommender.lexical.postings import Bm25Postings, PostingsBuilder, ticket_terms

    builder = PostingsBuilder(n, workdir=work)
    build = 0.0
    for start, chunk in _chunks(n, seed):
        started = time.perf_counter()
        builder.add(np.arange(start, start + len(chunk)), ticket_terms(chunk))
        build += time.perf_counter() - started
    started = time.perf_counter()
    stats = builder.write(work)
    bm25 = Bm25Postings.open(work, stats, n)
    build += time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    for arr in bm25.hot_arrays():  # map the pages in, as a serving process does at open (`TicketIndex.warm`)
        flat = np.asarray(arr).reshape(-1)
        float(flat[:: max(1, 4096 // flat.itemsize)].sum())
    out = {"build_s": build, "bytes": _size(work), "queries": {}, "variants": {m: {} for m in VARIANTS},
           "note": f"peak RSS after the build (streamed postings, before any query): {rss / 2**20:,.0f} MB at {n:,}"}
    for k in KS:
        out["queries"][str(k)] = _time_queries(lambda t, k: bm25.top_k(t, k)[0], texts, k)
        for method in VARIANTS:
            out["variants"][method][str(k)] = _time_queries(lambda t, k: bm25.top_k(t, k, method)[0], texts, k)
    return out


def _bm25s(n: int, seed: int, work: Path, texts: list[str], fts5_queries: int) -> dict:
    import bm25s

    corpus = [f"{t.subject}\n{t.description}\n{t.solution}" for t in real_kb.iter_real_tickets(n, seed)]
    started = time.perf_counter()
    tokens = bm25s.tokenize(corpus, stopwords="en", show_progress=False)
    del corpus
    retriever = bm25s.BM25(k1=1.2, b=0.75, backend="numba")  # ticketrec's and tantivy's parameters (its default k1: 1.5)
    retriever.index(tokens, show_progress=False)
    build = time.perf_counter() - started
    del tokens
    retriever.save(str(work / "bm25s"))

    def search(text: str, k: int):
        query = bm25s.tokenize([text], stopwords="en", show_progress=False, return_ids=False)
        docs, _ = retriever.retrieve(query, k=min(k, n), show_progress=False, n_threads=1, backend_selection="numba")
        return docs[0]

    return {"build_s": build, "bytes": _size(work / "bm25s"),
            "queries": {str(k): _time_queries(search, texts, k) for k in KS}}


def _tantivy(n: int, seed: int, work: Path, texts: list[str], fts5_queries: int) -> dict:
    import tantivy

    from recommender.lexical.analyzer import term_tokens

    builder = tantivy.SchemaBuilder()
    builder.add_text_field("body", tokenizer_name="en_stem", index_option="freq")
    builder.add_unsigned_field("row", stored=True)
    schema = builder.build()
    (work / "tantivy").mkdir()
    index = tantivy.Index(schema, path=str(work / "tantivy"))
    writer = index.writer(heap_size=256_000_000, num_threads=1)
    build = 0.0
    for start, chunk in _chunks(n, seed):
        started = time.perf_counter()
        for i, t in enumerate(chunk, start):
            writer.add_document(tantivy.Document(body=f"{t.subject}\n{t.description}\n{t.solution}", row=i))
        build += time.perf_counter() - started
    started = time.perf_counter()
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    build += time.perf_counter() - started
    searcher = index.searcher()

    def search(text: str, k: int, rows: bool = False):
        # the query's distinct words (no query syntax), OR'ed
        query = index.parse_query(" ".join(dict.fromkeys(term_tokens(text))) or "zzzz", ["body"])
        hits = searcher.search(query, k).hits
        if not rows:
            return [address.doc for _, address in hits]  # segment-local ids (the rows are fetched below)
        return [searcher.doc(address)["row"][0] for _, address in hits]

    seconds = {str(k): _time_queries(search, texts, k)[0] for k in KS}
    tops = [search(text, 10, rows=True) for text in texts[WARMUP:]]  # rows fetched outside the timing
    return {"build_s": build, "bytes": _size(work / "tantivy"), "queries": {k: (s, tops) for k, s in seconds.items()},
            "segments": len(searcher.segment_readers()) if hasattr(searcher, "segment_readers") else None}


def _fts5(n: int, seed: int, work: Path, texts: list[str], fts5_queries: int) -> dict:
    from recommender.data.store import Dataset, Store
    from recommender.lexical.searchers import Fts5Searcher

    store = Store(work / "kb.sqlite3")
    build = 0.0  # the tickets table and its FTS5 index, kept in sync by the store's triggers
    for _, batch in _chunks(n, seed, 50_000):
        started = time.perf_counter()
        store.import_dataset(Dataset(batch, source="peers"))
        build += time.perf_counter() - started
    searcher = Fts5Searcher(store)
    prefix = f"real-{seed}-"

    def search(text: str, k: int):
        return [int(tid[len(prefix):]) for tid, _ in searcher.search(text, k)]

    few = texts[: WARMUP + fts5_queries]
    out = {"build_s": build, "bytes": _size(work / "kb.sqlite3"), "queries": {str(k): _time_queries(search, few, k) for k in KS},
           "note": f"{fts5_queries} queries; bytes: the whole database (ticket text included)"}
    store.close()
    return out


def _faiss(n: int, seed: int, work: Path, texts: list[str], fts5_queries: int) -> dict:
    import faiss

    faiss.omp_set_num_threads(1)
    rng = np.random.default_rng(seed)
    vectors = np.empty((n, S_DIM), np.float32)
    for start in range(0, n, 65536):  # random unit vectors of the S channel's shape
        block = rng.standard_normal((min(65536, n - start), S_DIM), dtype=np.float32)
        vectors[start : start + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    started = time.perf_counter()
    index = faiss.IndexFlatIP(S_DIM)
    index.add(vectors)
    build = time.perf_counter() - started
    del vectors
    queries = rng.standard_normal((len(texts), S_DIM), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    by_text = {text: queries[i : i + 1] for i, text in enumerate(texts)}

    def search(text: str, k: int):
        return index.search(by_text[text], min(k, n))[1][0]

    return {"build_s": build, "bytes": n * S_DIM * 4, "queries": {str(k): _time_queries(search, texts, k) for k in KS},
            "note": "random unit vectors of the S shape (no text)"}


RUNNERS = {"ticketrec": _ticketrec, "bm25s": _bm25s, "tantivy": _tantivy, "fts5": _fts5, "faiss": _faiss}


def _child(system: str, n: int, seed: int, n_queries: int, fts5_queries: int, workdir: Path, out: Path) -> None:
    texts = _texts(n_queries + WARMUP, seed)
    work = Path(tempfile.mkdtemp(prefix=f"peers-{system}-", dir=workdir))
    try:
        result = RUNNERS[system](n, seed, work, texts, fts5_queries)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out.write_text(json.dumps(result))


# -- the table ----------------------------------------------------------------------------------------------------
def _load() -> str:
    return Path("/proc/loadavg").read_text().split(" ")[0] if Path("/proc/loadavg").exists() else "?"


def _ms(seconds: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(seconds) * 1000.0, q))


def _overlap(a: list[list[int]], b: list[list[int]]) -> float:
    pairs = [(x, y) for x, y in zip(a[:OVERLAP_QUERIES], b[:OVERLAP_QUERIES]) if x]
    return float(np.mean([len(set(x) & set(y)) / len(x) for x, y in pairs])) if pairs else float("nan")


def main(argv: list[str] | None = None) -> int:
    """Run every system for every size in fresh processes; print the table, the command and the load."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--queries", type=int, default=200, help="timed queries per system and k (after the warm-up)")
    ap.add_argument("--fts5-queries", type=int, default=20, help="FTS5 is much slower: fewer queries")
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path, default=None, help="where the indexes are built (deleted after each)")
    ap.add_argument("--window", type=int, default=None, help="ticketrec's top-k window in rows (default: postings.WINDOW)")
    ap.add_argument("--child", nargs=2, metavar=("SYSTEM", "SIZE"), help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    workdir = args.workdir or Path(tempfile.gettempdir())
    if args.window:
        from recommender.lexical import postings

        postings.WINDOW = args.window
    if args.child:
        _child(args.child[0], int(args.child[1]), args.seed, args.queries, args.fts5_queries, workdir, args.out)
        return 0
    if not real_kb.available():
        print(f"error: the real-vocabulary knowledge base needs the shared data under {real_kb.DATA_DIR} "
              "(SeaMonkey and SemEval-2016; see benchmarks/real_kb.py)", file=sys.stderr)
        return 2
    command = "benchmarks/peers.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"command: .venv/bin/python {command}".rstrip())
    results: dict[tuple[str, int], dict] = {}
    for n in args.sizes:
        for system in args.systems:
            module = MODULES.get(system)
            if module and importlib.util.find_spec(module) is None:
                results[(system, n)] = {"missing": f"{module} is not installed: {INSTALL}"}
                print(f"{system}: {module} is not installed; install the bench extra: {INSTALL}", file=sys.stderr)
                continue
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                before = _load()
                started = time.perf_counter()
                child = subprocess.run([sys.executable, __file__, "--child", system, str(n), "--seed", str(args.seed),
                                        "--queries", str(args.queries), "--fts5-queries", str(args.fts5_queries),
                                        "--workdir", str(workdir), "--out", out.name]
                                       + (["--window", str(args.window)] if args.window else []), cwd=ROOT)
                if child.returncode != 0:
                    results[(system, n)] = {"missing": f"failed (exit {child.returncode}; its error is above)"}
                    continue
                result = json.loads(Path(out.name).read_text())
            result["load"] = f"{before} → {_load()}"
            results[(system, n)] = result
            print(f"{system} at {n:,}: {time.perf_counter() - started:.0f} s (load {result['load']})", file=sys.stderr)
    _print_table(results, args)
    return 0


def _print_table(results: dict, args) -> None:
    from recommender.lexical import postings

    print(f"\nReal-vocabulary knowledge base (benchmarks/real_kb.py, seed {args.seed}); {args.queries} queries "
          f"(FTS5: {args.fts5_queries}), {WARMUP} warm-up queries not counted; one thread; load = 1-minute load "
          f"average before → after each system ({os.cpu_count()} cores); ticketrec's window {postings.WINDOW} rows")
    header = ("| tickets | system | build s | top-10 p50 / p95 ms | top-1000 p50 / p95 ms | × bm25s (p50 top-10 / "
              "top-1000) | bytes / ticket | peak RSS MB | top-10 overlap with ticketrec | load |")
    print(header)
    print("|" + "|".join("---" for _ in header.split("|")[1:-1]) + "|")
    for n in args.sizes:
        base = results.get(("bm25s", n), {})
        ours = results.get(("ticketrec", n), {})
        rows = []
        for system in args.systems:
            r = results.get((system, n))
            if r is None:
                continue
            if "missing" in r:
                rows.append(f"| {n:,} | {system} | {r['missing']} |||||||")
                continue
            rows.append(_row(n, system, r, r["queries"], base, ours))
            for method, label in VARIANTS.items():
                if method in r.get("variants", {}):
                    rows.append(_row(n, label, r, r["variants"][method], base, ours))
        print("\n".join(rows))
    for n in args.sizes:
        for system in args.systems:
            note = results.get((system, n), {}).get("note")
            if note:
                print(f"- {system} ({n:,}): {note}")
    for n in args.sizes:
        b, t = results.get(("bm25s", n), {}), results.get(("tantivy", n), {})
        if "queries" in b and "queries" in t:
            print(f"- {n:,} tickets: top-10 overlap bm25s vs tantivy {_overlap(b['queries']['10'][1], t['queries']['10'][1]):.2f}")


def _row(n: int, name: str, r: dict, queries: dict, base: dict, ours: dict) -> str:
    t10, t1000 = queries["10"][0], queries["1000"][0]
    ratio = "—"
    if "queries" in base and name != "faiss":
        ratio = (f"{_ms(t10, 50) / _ms(base['queries']['10'][0], 50):.2f} / "
                 f"{_ms(t1000, 50) / _ms(base['queries']['1000'][0], 50):.2f}")
    overlap = f"{_overlap(ours['queries']['10'][1], queries['10'][1]):.2f}" if "queries" in ours and name != "faiss" else "—"
    return (f"| {n:,} | {name} | {r['build_s']:.1f} | {_ms(t10, 50):.2f} / {_ms(t10, 95):.2f} | "
            f"{_ms(t1000, 50):.2f} / {_ms(t1000, 95):.2f} | {ratio} | {r['bytes'] / n:,.0f} | "
            f"{r['peak_rss'] / 2**20:,.0f} | {overlap} | {r['load']} |")


if __name__ == "__main__":
    sys.exit(main())
