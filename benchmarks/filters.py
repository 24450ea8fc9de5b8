"""What a metadata filter costs a query, on a real knowledge base made large.

SeaMonkey's bug reports, with the columns their export carries besides the text (status, resolution, priority,
created, resolved), are copied `--copies` times under new ids (53,800 tickets at 50), indexed with a trained model
(`--model DIR`, e.g. SeaMonkey's paper's channels: `ticketrec train --no-pretrained`), and asked `--queries`
queries (SeaMonkey tickets' subject and description) in process, without a filter and with each filter below.
Per filter: the share of tickets that pass, the median and 95th percentile of the query's latency and of its
candidate stage (after WARMUP untimed queries); then the first query after one ticket changed (the engine reads its
metadata), after one was removed (it reads the store's ids), and with every ticket's metadata to read (after a
reindex, or changes to many: `Recommender.metadata_table`), with that table's memory (tracemalloc).

    .venv/bin/python benchmarks/filters.py --model DIR [--copies 50] [--queries 30]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shared_data import SEAMONKEY, seamonkey_tickets  # noqa: E402

WARMUP = 3
FILTERS = (
    [],
    ["resolution=FIXED"],
    ["status!=RESOLVED,VERIFIED"],
    ["created>=2024-01"],
    ["status=RESOLVED", "resolution=FIXED,WORKSFORME"],
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a trained model directory (its vocabulary should fit SeaMonkey)")
    ap.add_argument("--kb", default=str(SEAMONKEY), help="a SeaMonkey-style export")
    ap.add_argument("--copies", type=int, default=50, help="copies of the knowledge base (new ids)")
    ap.add_argument("--queries", type=int, default=30, help="queries per filter")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from recommender.config import Settings
    from recommender.data.filters import parse_filter
    from recommender.data.records import Query, Ticket
    from recommender.data.store import Dataset, Store
    from recommender.model.bundle import TicketModel
    from recommender.serving.engine import Recommender
    from recommender.serving.index_build import build_index

    base = seamonkey_tickets(args.kb)
    tickets = [Ticket(f"{t.id}-{k}", t.subject, t.description, t.solution, t.metadata)
               for k in range(args.copies) for t in base]
    rng = np.random.default_rng(0)
    asked = [base[i] for i in rng.choice(len(base), size=args.queries + WARMUP, replace=False)]
    queries = [Query(t.subject, t.description) for t in asked]
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings.from_env({"TICKETREC_HOME": tmp, "TICKETREC_MODEL": args.model})
        store = Store(settings.db)
        store.import_dataset(Dataset(tickets, source="benchmark"))
        model = TicketModel.load(args.model)
        started = time.perf_counter()
        build_index(store, model, settings, progress=True)
        build_s = time.perf_counter() - started
        engine = Recommender(settings, store=store, model=model)
        rows = []
        for conditions in FILTERS:
            where = parse_filter(conditions)
            passing = (float(engine.metadata_table(engine.index).mask(where).mean()) if where else 1.0)
            for q in queries[:WARMUP]:
                engine.recommend(q, where=where)
            total, candidates = [], []
            for q in queries[WARMUP:]:
                answer = engine.recommend(q, where=where)
                total.append(answer.info.timings["total"] * 1000)
                candidates.append(answer.info.timings["prefilter"] * 1000)
            rows.append((" and ".join(conditions) or "(none)", passing, np.median(total), np.percentile(total, 95),
                         np.median(candidates), np.percentile(candidates, 95)))
        # changes to the store: the next filtered query reads the changed tickets' metadata (a ticket sent over the
        # API), or every ticket's again (a removal)
        where = parse_filter(FILTERS[1])

        def first_query_ms() -> float:
            t = time.perf_counter()
            engine.recommend(queries[-1], where=where)
            return (time.perf_counter() - t) * 1000

        steady_ms = first_query_ms()
        changed = tickets[0]
        store.put_ticket(Ticket(changed.id, changed.subject, changed.description, changed.solution,
                                {**changed.metadata, "status": "VERIFIED"}), source="benchmark")
        after_change_ms = first_query_ms()
        store.remove_tickets([tickets[1].id])
        after_removal_ms = first_query_ms()
        engine._metadata = None  # as after a reindex, or changes to many tickets
        full_read_ms = first_query_ms()
        tracemalloc.start()
        engine._metadata = None
        engine.metadata_table(engine.index)
        table_mib = tracemalloc.get_traced_memory()[0] / 2**20
        tracemalloc.stop()
        store.close()
    kb = os.path.relpath(args.kb) if Path(args.kb).is_absolute() else args.kb
    print(f"    .venv/bin/python benchmarks/filters.py --model {args.model} --kb {kb} --copies {args.copies} "
          f"--queries {args.queries}\n")
    print(f"{len(tickets):,} tickets ({len(base):,} SeaMonkey reports x {args.copies}), model {model.version[:12]}, "
          f"index built in {build_s:.0f} s; {args.queries} queries per row, in process, one torch thread, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}\n")
    print("| filter | tickets that pass | query ms, median | p95 | candidates ms, median | p95 |")
    print("|---|---|---|---|---|---|")
    for name, share, med, p95, cmed, cp95 in rows:
        print(f"| `{name}` | {share:.1%} | {med:.1f} | {p95:.1f} | {cmed:.1f} | {cp95:.1f} |")
    print(f"\nthe same filtered query ({FILTERS[1][0]}) with the store unchanged: {steady_ms:.0f} ms; the first "
          f"after one ticket changed (its metadata read): {after_change_ms:.0f} ms; the first after one ticket was "
          f"removed (the store's ids read): {after_removal_ms:.0f} ms; the first with every ticket's metadata read: "
          f"{full_read_ms:.0f} ms; the metadata table holds {table_mib:.1f} MiB")


if __name__ == "__main__":
    main()
