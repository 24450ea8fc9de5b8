"""The S channel's encoder: speed of each backend and lever, and what each costs in ranking quality.

    .venv/bin/python benchmarks/encoder_speed.py                      # speed and quality, real text
    .venv/bin/python benchmarks/encoder_speed.py --only build --tickets 1000     # index-build-style rows
    .venv/bin/python benchmarks/encoder_speed.py --only query --queries 200      # one query at a time
    .venv/bin/python benchmarks/encoder_speed.py --only query --components-of MODEL_DIR    # a model's S components
    .venv/bin/python benchmarks/encoder_speed.py --only quality --backends onnx-int8,static
    .venv/bin/python benchmarks/encoder_speed.py --only quality --backends static-fitted   # fitted as training does
    .venv/bin/python benchmarks/encoder_speed.py --only ceiling --tickets 1000   # the matrix products alone

Speed ("index-build-style"): the S encoding of real-vocabulary tickets (`benchmarks/real_kb.py`: SeaMonkey bug
reports and SemEval-2016 threads recombined by sentence; needs `../shared/data/`), as an index build does it: the
texts of every component the model's metric uses, in chunks of 512 tickets. Rows add one lever at a time, from
today's path (sentence-transformers on torch, float32, every component of the config encoded, 256 word pieces) to
the default of new models; each is timed in one process on one thread (tickets per second of one core; the
machine's other jobs slow every row alike) and the last rows on both cores (two forked processes of one thread
each, as `ticketrec index` encodes, against one process of two threads). Query: one query's S encoding (the
components the metric uses), one query at a time, median and p95 over `--queries` queries after 10 untimed ones.

Components: the label-free product model on SeaMonkey keeps ALL–ALL and SUB–DESC (docs/results/seamonkey), so a
ticket needs ALL (subject + description + solution) and DESC, a query ALL (subject + description) and SUB; today's
`prepare` encoded every component of the config: SUB, DESC, SOL and ALL. `--components-of MODEL_DIR` takes instead
the components whose S vectors that model serves (`TicketModel.served_keys`).

Quality: S alone, zero-shot, for each backend and truncation length: SemEval-2016 dev rerank MAP (the Table 5 row
"S zero-shot": SUB+DESC merged on both sides, Manhattan distance, official scorer) and SeaMonkey duplicates
MRR@10 (the "MiniLM zero-shot" row: SUB+DESC against SUB+DESC+SOL, cosine, the knowledge base minus the query).
"static-fitted" is the static backend fitted to a knowledge base as training fits it (`static_fit.py`): on
SemEval-2016 train-part2's tickets for dev, on the SeaMonkey tickets outside every duplicate pair for the duplicates.

Ceiling: how fast the transformer could encode if it were nothing but its matrix products. A graph of the
encoder's dense layers only (per layer the fused Q/K/V projection, the output projection and the two feed-forward
matrices, at the packaged encoder's sizes, random weights), quantised as the export quantises (`quantize_dynamic`,
int8 weights per channel, activations on the fly), runs on every ticket's texts at their real word-piece lengths
on one thread: no tokeniser, attention scores, softmax, layer norm, GELU or pooling. What it reaches on one core,
twice that on two (perfect scaling), bounds from above what any lever of the encoder's own graph can reach.

Every table prints the command, the machine and its load average (1 min) before and after.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import multiprocessing
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from shared_data import DATA, SEMEVAL, seamonkey_links, seamonkey_tickets  # noqa: E402

SEMEVAL_DEV = SEMEVAL / "dev.xml"
CHUNK = 512
#: Components a ticket and a query need: the product model's (ALL–ALL, SUB–DESC), and every one (today's prepare).
USED = {"ticket": ("ALL", "DESC"), "query": ("ALL", "SUB")}
EVERY = {"ticket": ("SUB", "DESC", "SOL", "ALL"), "query": ("SUB", "DESC", "ALL")}


def load() -> float:
    return os.getloadavg()[0]


def machine() -> str:
    """The CPU's model name (Linux), architecture and core count: rates differ between machines of one kind."""
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
    except OSError:
        names = []
    return f"{names[0] if names else platform.processor() or 'unknown CPU'}, {platform.machine()}, {os.cpu_count()} cores"


