"""The paths taken without numba: a subprocess with TICKETREC_NO_NUMBA=1 (numba treated as absent) computes BM25
postings scores and top k, and the scoring kernel's distances and ranking, and they equal the compiled results."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from recommender.data.synthetic import generate
from recommender.lexical import postings
from recommender.lexical.postings import Bm25Postings, PostingsBuilder, ticket_terms
from recommender.serving import scoring
from recommender.serving.scoring import PackedVectors, distances, rank

ROOT = Path(__file__).resolve().parents[1]
QUERIES = ["turbine vibration after restart", "Valve leaks at the seal; pressure drops", "oil filter pump hot",
           "compressor bearing temperature alarm", "the and of", "zzzunknownword"]
KS = (1, 5, 50, 10_000)
SPEC = {"pairs": [["SUB", "SUB", 0.3], ["DESC", "DESC", 0.3], ["SUB", "DESC", 0.2], ["DESC", "SOL", 0.2]],
        "channels": {"h": 0.7, "E": 0.1, "T": 0.2}, "bm25": 0.5}
DIMS = {"h": 6, "E": 11, "T": 4}

# run with TICKETREC_NO_NUMBA=1: the same computations as `_results`, written to argv[2]
_CHILD = """
import json, sys
import numpy as np
from recommender.lexical import postings
from recommender.serving import scoring
sys.path.insert(0, sys.argv[3])
from test_no_numba import _inputs, _results
assert not postings.HAVE_NUMBA and not scoring.HAVE_NUMBA, "TICKETREC_NO_NUMBA=1 did not switch numba off"
bm25, query, tickets, rows, bm25_rows = _inputs(sys.argv[1])
np.savez(sys.argv[2], **_results(bm25, query, tickets, rows, bm25_rows))
"""


def _inputs(directory):
    """(postings, one query's vectors, the tickets' vectors, candidate rows, their BM25) from `directory`."""
    with open(os.path.join(directory, "stats.json")) as f:
        stats = json.load(f)
    bm25 = Bm25Postings.open(directory, stats, stats["n_rows"])
    data = np.load(os.path.join(directory, "vectors.npz"))
    query = {k[2:]: data[k] for k in data.files if k.startswith("q.")}
    tickets = {k[2:]: data[k] for k in data.files if k.startswith("t.")}
    return bm25, query, tickets, data["rows"], data["bm25"]


def _results(bm25, query, tickets, rows, bm25_rows) -> dict[str, np.ndarray]:
    """Every figure the numba and numpy paths both compute, by name."""
    out = {}
    for i, text in enumerate(QUERIES):
        r, s = bm25.scores(text)
        order = np.argsort(r)
        out[f"scores.{i}.rows"], out[f"scores.{i}.values"] = r[order], s[order]
        for k in KS:
            out[f"top.{i}.{k}.rows"], out[f"top.{i}.{k}.values"] = bm25.top_k(text, k)
    packed = PackedVectors.pack(tickets)
    out["d.all"] = distances(SPEC, query, packed)
    out["d.candidates"] = distances(SPEC, query, packed, rows, bm25_rows)
    out["d.unpacked"] = distances(SPEC, query, tickets, rows, bm25_rows)
    best, g, b = rank(SPEC, query, packed, 10, rows, bm25_rows)
    out["rank.best.rows"], out["rank.g"], out["rank.bm25"] = best, g, b
    return out


@pytest.fixture(scope="module")
def inputs_dir(tmp_path_factory):
    """Postings of 300 synthetic tickets and random vectors of 300 tickets and one query, written to a folder."""
    directory = tmp_path_factory.mktemp("no-numba")
    tickets = generate(n_tickets=300, n_queries=1, seed=3).tickets
    builder = PostingsBuilder(len(tickets))
    builder.add(np.arange(len(tickets)), ticket_terms(tickets))
    stats = builder.write(directory)
    (directory / "stats.json").write_text(json.dumps({**stats, "n_rows": len(tickets)}))
    rng = np.random.default_rng(7)
    vecs = {f"t.{c}.{ch}": (rng.standard_normal((len(tickets), d)) * 0.1).astype(np.float32)
            for c in ("SUB", "DESC", "SOL") for ch, d in DIMS.items()}
    vecs.update({f"q.{c}.{ch}": (rng.standard_normal((1, d)) * 0.1).astype(np.float32)
                 for c in ("SUB", "DESC") for ch, d in DIMS.items()})
    rows = rng.choice(len(tickets), 80, replace=False).astype(np.int64)
    np.savez(directory / "vectors.npz", rows=rows, bm25=rng.uniform(0.5, 9.0, 80), **vecs)
    return directory


def test_without_numba_postings_and_scoring_equal_the_compiled_results(inputs_dir, tmp_path):
    assert postings.HAVE_NUMBA and scoring.HAVE_NUMBA  # this process: the compiled paths
    compiled = _results(*_inputs(inputs_dir))
    assert compiled["top.0.5.rows"].size == 5 and compiled["scores.1.rows"].size > 5  # the queries match tickets
    env = {**os.environ, "TICKETREC_NO_NUMBA": "1", "OMP_NUM_THREADS": "1"}
    child = subprocess.run([sys.executable, "-c", _CHILD, str(inputs_dir), str(tmp_path / "numpy.npz"),
                            str(Path(__file__).parent)], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == 0, child.stderr
    plain = np.load(tmp_path / "numpy.npz")
    assert set(plain.files) == set(compiled)
    for name, got in compiled.items():
        expected = plain[name]
        if name.endswith("rows"):
            assert np.array_equal(got, expected), name  # the same tickets, in the same order
        elif name.startswith(("scores.", "top.")):
            np.testing.assert_allclose(got, expected, rtol=1e-12, err_msg=name)  # BM25: the same float64 sums
        else:
            np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-6, err_msg=name)  # float32 kernel


def test_the_switch_is_read_at_import():
    """Without TICKETREC_NO_NUMBA (or with 0) numba is used; with 1 it is not (the selection's `grid_ranks` too,
    whose two paths `tests/test_grid_ranks.py` compares in one process)."""
    for value, expected in (("0", "True True True"), ("1", "False False False")):
        out = subprocess.run([sys.executable, "-c", "from recommender.lexical import postings; from recommender."
                              "serving import scoring; from recommender.model import grid_ranks; "
                              "print(postings.HAVE_NUMBA, scoring.HAVE_NUMBA, grid_ranks.HAVE_NUMBA)"],
                             cwd=ROOT, env={**os.environ, "TICKETREC_NO_NUMBA": value}, capture_output=True,
                             text=True, timeout=120)
        assert out.stdout.strip() == expected, out.stderr
