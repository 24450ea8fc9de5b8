"""Eager BM25 impacts and the early-terminating top k of the postings (`recommender/lexical/postings.py`).

The stored impacts equal the one formula (`bm25.impacts`) and their sums do not depend on the order of the terms;
block-max MaxScore returns exactly the exhaustive top k (ties: lower row first) on random small corpora, with tiny
windows and blocks so that every skip is taken; the build streams through bounded steps with the same files; an
incremental build equals a full one; a version written before the impacts still opens and answers the same."""
from __future__ import annotations

import json
import random
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recommender.data.records import Ticket
from recommender.lexical import postings
from recommender.lexical.bm25 import (BM25_B, BM25_K1, IMPACT_GRID, IMPACT_SMALL, Bm25Scorer, document_terms, idf,
                                      impacts, length_norm, term_score)
from recommender.lexical.postings import LEGACY_ARRAYS, METHODS, Bm25Postings, PostingsBuilder, ticket_terms

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: A small vocabulary, so that random tickets share terms, some in most tickets (IDF at its floor), and tie.
WORDS = ["pump", "seal", "leak", "valve", "oil", "turbine", "vibration", "bearing", "alarm", "restart", "filter",
         "the", "of", "hot", "pressure"]
TICKET = st.tuples(*(st.lists(st.sampled_from(WORDS), max_size=n).map(" ".join) for n in (3, 8, 5)))
CORPUS = st.lists(TICKET, min_size=1, max_size=70)
QUERY = st.lists(st.sampled_from(WORDS + ["nowhere"]), min_size=1, max_size=8).map(" ".join)