def texts_of(item, comp: str, side: str) -> str:
    sol = getattr(item, "solution", "") or ""
    fields = {"SUB": item.subject, "DESC": item.description, "SOL": sol}
    if comp == "ALL":
        parts = ("SUB", "DESC", "SOL") if side == "ticket" else ("SUB", "DESC")
        return "\n".join(fields[p] for p in parts if fields[p])
    return fields[comp]


# -- speed -------------------------------------------------------------------------------------------------------
class Lever:
    """One row: backend, components, word pieces per component, whether each component is its own call (today)."""

    def __init__(self, name: str, backend: str, comps: dict, limits: dict, per_component: bool = False,
                 runs: tuple[int, bool] = (1, True)):
        self.name, self.backend, self.comps, self.limits = name, backend, comps, limits
        self.per_component, self.runs = per_component, runs

    def encode(self, encoder, items, side: str) -> None:
        if hasattr(encoder, "run_texts"):  # ONNX: texts per run, grouped by length or in the given order
            encoder.run_texts, encoder.sort_runs = self.runs
        comps = self.comps[side]
        if self.per_component:  # today's prepare: one call per component
            for comp in comps:
                self._call(encoder, [texts_of(x, comp, side) for x in items], self.limits.get(comp))
            return
        groups: dict = {}
        for comp in comps:
            groups.setdefault(self.limits.get(comp), []).append(comp)
        # one call for every component, as the model encodes (`TicketModel._sentence_vectors`)
        encoder.encode_groups([([texts_of(x, c, side) for c in group for x in items], limit)
                               for limit, group in groups.items()])

    def _call(self, encoder, texts, limit):
        encoder.encode(texts, max_tokens=limit)


def levers() -> list[Lever]:
    full = {c: 256 for c in ("SUB", "DESC", "SOL", "ALL")}
    short = {"SUB": 64, "DESC": 128, "SOL": 128, "ALL": 128}
    from recommender.model.pretrained import MAX_TOKENS

    return [
        Lever("today: torch fp32, every component, one call each", "torch", EVERY, full, per_component=True),
        Lever("+ only the components the metric uses", "torch", USED, full, per_component=True),
        Lever("+ one call: distinct texts once, sorted by length", "torch", USED, full),
        Lever("+ ONNX Runtime fp32, one text per run", "onnx", USED, full),
        Lever("  ONNX fp32, padded runs of 32 texts sorted by length", "onnx", USED, full, runs=(32, True)),
        Lever("+ int8 weights, one text per run", "onnx-int8", USED, full),
        Lever("  int8, padded runs of 32 texts sorted by length", "onnx-int8", USED, full, runs=(32, True)),
        Lever("  int8, padded runs of 32 texts in the given order", "onnx-int8", USED, full, runs=(32, False)),
        Lever("  int8, every component", "onnx-int8", EVERY, full),
        Lever("+ SUB cut to 64 word pieces (new models' default)", "onnx-int8", USED, dict(MAX_TOKENS)),
        Lever("  int8, DESC/SOL/ALL cut to 128 too", "onnx-int8", USED, short),
        Lever("static: distilled word-piece vectors (model2vec)", "static", USED, dict(MAX_TOKENS)),
    ]


_WORKER: dict = {}


def _init_worker(backend: str) -> None:
    import torch

    torch.set_num_threads(1)
    from recommender.model.pretrained import get_encoder

    _WORKER["encoder"] = get_encoder(backend)


def _encode_chunk(args) -> int:
    lever, items = args
    lever.encode(_WORKER["encoder"], items, "ticket")
    return len(items)


def time_build(lever: Lever, tickets, processes: int, threads: int) -> tuple[float, float]:
    """(tickets per second, CPU seconds per ticket) of encoding `tickets` in chunks."""
    import torch

    from recommender.model.pretrained import get_encoder

    chunks = [tickets[i : i + CHUNK] for i in range(0, len(tickets), CHUNK)]
    if processes <= 1:
        torch.set_num_threads(threads)
        encoder = get_encoder(lever.backend)
        _reset_session(encoder)
        lever.encode(encoder, tickets[:64], "ticket")  # warm-up
        started, cpu = time.perf_counter(), time.process_time()
        for chunk in chunks:
            lever.encode(encoder, chunk, "ticket")
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        return len(tickets) / wall, cpu / len(tickets)
    get_encoder(lever.backend)  # the export exists before the fork
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(processes, initializer=_init_worker, initargs=(lever.backend,)) as pool:
        pool.map(_encode_chunk, [(lever, tickets[:64])] * processes)  # warm-up: each worker opens its session
        started = time.perf_counter()
        done = sum(pool.imap(_encode_chunk, [(lever, c) for c in chunks]))
        wall = time.perf_counter() - started
    return done / wall, float("nan")


