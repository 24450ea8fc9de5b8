"""A real-vocabulary knowledge base of any size: SeaMonkey bug reports and SemEval-2016 forum threads
(`../shared/data/`), recombined by sentence into n tickets, seeded and deterministic.

The synthetic knowledge base (`recommender.data.synthetic`) has a few hundred word types; this one has the tens of
thousands of real text (bug reports, stack traces, URLs, forum English), so BM25 postings, the vocabulary and the
encoders meet the term distribution a help desk has. Each ticket takes its subject from one real subject (a
SeaMonkey summary or a SemEval question subject), its description from 1–6 sentences of real descriptions
(SeaMonkey descriptions, SemEval question bodies) and its solution from 0–4 sentences of real answers (SemEval
comments); every choice comes from one `random.Random(seed)`, so ticket i is the same whatever n is (the 100k
knowledge base is the first 100k tickets of the 1M one) and tickets stream without ever sitting in a list.

    .venv/bin/python benchmarks/real_kb.py --tickets 100000 --out /tmp/real-100k.jsonl [--queries 1000] [--seed 0]
    .venv/bin/ticketrec import /tmp/real-100k.jsonl

In Python: `real_tickets(n, seed)` (a list), `iter_real_tickets(n, seed)` (a generator: use it for 1M),
`iter_real_queries(n, seed)` (queries made the same way from a separate random stream), `available()`.
Missing data raises `RealDataMissing` (a FileNotFoundError) with one line saying where the data goes; CI has no
`../shared/`, so tests that use this module skip when `available()` is False.
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import re
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Iterator, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recommender.data.records import Query, Ticket  # noqa: E402

#: Where the shared benchmark data lives (outside the repository; see ../shared/data/README.md).
DATA_DIR = ROOT.parent / "shared" / "data"
SEAMONKEY = Path("seamonkey") / "SeaMonkey_bugs.csv"
SEMEVAL = (Path("semeval2016") / "train-part2.xml", Path("semeval2016") / "dev.xml")

#: Sentences per description and per solution (inclusive ranges).
DESCRIPTION_SENTENCES = (1, 6)
SOLUTION_SENTENCES = (0, 4)
#: Longest sentence kept, in characters (a stack trace or log dump is cut here, not dropped).
MAX_SENTENCE_CHARS = 400
#: Seed offset of the query stream, so queries never replay the tickets' choices.
_QUERY_STREAM = 1_000_003

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\s*\n\s*")
_SPACES = re.compile(r"\s+")


class RealDataMissing(FileNotFoundError):
    """The shared SeaMonkey / SemEval-2016 files are not where the real-vocabulary knowledge base reads them."""


class Pools(NamedTuple):
    """The sentence pools tickets are recombined from (deduplicated, in file order)."""

    subjects: tuple[str, ...]
    descriptions: tuple[str, ...]
    solutions: tuple[str, ...]


def _sentences(text: str) -> Iterator[str]:
    for part in _SENTENCE_END.split(text or ""):
        part = _SPACES.sub(" ", part).strip()
        if len(part) >= 3 and any(c.isalpha() for c in part):
            yield part[:MAX_SENTENCE_CHARS]


def available(data_dir: str | Path = DATA_DIR) -> bool:
    """True when every source file of the real-vocabulary knowledge base is under `data_dir`."""
    data_dir = Path(data_dir)
    return all((data_dir / p).is_file() for p in (SEAMONKEY, *SEMEVAL))


@lru_cache(maxsize=4)
def pools(data_dir: str | Path = DATA_DIR) -> Pools:
    """The subject, description and solution sentence pools read from `data_dir`; RealDataMissing when absent."""
    data_dir = Path(data_dir)
    missing = [str(data_dir / p) for p in (SEAMONKEY, *SEMEVAL) if not (data_dir / p).is_file()]
    if missing:
        raise RealDataMissing(f"real-vocabulary knowledge base: {missing[0]} not found (put the shared SeaMonkey and "
                              "SemEval-2016 files under ../shared/data/, or use the synthetic knowledge base)")
    from recommender.data.importers import load  # the project's own SemEval reader

    subjects: dict[str, None] = {}
    descriptions: dict[str, None] = {}
    solutions: dict[str, None] = {}
    csv.field_size_limit(1 << 24)
    with open(data_dir / SEAMONKEY, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            subjects.update(dict.fromkeys(_sentences(row.get("Summary") or "")))
            descriptions.update(dict.fromkeys(_sentences(row.get("Description") or "")))
    for path in SEMEVAL:
        data = load(data_dir / path, "semeval")
        for t in data.tickets:
            subjects.update(dict.fromkeys(_sentences(t.subject)))
            descriptions.update(dict.fromkeys(_sentences(t.description)))
            solutions.update(dict.fromkeys(_sentences(t.solution)))
        for q in data.queries:
            subjects.update(dict.fromkeys(_sentences(q.subject)))
            descriptions.update(dict.fromkeys(_sentences(q.description)))
    return Pools(tuple(subjects), tuple(descriptions), tuple(solutions))


def _texts(rng: random.Random, p: Pools, solution: bool) -> tuple[str, str, str]:
    subject = p.subjects[rng.randrange(len(p.subjects))]
    description = " ".join(rng.choices(p.descriptions, k=rng.randint(*DESCRIPTION_SENTENCES)))
    sol = " ".join(rng.choices(p.solutions, k=rng.randint(*SOLUTION_SENTENCES))) if solution else ""
    return subject, description, sol


def iter_real_tickets(n: int, seed: int = 0, data_dir: str | Path = DATA_DIR) -> Iterator[Ticket]:
    """Yield `n` real-vocabulary tickets (ids `real-<seed>-<i>`); ticket i is the same for every n."""
    p = pools(data_dir)
    rng = random.Random(seed)
    for i in range(n):
        subject, description, solution = _texts(rng, p, solution=True)
        yield Ticket(f"real-{seed}-{i}", subject, description, solution)


def real_tickets(n: int, seed: int = 0, data_dir: str | Path = DATA_DIR) -> list[Ticket]:
    """`n` real-vocabulary tickets as a list (`iter_real_tickets` for large n)."""
    return list(iter_real_tickets(n, seed, data_dir))


def iter_real_queries(n: int, seed: int = 0, data_dir: str | Path = DATA_DIR) -> Iterator[Query]:
    """Yield `n` queries recombined like the tickets (subject + description) from a separate random stream."""
    p = pools(data_dir)
    rng = random.Random(seed + _QUERY_STREAM)
    for i in range(n):
        subject, description, _ = _texts(rng, p, solution=False)
        yield Query(subject, description, id=f"real-q{seed}-{i}")


def write_jsonl(path: str | Path, n_tickets: int, n_queries: int = 0, seed: int = 0,
                data_dir: str | Path = DATA_DIR) -> Path:
    """Stream the knowledge base to `path` as ticketrec JSONL (what `ticketrec import` reads), atomically."""
    from recommender.files import atomic_file

    path = Path(path)
    with atomic_file(path, "w") as out:
        for t in iter_real_tickets(n_tickets, seed, data_dir):
            out.write(json.dumps({"type": "ticket", "id": t.id, "subject": t.subject, "description": t.description,
                                  "solution": t.solution}, ensure_ascii=False) + "\n")
        for q in iter_real_queries(n_queries, seed, data_dir):
            out.write(json.dumps({"type": "query", "id": q.id, "subject": q.subject, "description": q.description},
                                 ensure_ascii=False) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    """CLI: write a real-vocabulary knowledge base as JSONL; exit 2 with one line when the data is missing."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tickets", type=int, required=True, help="number of tickets")
    ap.add_argument("--queries", type=int, default=0, help="number of queries to add (default 0)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    ap.add_argument("--data", type=Path, default=DATA_DIR, help=f"shared data directory (default {DATA_DIR})")
    args = ap.parse_args(argv)
    if args.tickets < 0 or args.queries < 0:
        ap.error("--tickets and --queries must be >= 0")
    started = time.perf_counter()
    try:
        p = pools(args.data)
        write_jsonl(args.out, args.tickets, args.queries, args.seed, args.data)
    except RealDataMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.tickets:,} tickets and {args.queries:,} queries to {args.out} in "
          f"{time.perf_counter() - started:.1f} s (pools: {len(p.subjects):,} subjects, {len(p.descriptions):,} "
          f"description and {len(p.solutions):,} solution sentences; seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
