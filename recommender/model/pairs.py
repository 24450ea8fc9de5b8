"""Labelled pairs as index arrays (`PairSet`), a seeded held-out share of the queries, and the fingerprint of the
training data: what every trainer shares (the Replicated Siamese LSTM's, and the char-level and variational Siamese
networks'), below the model bundle."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from ..data.records import Query, Ticket
from ..data.store import Dataset
from ..errors import InputError



@dataclass
class PairSet:
    """Labelled pairs over distinct queries and tickets: pair k is (queries[q[k]], tickets[t[k]]) with label y[k] (1–5)."""

    queries: list[Query]
    tickets: list[Ticket]
    q: np.ndarray
    t: np.ndarray
    y: np.ndarray

    @classmethod
    def from_dataset(cls, data: Dataset, name: str) -> "PairSet":
        qmap, tmap = data.query_map(), data.ticket_map()
        qpos: dict[str, int] = {}
        tpos: dict[str, int] = {}
        q, t, y = [], [], []
        for p in data.pairs:
            if p.query_id not in qmap or p.ticket_id not in tmap:
                missing = p.query_id if p.query_id not in qmap else p.ticket_id
                raise InputError(f"the {name} data has a labelled pair that names {missing!r}, which it does not "
                                 "contain; fix the file so every pair's query and ticket are in it")
            q.append(qpos.setdefault(p.query_id, len(qpos)))
            t.append(tpos.setdefault(p.ticket_id, len(tpos)))
            y.append(float(p.score))
        return cls([qmap[i] for i in qpos], [tmap[i] for i in tpos], np.array(q, dtype=np.int64),
                   np.array(t, dtype=np.int64), np.array(y, dtype=np.float64))

    def __len__(self) -> int:
        return len(self.y)

    @property
    def groups(self) -> np.ndarray:
        return self.q

    def of_queries(self, rows: np.ndarray) -> "PairSet":
        """The pairs of the queries at `rows` (sorted, distinct), in their order, over the same tickets."""
        keep = np.isin(self.q, rows)
        renumber = np.full(len(self.queries), -1, dtype=np.int64)
        renumber[rows] = np.arange(len(rows))
        return PairSet([self.queries[i] for i in rows], self.tickets, renumber[self.q[keep]], self.t[keep],
                       self.y[keep])


def split_queries(data: Dataset, share: float, seed: int) -> tuple[Dataset, Dataset]:
    """A seeded held-out share of the labelled queries (with their pairs) as a dev set; the tickets stay in both."""
    labelled = sorted({p.query_id for p in data.pairs})
    if len(labelled) < 2:
        raise InputError("need labelled pairs of at least 2 queries to hold some out for early stopping; pass --dev FILE")
    rng = np.random.default_rng(seed)
    n_dev = min(len(labelled) - 1, max(1, int(round(share * len(labelled)))))
    dev_ids = set(rng.permutation(labelled)[:n_dev].tolist())
    train = Dataset(data.tickets, [q for q in data.queries if q.id not in dev_ids],
                    [p for p in data.pairs if p.query_id not in dev_ids], data.source)
    dev = Dataset(data.tickets, [q for q in data.queries if q.id in dev_ids],
                  [p for p in data.pairs if p.query_id in dev_ids], data.source + " (held out)")
    return train, dev


def dataset_fingerprint(*datasets: Dataset | None) -> str:
    """sha256 of the training data's content (tickets, queries, pairs), order-independent."""
    h = hashlib.sha256()
    for data in datasets:
        if data is None:
            h.update(b"none")
            continue
        for row in sorted(json.dumps([t.id, t.subject, t.description, t.solution]) for t in data.tickets):
            h.update(row.encode())
        for row in sorted(json.dumps([q.id, q.subject, q.description]) for q in data.queries):
            h.update(row.encode())
        for row in sorted(json.dumps([p.query_id, p.ticket_id, p.score]) for p in data.pairs):
            h.update(row.encode())
    return h.hexdigest()