def components_of(model_dir: str) -> dict[str, tuple[str, ...]]:
    """The components whose S vectors the model in `model_dir` serves, per side (as `USED`)."""
    from recommender.model.bundle import TicketModel

    model = TicketModel.load(model_dir)
    return {side: tuple(c for c in EVERY["ticket"] if f"{c}.S" in model.served_keys(side)) for side in USED}


def _reset_session(encoder) -> None:
    """Open the ONNX session again, so it takes this process's current torch thread count."""
    if hasattr(encoder, "_session"):
        encoder._session = None


def time_queries(backend: str, queries, threads: int, limits: dict) -> tuple[float, float, float]:
    """(p50, p95, CPU p50) ms of one query's S encoding: the query components of `USED`."""
    import torch

    from recommender.model.pretrained import get_encoder

    torch.set_num_threads(threads)
    encoder = get_encoder(backend)
    _reset_session(encoder)
    lever = Lever("query", backend, USED, limits)
    for q in queries[:10]:
        lever.encode(encoder, [q], "query")
    times, cpu = [], []
    for q in queries[10:]:
        started, used = time.perf_counter(), time.process_time()
        lever.encode(encoder, [q], "query")
        times.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - used) * 1000)
    return float(np.percentile(times, 50)), float(np.percentile(times, 95)), float(np.percentile(cpu, 50))


def speed(args) -> None:
    """The index-build rows, both cores, and the query rows (`--only build` / `--only query`: one part)."""
    from real_kb import iter_real_queries, real_tickets

    tickets = real_tickets(args.tickets, seed=0) if args.only != "query" else []
    queries = list(iter_real_queries(args.queries + 10, seed=0)) if args.only != "build" else []
    cmd = " ".join(["benchmarks/encoder_speed.py", *sys.argv[1:]])
    print(f"\n### S encoding speed: {len(tickets):,} real-vocabulary tickets, {max(len(queries) - 10, 0)} queries; "
          f"components: a ticket's {', '.join(USED['ticket'])}, a query's {', '.join(USED['query'])}")
    print(f"command: .venv/bin/python {cmd}")
    print(f"machine: {machine()}; load before {load():.2f}\n")
    if args.only != "query":
        build(args, tickets)
    if args.only != "build":
        query_rows(queries)
    print(f"\nload after: {load():.2f}")


def build(args, tickets) -> None:
    """Index-build-style rows: one lever at a time on one core, then the default on both cores."""
    from recommender.model.pretrained import get_encoder

    texts = [texts_of(t, c, "ticket") for c in USED["ticket"] for t in tickets]
    pieces = get_encoder("onnx-int8")._tokenizer_for(10_000)
    long_subjects = np.mean([len(e.ids) > 64 for e in pieces.encode_batch([t.subject for t in tickets])])
    print(f"distinct texts: {len(set(texts)):,} of {len(texts):,} component texts; subjects over 64 word pieces: "
          f"{100 * long_subjects:.2f} %; {_pieces(pieces, tickets, 'ticket')}\n")
    print("| lever | backend | tickets/s, 1 core | CPU ms per ticket | load |")
    print("|---|---|---|---|---|")
    rows = levers() if not args.levers else [levers()[int(i)] for i in args.levers.split(",")]
    for lever in rows:
        rate, cpu = time_build(lever, tickets, 1, 1)
        print(f"| {lever.name} | {lever.backend} | {rate:,.1f} | {cpu * 1000:.1f} | {load():.2f} |", flush=True)
    print("\n| both cores | tickets/s | load |")
    print("|---|---|---|")
    for lever in (x for x in levers() if "default" in x.name or x.backend == "static"):
        for processes, threads in ((2, 1), (1, 2)):
            rate, _ = time_build(lever, tickets, processes, threads)
            print(f"| {lever.backend}: {processes} process(es) × {threads} thread(s) | {rate:,.1f} | {load():.2f} |",
                  flush=True)


def _lengths(tokenizer, items, comp: str, side: str, limits: dict | None = None) -> list[int]:
    """Word pieces of each item's `comp` text, cut at `limits[comp]` (default 256)."""
    limit = (limits or {}).get(comp, 256)
    return [min(len(e.ids), limit) for e in tokenizer.encode_batch([texts_of(x, comp, side) for x in items])]