@contextmanager
def _small(window: int = 8, block: int = 4, step: int | None = None, dense: int = postings.DENSE):
    """Tiny windows and blocks (and write steps), and a top-k buffer of 2k, so that a corpus of a few dozen tickets
    crosses many windows and blocks and the k-th best score starts skipping early; `dense` 0: the look-up path."""
    names = ("WINDOW", "BLOCK", "WRITE_STEP", "BUFFER_SLACK", "DENSE")
    saved = {name: getattr(postings, name) for name in names}
    for name, value in zip(names, (window, block, step or saved["WRITE_STEP"], 0, dense)):
        setattr(postings, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(postings, name, value)


def _tickets(rows) -> list[Ticket]:
    return [Ticket(f"t{i}", *fields) for i, fields in enumerate(rows)]


def _build(tickets: list[Ticket], directory: Path, chunk: int = 16) -> Bm25Postings:
    builder = PostingsBuilder(len(tickets))
    for start in range(0, len(tickets), chunk):
        builder.add(np.arange(start, min(start + chunk, len(tickets))), ticket_terms(tickets[start : start + chunk]))
    stats = builder.write(directory)
    (directory / "stats.json").write_text(json.dumps(stats))
    return Bm25Postings.open(directory, stats, len(tickets))


def _expected_top(bm25: Bm25Postings, text: str, k: int) -> list[tuple[int, float]]:
    rows, scores = bm25.scores(text)
    return sorted(zip(rows.tolist(), scores.tolist()), key=lambda x: (-x[1], x[0]))[:k]


@PROPERTY
@given(idf_t=st.floats(1e-6, 30.0), f=st.floats(0.5, 50.0), norm=st.floats(0.3, 200.0))
def test_impacts_are_the_formula_in_float32_and_small_ones_on_the_grid(idf_t, f, norm):
    exact = term_score(idf_t, f, norm, BM25_K1 + 1.0)
    got = float(impacts(idf_t, np.array([f]), np.array([norm]), BM25_K1 + 1.0)[0])
    if exact >= IMPACT_SMALL:
        assert got == float(np.float32(exact))  # relative error ≤ 2⁻²⁴
    else:
        assert got / IMPACT_GRID == max(1.0, round(exact / IMPACT_GRID))  # absolute error ≤ 2⁻⁴², never 0
    assert got > 0 and (got / IMPACT_GRID).is_integer()


@PROPERTY
@given(st.lists(st.tuples(st.floats(1e-6, 30.0), st.floats(0.5, 50.0), st.floats(0.3, 200.0)), min_size=1,
                max_size=64), st.randoms(use_true_random=False))
def test_sums_of_up_to_64_impacts_do_not_depend_on_the_order(shares, rnd):
    values = [float(impacts(i, np.array([f]), np.array([n]), BM25_K1 + 1.0)[0]) for i, f, n in shares]
    forward = 0.0
    for v in values:
        forward += v
    rnd.shuffle(values)
    shuffled = 0.0
    for v in values:
        shuffled += v
    assert forward == shuffled == float(np.sum(np.array(values, np.float64)))  # exact: equal scores are equal bits


@PROPERTY
@given(CORPUS)
def test_stored_impacts_are_the_formula_over_the_versions_statistics(rows):
    tickets = _tickets(rows)
    with tempfile.TemporaryDirectory() as tmp, _small(step=7):
        bm25 = _build(tickets, Path(tmp))
        n = len(tickets)
        freqs, lengths = zip(*(document_terms(t.subject, t.description, t.solution) for t in tickets))
        norm = length_norm(np.asarray(lengths, np.float32), BM25_K1, BM25_B)
        for term, t in bm25.term_id.items():
            sl = slice(int(bm25.ptr[t]), int(bm25.ptr[t + 1]))
            holders = [i for i in range(n) if term in freqs[i]]
            assert bm25.rows[sl].tolist() == holders  # ascending rows
            tf = np.array([freqs[i][term] for i in holders], np.float32)
            assert bm25.impact[sl].tolist() == impacts(idf(len(holders), n), tf, norm[holders], BM25_K1 + 1.0).tolist()
            assert bm25.tf[sl].tolist() == tf.tolist()
        for t in range(len(bm25.terms)):  # each block's maximum and last row
            for b in range(int(bm25.bptr[t]), int(bm25.bptr[t + 1])):
                start = int(bm25.ptr[t]) + (b - int(bm25.bptr[t])) * bm25.block
                stop = min(start + bm25.block, int(bm25.ptr[t + 1]))
                assert bm25.bmax[b] == bm25.impact[start:stop].max() and bm25.blast[b] == bm25.rows[stop - 1]


@PROPERTY
@given(CORPUS, st.lists(QUERY, min_size=1, max_size=4), st.integers(1, 80), st.sampled_from([8, 64]),
       st.sampled_from([0, postings.DENSE]))
def test_early_terminating_top_k_is_exactly_the_exhaustive_top_k(rows, queries, k, window, dense):
    """Every path of the skipping: `dense` 0 looks the candidates up and prunes them between terms; the default
    reads the dense terms and pauses the split after dense windows."""
    tickets = _tickets(rows)
    with tempfile.TemporaryDirectory() as tmp, _small(window=window, dense=dense):
        bm25 = _build(tickets, Path(tmp))
        scorer = Bm25Scorer(tickets)
        for text in queries:
            expected = _expected_top(bm25, text, k)
            for method in METHODS:
                got = bm25.top_k(text, k, method)
                assert list(zip(got[0].tolist(), got[1].tolist())) == expected, (method, text, k)
            every = scorer.scores(text)
            assert [s for _, s in expected] == [float(every[r]) for r, _ in expected]  # bit for bit: Bm25Scorer


def test_ties_go_to_the_lower_row_across_windows_and_blocks():
    same = ("pump seal", "pump seal leak", "replace the seal")
    tickets = _tickets([same if i % 3 else ("valve", "valve stuck " * (i % 5), "oil") for i in range(90)])
    with tempfile.TemporaryDirectory() as tmp, _small(window=16, block=4):
        bm25 = _build(tickets, Path(tmp))
        for method in METHODS:
            top = bm25.top_k("pump seal", 7, method)  # 60 equal scores, cut at 7: the lowest rows
            assert top[0].tolist() == [1, 2, 4, 5, 7, 8, 10] and len(set(top[1].tolist())) == 1, method
            assert list(zip(*(a.tolist() for a in bm25.top_k("pump seal oil", 200, method)))) == \
                _expected_top(bm25, "pump seal oil", 200)
        with pytest.raises(ValueError, match="maxscore"):
            bm25.top_k("pump", 3, "fastest")


@PROPERTY
@given(CORPUS, st.sets(st.integers(0, 69)), st.sets(st.integers(0, 69)), st.lists(QUERY, min_size=1, max_size=3))
def test_an_incremental_build_equals_a_full_build(rows, dropped, changed, queries):
    """Rows reused from the previous version (renumbered, some dropped, some encoded again) score exactly like a
    build from scratch: the impacts are computed again with the new IDF and average length."""
    old = _tickets(rows)
    keep = [i for i in range(len(old)) if i not in dropped]
    new = [old[i] if i not in changed else Ticket(old[i].id, "turbine alarm", old[i].description, "") for i in keep]
    new.append(Ticket("fresh", "valve leak", "oil pressure hot", "restart the pump"))
    random.Random(len(rows)).shuffle(new)
    row_of = {t.id: r for r, t in enumerate(new)}
    with tempfile.TemporaryDirectory() as tmp, _small(step=11):
        (Path(tmp) / "prev").mkdir(), (Path(tmp) / "inc").mkdir(), (Path(tmp) / "full").mkdir()
        prev = _build(old, Path(tmp) / "prev")
        builder = PostingsBuilder(len(new))
        new_row_of_prev = np.full(len(old), -1, np.int64)
        for i in keep:
            if i not in changed:
                new_row_of_prev[i] = row_of[old[i].id]
        fresh = [r for r, t in enumerate(new) if t.id == "fresh" or int(t.id[1:]) in changed]
        builder.add(np.array(fresh), ticket_terms([new[r] for r in fresh]))
        builder.add_reused(prev, new_row_of_prev)
        incremental = Bm25Postings.open(Path(tmp) / "inc", builder.write(Path(tmp) / "inc"), len(new))
        full = _build(new, Path(tmp) / "full")
        for text in queries:
            a, b = incremental.scores(text), full.scores(text)
            assert dict(zip(a[0].tolist(), a[1].tolist())) == dict(zip(b[0].tolist(), b[1].tolist()))
            for k in (1, 5, 100):
                assert [x.tolist() for x in incremental.top_k(text, k)] == [x.tolist() for x in full.top_k(text, k)]


def test_the_build_streams_in_steps_with_the_same_files(tmp_path):
    tickets = _tickets([(f"pump {w}", f"{w} seal leak {w}", "oil") for w in WORDS * 6])
    (tmp_path / "one").mkdir(), (tmp_path / "steps").mkdir()
    _build(tickets, tmp_path / "one")
    with _small(window=postings.WINDOW, block=postings.BLOCK, step=5):  # many steps of at most 5 postings
        _build(tickets, tmp_path / "steps")
    for name in postings.postings_files({"impacts": True}) + (postings.TERMS_FILE,):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "steps" / name).read_bytes(), name


