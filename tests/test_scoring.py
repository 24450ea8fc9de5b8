"""The vectorised metric equals the model's own forward pass; fast and reference paths agree; top k is right."""
import numpy as np
import pytest

from recommender.serving import scoring
from recommender.serving.scoring import rank, score_candidates, top_k

SPEC = {
    "pairs": [["SUB", "SUB", 0.3], ["DESC", "DESC", 0.3], ["SUB", "DESC", 0.2], ["SUB", "SOL", 0.1], ["DESC", "SOL", 0.1]],
    "channels": {"h": 0.7, "E": 0.1, "T": 0.2},
    "bm25": 0.5,
}
DIMS = {"h": 6, "E": 11, "T": 4}


def random_vectors(n: int, components, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"{c}.{ch}": (rng.standard_normal((n, d)) * 0.1).astype(np.float32)
            for c in components for ch, d in DIMS.items()}


def reference_g(spec, q, t, bm25=None) -> np.ndarray:
    """The formula of docs/internals.md written out plainly in float64, one ticket at a time."""
    n = next(iter(t.values())).shape[0]
    out = np.zeros(n)
    for i in range(n):
        d = 0.0
        for a, b, v in spec["pairs"]:
            for ch, w in spec["channels"].items():
                d += v * w * np.abs(q[f"{a}.{ch}"][0].astype(np.float64) - t[f"{b}.{ch}"][i]).sum()
        if bm25 is not None and spec["bm25"]:
            d += spec["bm25"] * (1 - bm25[i] / max(bm25))
        out[i] = np.exp(-d)
    return out


@pytest.fixture(scope="module")
def model_and_data(tiny_model):
    from recommender.model.bundle import TicketModel

    path, data = tiny_model
    return TicketModel.load(path), data


@pytest.mark.parametrize("use_numba", [True, False])
def test_equals_the_model_forward_pass(model_and_data, use_numba):
    model, data = model_and_data
    tickets = data.tickets
    ticket_vecs = model.encode_tickets(tickets)
    bm25 = np.random.default_rng(0).uniform(0.0, 12.0, len(tickets))
    for query in data.queries[:3]:
        query_vecs = model.encode_queries([query])
        expected = model.score_pairs([query] * len(tickets), tickets, lexical=bm25 / bm25.max())
        got = score_candidates(model.metric_spec(), query_vecs, ticket_vecs, bm25=bm25, use_numba=use_numba)
        assert got.shape == (len(tickets),)
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
        # a candidate subset: BM25 normalised over those candidates only, as the model does per query
        rows = np.array([7, 2, 40, 13, 0])
        expected_rows = model.score_pairs([query] * len(rows), [tickets[r] for r in rows],
                                          lexical=bm25[rows] / bm25[rows].max())
        got_rows = score_candidates(model.metric_spec(), query_vecs, ticket_vecs, rows=rows, bm25=bm25[rows],
                                    use_numba=use_numba)
        np.testing.assert_allclose(got_rows, expected_rows, atol=1e-5, rtol=0)
    # without BM25 scores the lexical term is left out, as in score_pairs
    query = data.queries[0]
    np.testing.assert_allclose(
        score_candidates(model.metric_spec(), model.encode_queries([query]), ticket_vecs, use_numba=use_numba),
        model.score_pairs([query] * len(tickets), tickets), atol=1e-5, rtol=0)