def _pieces(tokenizer, items, side: str) -> str:
    """Mean word pieces (at most 256) of each used component's text."""
    out = []
    for comp in USED[side]:
        out.append(f"{comp} {np.mean(_lengths(tokenizer, items, comp, side)):.0f}")
    return f"mean word pieces of a {side}'s " + ", ".join(out)


def query_rows(queries) -> None:
    """One query at a time, per backend, on one and on two threads."""
    from recommender.model.pretrained import MAX_TOKENS, get_encoder

    print(_pieces(get_encoder("onnx-int8")._tokenizer_for(10_000), queries[10:], "query"))

    print("\n| one query's S encoding | threads | p50 ms | p95 ms | CPU ms p50 | load |")
    print("|---|---|---|---|---|---|")
    for backend in ("torch", "onnx", "onnx-int8", "static"):
        for threads in (1, 2):
            limits = dict(MAX_TOKENS) if backend in ("onnx-int8", "static") else {c: 256 for c in MAX_TOKENS}
            p50, p95, cpu = time_queries(backend, queries, threads, limits)
            print(f"| {backend} | {threads} | {p50:.1f} | {p95:.1f} | {cpu:.1f} | {load():.2f} |", flush=True)


# -- quality -----------------------------------------------------------------------------------------------------
def semeval_map(encoder, limit: int | None) -> float:
    """S zero-shot rerank MAP on SemEval-2016 dev (official scorer): SUB+DESC merged on both sides, Manhattan."""
    from recommender.data.importers import load as load_file
    from recommender.evaluation.metrics import official_semeval, rank_by_score

    data = load_file(SEMEVAL_DEV)
    queries, tickets = data.query_map(), data.ticket_map()
    by_query: dict[str, list] = {}
    for p in data.pairs:
        by_query.setdefault(p.query_id, []).append(p)
    qtexts = {q: texts_of(queries[q], "ALL", "query") for q in by_query}
    ttexts = {t.id: "\n".join(x for x in (t.subject, t.description) if x) for t in tickets.values()}
    qv = dict(zip(qtexts, encoder.encode(list(qtexts.values()), max_tokens=limit)))
    tv = dict(zip(ttexts, encoder.encode(list(ttexts.values()), max_tokens=limit)))
    run, qrels = {}, {}
    for qid, pairs in by_query.items():
        pairs = sorted(pairs, key=lambda p: data.pair_meta.get((qid, p.ticket_id), {}).get("ir_rank", 0))
        run[qid] = rank_by_score([(p.ticket_id, -float(np.abs(qv[qid] - tv[p.ticket_id]).sum())) for p in pairs])
        qrels[qid] = {p.ticket_id: p.score for p in pairs}
    return official_semeval(run, qrels)["official_map"]


def seamonkey_mrr(encoder, limit: int | None) -> tuple[float, float, float]:
    """MiniLM-style zero-shot MRR@10 (and its 95 % interval) on the SeaMonkey duplicates."""
    from recommender.data.records import query_text, ticket_text
    from recommender.evaluation.duplicates import evaluate_duplicates

    tickets = seamonkey_tickets()
    links = seamonkey_links(t.id for t in tickets)
    ids = [t.id for t in tickets]
    matrix = encoder.encode([ticket_text(t) for t in tickets], max_tokens=limit)

    def rank(query, n):
        q = encoder.encode([query_text(query)], max_tokens=limit)[0]
        return [ids[int(i)] for i in np.argsort(-(matrix @ q), kind="stable")[:n]]

    [row] = evaluate_duplicates(tickets, links, {"S": rank}, n_boot=2000, seed=0)
    return row["MRR@10"], row["MRR@10_low"], row["MRR@10_high"]


def fitted_static(tickets, workdir: Path):
    """The packaged encoder's static backend fitted to `tickets` (`static_fit.py`, as training fits it)."""
    from recommender.model import static_fit
    from recommender.model.pretrained import get_encoder, load_encoder, package_dir

    static, teacher = get_encoder("static"), get_encoder("onnx-int8")
    vectors, report = static_fit.fit_vectors(static, teacher, static_fit.fit_texts(tickets), seed=0)
    static_fit.write_fitted(package_dir(), static, vectors, workdir, report)
    print(f"<!-- fitted on {report['texts']} texts: held-out distance {report['held_out_distance_mapped']} mapped, "
          f"{report['held_out_distance']} fitted, {report['epochs']} epochs -->", flush=True)
    return load_encoder(workdir, None, "static", name="static, fitted")


