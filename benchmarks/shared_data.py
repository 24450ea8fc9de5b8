"""The real data of ../shared/data that benchmarks read: where each file is, SeaMonkey's columns, two loaders.

See ../shared/data/README.md for what the files are. SeaMonkey's export has no SOLUTION column.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: The shared data directory, beside the repository.
DATA = ROOT.parent / "shared" / "data"
SEAMONKEY_DIR = DATA / "seamonkey"
#: SeaMonkey Bugzilla: 1,076 issues, and the duplicate links between them.
SEAMONKEY = SEAMONKEY_DIR / "SeaMonkey_bugs.csv"
SEAMONKEY_LINKS = SEAMONKEY_DIR / "SeaMonkey_bugs-combined.csv"
#: ticket field ← SeaMonkey column (`ticketrec import --map`).
SEAMONKEY_MAP = {"id": "Issue id", "subject": "Summary", "description": "Description"}
#: SemEval-2016 Task 3 (train-part1/2.xml, dev.xml, test.xml).
SEMEVAL = DATA / "semeval2016"


def seamonkey_tickets(path: str | Path = SEAMONKEY) -> list:
    """The tickets of a SeaMonkey-style export (SEAMONKEY_MAP's columns), its warnings silenced."""
    from recommender.data.importers import load

    return load(path, mapping=SEAMONKEY_MAP, warn=lambda _: None, progress=False).tickets


def seamonkey_links(ticket_ids, path: str | Path = SEAMONKEY_LINKS) -> list[tuple[str, str]]:
    """The duplicate links of `path` between tickets of `ticket_ids`, its warnings silenced."""
    from recommender.data.importers import load_links

    return load_links(path, None, known_ids=list(ticket_ids), warn=lambda _: None)


def feedback_split(links, seed: int, half: int) -> tuple[list, list]:
    """The simulated engineers' split of duplicate links (`feedback_seamonkey.py`): (pairs judged, pairs held out).
    The links are sorted and shuffled with `seed`; `half` 0 judges the first half, 1 the second."""
    import random

    order = sorted(links)
    random.Random(seed).shuffle(order)
    n = len(order) // 2
    given, held_out = order[:n], order[n:]
    return (held_out, given) if half else (given, held_out)
