"""benchmarks/selection_agreement.py: the count of tied queries it prints beside the reproduced selection."""
from __future__ import annotations

import numpy as np
from selection_agreement import near_ties

from recommender.model.weight_selection import RankedSlice

SPEC = {"pairs": [["SUB", "SUB", 1.0]], "channels": {"E": 1.0}, "bm25": 0.0}


def test_near_ties_counts_the_queries_whose_own_view_has_a_rival_at_its_distance():
    dist = np.array([[[[0.2, 0.9, 0.2, 0.8],  # query 0: view 2 is a copy of its own view 0
                       [0.9, 0.1, 0.7, 0.6],  # query 1: its own view 1 alone
                       [0.30005, 0.9, 0.8, 0.3]]]], dtype=np.float64)  # query 2: view 0 within 5e-5 of its own 3
    ranked = RankedSlice(dist, None, np.array([0, 1, 3]), [True])
    assert near_ties(ranked, SPEC) == 2
    assert near_ties(ranked, SPEC, tolerance=1e-6) == 1
    lexical = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    with_bm25 = RankedSlice(dist, lexical, np.array([0, 1, 3]), [True])
    assert near_ties(with_bm25, dict(SPEC, bm25=1.0)) == 0  # BM25 tells the copies apart here