def fitted_row(limit: int) -> tuple[float, float, float, float]:
    """S alone on the static backend fitted as training would: on SemEval-2016 train-part2's tickets for dev, and
    on the SeaMonkey tickets of no duplicate pair for the duplicates (neither a query nor its partner is fitted)."""
    import tempfile

    from recommender.data.importers import load as load_file

    semeval_kb = load_file(SEMEVAL / "train-part2.xml").tickets
    tickets = seamonkey_tickets()
    links = seamonkey_links(t.id for t in tickets)
    paired = {i for link in links for i in link}
    with tempfile.TemporaryDirectory() as tmp:
        m = semeval_map(fitted_static(semeval_kb, Path(tmp) / "semeval"), limit)
        mrr = seamonkey_mrr(fitted_static([t for t in tickets if t.id not in paired], Path(tmp) / "seamonkey"), limit)
    return (m, *mrr)


def quality(args) -> None:
    import torch

    from recommender.model.pretrained import get_encoder

    torch.set_num_threads(os.cpu_count() or 1)
    cmd = " ".join(["benchmarks/encoder_speed.py", *sys.argv[1:]])
    print("\n### S alone, zero-shot: quality by backend and truncation")
    print(f"command: .venv/bin/python {cmd}; load before {load():.2f}\n")
    print("| backend | word pieces | SemEval-2016 dev rerank MAP | SeaMonkey duplicates MRR@10 [95 % CI] |")
    print("|---|---|---|---|")
    combos = (("torch", 256), ("onnx", 256), ("onnx-int8", 256), ("onnx-int8", 128), ("onnx-int8", 64), ("static", 256),
              ("static-fitted", 256))
    for backend, limit in combos if not args.backends else [c for c in combos if c[0] in args.backends.split(",")]:
        if backend == "static-fitted":
            m, mrr, low, high = fitted_row(limit)
        else:
            encoder = get_encoder(backend)
            m = semeval_map(encoder, limit)
            mrr, low, high = seamonkey_mrr(encoder, limit)
        print(f"| {backend} | {limit} | {m:.2f} | {mrr:.3f} [{low:.3f}, {high:.3f}] |", flush=True)
    print(f"\nload after: {load():.2f}")


def dense_graph(path: Path) -> tuple[Path, int]:
    """The packaged encoder's dense layers as an int8 ONNX graph (see the module's "Ceiling"); (its path, the
    multiply-adds it does per word piece)."""
    import json

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from recommender.model.onnx_encoder import _OPSET, quantize_int8
    from recommender.model.pretrained import package_dir

    config = json.loads((package_dir() / "config.json").read_text(encoding="utf-8"))
    hidden, inner, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    rng = np.random.default_rng(0)
    nodes, weights, outputs = [], [], []

    def matmul(x: str, rows: int, cols: int, name: str) -> str:
        w = (rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"w_{name}"))
        nodes.append(helper.make_node("MatMul", [x, f"w_{name}"], [name]))
        return name

    x = "x"
    for layer in range(layers):
        qkv = matmul(x, hidden, 3 * hidden, f"qkv{layer}")  # one fused product, as the optimised export has it
        outputs.append(helper.make_tensor_value_info(qkv, TensorProto.FLOAT, ["tokens", 3 * hidden]))
        attended = matmul(x, hidden, hidden, f"o{layer}")
        up = matmul(x, hidden, inner, f"up{layer}")
        down = matmul(up, inner, hidden, f"down{layer}")
        nodes.append(helper.make_node("Add", [attended, down], [f"x{layer}"]))
        x = f"x{layer}"
    outputs.insert(0, helper.make_tensor_value_info(x, TensorProto.FLOAT, ["tokens", hidden]))
    graph = helper.make_graph(nodes, "dense_layers", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                      ["tokens", hidden])],
                              outputs, weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)])
    model.ir_version = 8
    fp32, int8 = path / "dense_fp32.onnx", path / "dense_int8.onnx"
    onnx.save(model, str(fp32))
    quantize_int8(fp32, int8)
    return int8, layers * (4 * hidden * hidden + 2 * hidden * inner)


