"""benchmarks/feedback_gate.py: its seeded draws of judged query texts and the expected change of a gate."""
from __future__ import annotations

import numpy as np
import pytest

from feedback_gate import draw_query_texts, expected_change, gate_table


def test_a_draw_takes_whole_query_texts_and_is_seeded_by_size_and_draw():
    ids = np.array(["q1", "q1", "q2", "q3", "q3", "q3", "q4", "q5"])
    mask = draw_query_texts(ids, 2, 0)
    chosen = set(ids[mask])
    assert len(chosen) == 2
    assert all(mask[i] == (q in chosen) for i, q in enumerate(ids))  # every judgement of a drawn text, no other
    assert np.array_equal(draw_query_texts(ids, 2, 0), mask)
    assert len({tuple(draw_query_texts(ids, 2, d)) for d in range(10)}) > 1
    with pytest.raises(SystemExit, match="6 query texts asked, the judgements have 5"):
        draw_query_texts(ids, 6, 0)


def test_a_gate_changes_only_the_draws_whose_gain_passes_it():
    z, change = np.array([0.5, 1.5, 2.5]), np.array([-1.0, 2.0, 3.0])
    assert expected_change(z, change, -np.inf) == (3, pytest.approx(4 / 3))
    assert expected_change(z, change, 1.0) == (2, pytest.approx(5 / 3))
    assert expected_change(z, change, 2.0) == (1, pytest.approx(1.0))
    assert expected_change(z, change, 3.0) == (0, 0.0)
    assert expected_change(np.array([1.0]), np.array([5.0]), 1.0) == (0, 0.0)  # "more than" the gate


def test_the_table_has_a_row_per_size_and_a_column_per_gate():
    rows = [{"n": 10, "judged": 30, "z": 1.5, "dev_change": -0.5}, {"n": 10, "judged": 34, "z": 0.2, "dev_change": 1.0},
            {"n": 20, "judged": 70, "z": 2.5, "dev_change": 0.4}]
    table = gate_table(rows, [1.0, 2.0]).splitlines()
    assert table[0].count("re-selects") == 3 and "1 SE" in table[0] and "2 SE" in table[0]
    assert table[2] == "| 10 | 32 | 2 | 2/2, +0.250 | 1/2, -0.250 | 0/2, +0.000 |"
    assert table[3] == "| 20 | 70 | 1 | 1/1, +0.400 | 1/1, +0.400 | 1/1, +0.400 |"