def test_fast_and_reference_paths_agree_with_the_formula():
    tickets = random_vectors(301, ["SUB", "DESC", "SOL"], seed=1)
    query = {k: v[:1] for k, v in random_vectors(1, ["SUB", "DESC"], seed=2).items()}
    bm25 = np.random.default_rng(3).uniform(0, 5, 301)
    expected = reference_g(SPEC, query, tickets, bm25)
    fast = score_candidates(SPEC, query, tickets, bm25=bm25, use_numba=True)
    slow = score_candidates(SPEC, query, tickets, bm25=bm25, use_numba=False)
    np.testing.assert_allclose(fast, expected, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(slow, expected, atol=1e-6, rtol=1e-5)
    assert fast.dtype == np.float32
    assert np.all((fast > 0) & (fast <= 1))


def packed(vectors: dict[str, np.ndarray], dtype=np.float32) -> "scoring.PackedVectors":
    """The same vectors as one [n, Σ dims] matrix, as an index version stores them."""
    return scoring.PackedVectors(np.concatenate(list(vectors.values()), axis=1).astype(dtype),
                                 {k: v.shape[1] for k, v in vectors.items()})


def test_packed_records_score_like_separate_matrices():
    tickets = random_vectors(257, ["SUB", "DESC", "SOL"], seed=11)
    query = {k: v[:1] for k, v in random_vectors(1, ["SUB", "DESC"], seed=12).items()}
    bm25 = np.random.default_rng(13).uniform(0, 5, 257)
    records = packed(tickets)
    assert set(records) == set(tickets) and all(np.array_equal(records[k], tickets[k]) for k in tickets)
    expected = reference_g(SPEC, query, tickets, bm25)
    for use_numba in (True, False):
        np.testing.assert_allclose(score_candidates(SPEC, query, records, bm25=bm25, use_numba=use_numba), expected,
                                   atol=1e-6, rtol=1e-5)
    rows = np.array([200, 3, 3, 99, 0, 256])
    np.testing.assert_allclose(score_candidates(SPEC, query, records, rows=rows, bm25=bm25[rows]),
                               score_candidates(SPEC, query, tickets, rows=rows, bm25=bm25[rows]), atol=1e-6)
    np.testing.assert_allclose(score_candidates(SPEC, query, packed(tickets, np.float16)),
                               score_candidates(SPEC, query, tickets), rtol=2e-3)
    r_packed, g_packed, _ = rank(SPEC, query, records, 7, row_range=(50, 200))
    r_dict, g_dict, _ = rank(SPEC, query, tickets, 7, row_range=(50, 200))
    assert r_packed.tolist() == r_dict.tolist()
    np.testing.assert_allclose(g_packed, g_dict, rtol=1e-5)
    with pytest.raises(ValueError, match="columns"):
        scoring.PackedVectors(np.zeros((3, 5), np.float32), {"SUB.h": 6})


def test_float16_matrices_score_close_to_float32():
    tickets = random_vectors(50, ["SUB", "DESC", "SOL"], seed=4)
    query = {k: v[:1] for k, v in random_vectors(1, ["SUB", "DESC"], seed=5).items()}
    half = {k: v.astype(np.float16) for k, v in tickets.items()}
    for use_numba in (True, False):
        np.testing.assert_allclose(score_candidates(SPEC, query, half, use_numba=use_numba),
                                   score_candidates(SPEC, query, tickets), rtol=2e-3)


def test_float16_records_are_read_as_stored():
    """A float16 index is scored without a float32 copy: the kernel widens the stored half-precision values, so it
    equals float32 scoring of the same rounded vectors, in any candidate order, with repeats."""
    tickets = random_vectors(300, ["SUB", "DESC", "SOL"], seed=14)
    query = {k: v[:1] for k, v in random_vectors(1, ["SUB", "DESC"], seed=15).items()}
    rounded = {k: v.astype(np.float16).astype(np.float32) for k, v in tickets.items()}
    half = packed(tickets, np.float16)
    assert half.matrix.dtype == np.float16
    rows = np.array([299, 5, 17, 5, 0, 150, 42])
    bm25 = np.random.default_rng(16).uniform(0, 5, len(rows))
    for use_numba in (True, False):
        np.testing.assert_allclose(score_candidates(SPEC, query, half, use_numba=use_numba),
                                   reference_g(SPEC, query, rounded), rtol=1e-5)
        np.testing.assert_allclose(score_candidates(SPEC, query, half, rows=rows, bm25=bm25, use_numba=use_numba),
                                   score_candidates(SPEC, query, packed(rounded), rows=rows, bm25=bm25), rtol=1e-6)
    got_rows, got_g, _ = rank(SPEC, query, half, 5, rows, bm25)
    want_rows, want_g, _ = rank(SPEC, query, packed(rounded), 5, rows, bm25)
    assert got_rows.tolist() == want_rows.tolist()
    np.testing.assert_allclose(got_g, want_g, rtol=1e-6)


def test_candidates_of_a_paged_out_index_are_prefetched_together(tmp_path, monkeypatch):
    """When a memory-mapped index's candidate pages are not in memory, they are requested at once (MADV_WILLNEED)
    before scoring; when they are, nothing is asked; the scores are the same either way."""
    import os

    tickets = random_vectors(3000, ["SUB", "DESC", "SOL"], seed=17)
    query = {k: v[:1] for k, v in random_vectors(1, ["SUB", "DESC"], seed=18).items()}
    np.save(tmp_path / "vectors.npy", packed(tickets, np.float16).matrix)
    fd = os.open(tmp_path / "vectors.npy", os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # only this file's pages leave the page cache
    os.close(fd)
    dims = {k: v.shape[1] for k, v in tickets.items()}
    mapped = scoring.PackedVectors(np.load(tmp_path / "vectors.npy", mmap_mode="r"), dims)
    asked, real = [], scoring.prefetch_rows
    monkeypatch.setattr(scoring, "prefetch_rows", lambda matrix, rows: asked.append(np.sort(rows)) or real(matrix, rows))
    rows = np.array([2999, 10, 1500, 10, 700])
    resident = scoring.rows_resident(mapped.matrix, rows)
    expected = score_candidates(SPEC, query, packed(tickets, np.float16), rows=rows)
    np.testing.assert_allclose(score_candidates(SPEC, query, mapped, rows=rows), expected, rtol=1e-6)
    if resident is not False:
        pytest.skip("the kernel kept the pages (tmpfs?): nothing to prefetch")
    assert len(asked) == 1 and asked[0].tolist() == sorted(rows.tolist())
    float(np.asarray(mapped.matrix)[:, ::512].astype(np.float32).sum())  # every page read: in memory now
    assert scoring.rows_resident(mapped.matrix, rows)
    mapped.residency_checked = float("-inf")  # the next query checks again (else once per RESIDENCY_INTERVAL)
    np.testing.assert_allclose(score_candidates(SPEC, query, mapped, rows=rows), expected, rtol=1e-6)
    assert len(asked) == 1



def test_shards_merged_equal_the_whole():
    tickets = random_vectors(1000, ["SUB", "DESC", "SOL"], seed=6)
    query = {k: v[:1] for k, v in random_vectors(1, ["SUB", "DESC"], seed=7).items()}
    whole_rows, whole_g, _ = rank(SPEC, query, tickets, 10)
    merged = []
    for start, stop in [(0, 333), (333, 666), (666, 1000)]:
        r, g, _ = rank(SPEC, query, tickets, 10, row_range=(start, stop))
        assert np.all((r >= start) & (r < stop))
        merged += list(zip(r, g))
    merged.sort(key=lambda x: -x[1])
    assert [int(r) for r, _ in merged[:10]] == whole_rows.tolist()
    # candidates + BM25: each shard normalises by the maximum over all candidates
    rows = np.random.default_rng(8).choice(1000, 200, replace=False)
    bm25 = np.random.default_rng(9).uniform(0, 7, 200)
    cand_rows, cand_g, cand_bm = rank(SPEC, query, tickets, 5, rows, bm25)
    parts = []
    for start, stop in [(0, 500), (500, 1000)]:
        r, g, b = rank(SPEC, query, tickets, 5, rows, bm25, row_range=(start, stop), bm25_max=float(bm25.max()))
        parts += list(zip(r, g, b))
    parts.sort(key=lambda x: -x[1])
    assert [int(r) for r, _, _ in parts[:5]] == cand_rows.tolist()
    np.testing.assert_allclose([g for _, g, _ in parts[:5]], cand_g)
    lookup = dict(zip(rows.tolist(), bm25.astype(np.float32).tolist()))
    assert cand_bm.tolist() == [lookup[int(r)] for r in cand_rows]


@pytest.mark.parametrize("use_numba", [True, False])
def test_bm25_alone_is_scored_like_the_model(model_and_data, use_numba):
    """A label-free weight selection may keep BM25 alone (every channel weight 0): the kernel scores it as the
    model does, exp(−w·(1 − lexical)), instead of refusing the spec."""
    model, data = model_and_data
    spec = model.metric_spec()
    alone = dict(spec, channels={c: 0.0 for c in spec["channels"]}, bm25=2.0)
    tickets = data.tickets
    bm25 = np.random.default_rng(1).uniform(0.0, 12.0, len(tickets))
    query = data.queries[0]
    got = score_candidates(alone, model.encode_queries([query]), model.encode_tickets(tickets), bm25=bm25,
                           use_numba=use_numba)
    np.testing.assert_allclose(got, np.exp(-2.0 * (1.0 - bm25 / bm25.max())), atol=1e-6, rtol=0)
    saved = model.metric_spec()
    try:
        model.net.set_weights([v for *_, v in saved["pairs"]], alone["channels"], alone["bm25"])
        model.invalidate()
        expected = model.score_pairs([query] * len(tickets), tickets, lexical=bm25 / bm25.max())
    finally:
        model.net.set_weights([v for *_, v in saved["pairs"]], saved["channels"], saved["bm25"])
        model.invalidate()
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="no BM25 weight"):
        score_candidates(dict(alone, bm25=0.0), model.encode_queries([query]), model.encode_tickets(tickets))


def test_top_k_is_sorted_and_handles_edges():
    scores = np.array([0.1, 0.9, 0.5, 0.9, 0.3, 0.7])
    assert top_k(scores, 3).tolist() == [1, 3, 5]
    assert top_k(scores, 10).tolist() == [1, 3, 5, 2, 4, 0]
    assert top_k(scores, 0).tolist() == []
    assert top_k(np.array([]), 5).tolist() == []
    big = np.random.default_rng(0).random(10_000)
    assert top_k(big, 25).tolist() == np.argsort(-big)[:25].tolist()


def test_bad_inputs_are_reported():
    tickets = random_vectors(5, ["SUB", "DESC"], seed=1)  # no SOL matrices
    query = {k: v[:1] for k, v in random_vectors(1, ["SUB", "DESC"], seed=2).items()}
    with pytest.raises(ValueError, match="SOL"):
        score_candidates(SPEC, query, tickets)
    full = random_vectors(5, ["SUB", "DESC", "SOL"], seed=1)
    with pytest.raises(IndexError, match="rows"):
        score_candidates(SPEC, query, full, rows=[0, 9])
    with pytest.raises(ValueError, match="bm25"):
        score_candidates(SPEC, query, full, rows=[0, 1], bm25=[1.0])
    two = {k: np.repeat(v, 2, axis=0) for k, v in query.items()}
    with pytest.raises(ValueError, match="one query"):
        score_candidates(SPEC, two, full)


def test_numba_is_used_when_installed():
    assert scoring.HAVE_NUMBA  # numba is a dependency; tests/test_no_numba.py runs the path without it