def ceiling(args) -> None:
    """The dense layers alone at the real texts' lengths, one core: the most the transformer could encode."""
    import tempfile

    import onnxruntime as ort
    from real_kb import iter_real_queries, real_tickets

    from recommender.model.pretrained import MAX_TOKENS, get_encoder

    tickets = real_tickets(args.tickets, seed=0)
    tokenizer = get_encoder("onnx-int8")._tokenizer_for(10_000)
    lengths = {comp: _lengths(tokenizer, tickets, comp, "ticket", MAX_TOKENS) for comp in USED["ticket"]}
    cmd = " ".join(["benchmarks/encoder_speed.py", *sys.argv[1:]])
    print(f"\n### The transformer's ceiling: its dense layers alone, int8, {len(tickets):,} real-vocabulary tickets")
    print(f"command: .venv/bin/python {cmd}")
    print(f"machine: {machine()}; load before {load():.2f}\n")
    with tempfile.TemporaryDirectory() as tmp:
        path, per_piece = dense_graph(Path(tmp))
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        hidden = session.get_inputs()[0].shape[1]
        rng = np.random.default_rng(1)
        inputs = {n: rng.standard_normal((n, hidden)).astype(np.float32) for n in range(1, 257)}
        for n in (16, 64, 128, 256):  # warm-up
            session.run(None, {"x": inputs[n]})
        print(f"multiply-adds per word piece in the dense layers: {per_piece / 1e6:.2f} M\n")
        print("| texts of each ticket | word pieces per ticket | dense layers alone: tickets/s, 1 core | "
              "G multiply-adds/s | tickets/s on 2 cores at perfect scaling | load |")
        print("|---|---|---|---|---|---|")
        for comps in (USED["ticket"], ("ALL",)):
            pieces = [n for comp in comps for n in lengths[comp]]
            started = time.process_time()
            for n in pieces:
                session.run(None, {"x": inputs[n]})
            cpu = time.process_time() - started
            rate = len(tickets) / cpu
            print(f"| {' + '.join(comps)} | {np.sum(pieces) / len(tickets):.0f} | {rate:,.1f} | "
                  f"{np.sum(pieces) * per_piece / cpu / 1e9:.0f} | {2 * rate:,.1f} | {load():.2f} |", flush=True)
        queries = list(iter_real_queries(args.queries, seed=0))
        per_query = list(zip(*(_lengths(tokenizer, queries, comp, "query", MAX_TOKENS) for comp in USED["query"])))
        times = []
        for pieces in per_query:
            started = time.process_time()
            for n in pieces:
                session.run(None, {"x": inputs[n]})
            times.append((time.process_time() - started) * 1000)
        print(f"\n| one query's {', '.join(USED['query'])} ({len(queries)} real-vocabulary queries) | word pieces "
              "per query | dense layers alone, 1 thread: CPU ms p50 | p95 | load |")
        print("|---|---|---|---|---|")
        print(f"| the texts one after another | {np.mean([sum(x) for x in per_query]):.0f} | "
              f"{np.percentile(times, 50):.1f} | {np.percentile(times, 95):.1f} | {load():.2f} |")
    print(f"\nload after: {load():.2f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tickets", type=int, default=2000, help="real-vocabulary tickets encoded per row")
    parser.add_argument("--queries", type=int, default=200, help="timed queries per query row")
    parser.add_argument("--only", choices=["speed", "build", "query", "quality", "ceiling"], default=None,
                        help="one part: speed (build + query), build, query, quality or ceiling (default: all)")
    parser.add_argument("--levers", default="", help="comma-separated row numbers of the speed table (default: all)")
    parser.add_argument("--backends", default="", help="quality: comma-separated backends (default: all)")
    parser.add_argument("--components-of", metavar="MODEL_DIR", default=None,
                        help="speed: encode the components whose S vectors this model serves (default: ALL and DESC "
                             "of a ticket, ALL and SUB of a query)")
    args = parser.parse_args(argv)
    if args.components_of:
        USED.update(components_of(args.components_of))
    from real_kb import available

    if not available():
        print(f"the real-vocabulary data is not under {DATA} (see ../shared/data/README.md); nothing measured",
              file=sys.stderr)
        return 2
    if args.only in (None, "speed", "build", "query"):
        speed(args)
    if args.only in (None, "quality"):
        quality(args)
    if args.only in (None, "ceiling"):
        ceiling(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