def test_a_version_written_before_the_impacts_opens_and_answers_the_same(tmp_path):
    tickets = _tickets([(f"pump {w}", f"{w} seal leak", "oil the valve") for w in WORDS * 5])
    (tmp_path / "new").mkdir(), (tmp_path / "old").mkdir()
    new = _build(tickets, tmp_path / "new")
    stats = json.loads((tmp_path / "new" / "stats.json").read_text())
    old_stats = {key: v for key, v in stats.items() if key not in ("impacts", "block")}
    assert postings.postings_files(old_stats) == tuple(f"bm25_{a}.npy" for a in LEGACY_ARRAYS)
    rows, tf = new.rows.copy(), new.tf.copy()
    for t in range(len(new.terms)):  # an older build could append reused rows after new ones: not ascending
        sl = slice(int(new.ptr[t]), int(new.ptr[t + 1]))
        rows[sl], tf[sl] = rows[sl][::-1], tf[sl][::-1]
    for name, arr in (("ptr", new.ptr), ("rows", rows), ("tf", tf), ("length", new.length)):
        np.save(tmp_path / "old" / f"bm25_{name}.npy", arr)
    (tmp_path / "old" / postings.TERMS_FILE).write_text(json.dumps(new.terms))
    old = Bm25Postings.open(tmp_path / "old", old_stats, len(tickets))
    for text in ("pump seal", "valve oil turbine", "leak"):
        for k in (1, 10, 1000):
            assert [x.tolist() for x in old.top_k(text, k)] == [x.tolist() for x in new.top_k(text, k)]
