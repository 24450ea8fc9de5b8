"""The label-free selection's inner loop (`grid_ranks.weighting_ranks`): the compiled kernel gives bit-for-bit the
numpy reference's reciprocal ranks, ties and the top-k boundary included, over more views than one block."""
import numpy as np
import pytest

from recommender.model import grid_ranks
from recommender.model.grid_ranks import BLOCK, reciprocal_ranks, weighting_ranks

pytestmark = pytest.mark.skipif(not grid_ranks.HAVE_NUMBA, reason="numba is not installed: only the numpy path runs")


def _inputs(rng, n_queries, n_views, n_channels=3, lattice=None):
    per_channel = rng.random((n_channels, n_queries, n_views))
    lexical = rng.random((n_queries, n_views)).astype(np.float32)
    if lattice:  # few distinct values: many exact ties
        per_channel = np.round(per_channel * lattice) / lattice
        lexical = np.round(lexical * lattice) / lattice
    bm25 = [0.0, 0.3, 1.0]
    lexical_terms = np.stack([wb * (1.0 - lexical) if wb else np.zeros_like(lexical) for wb in bm25])
    weights = np.array([[0.0, 0.0, 0.0], [0.1, 0.0, 0.3], [1.0, 0.3, 0.0], [0.7, 0.1, 3.0]], np.float32)
    active = np.array([[bool(w.any() or wb) for wb in bm25] for w in weights])
    return per_channel, lexical_terms, rng.integers(0, n_views, n_queries), weights.astype(np.float64), active


@pytest.mark.parametrize("lattice", [None, 4, 64])
@pytest.mark.parametrize("n_views", [7, BLOCK + 1, 2 * BLOCK + 300])
def test_compiled_ranks_are_the_numpy_ranks(lattice, n_views):
    """Every active combination's per-query reciprocal ranks, compiled and numpy, are equal bit for bit, and equal
    to ranking the weighted sum directly; the rows follow the active combinations in order."""
    rng = np.random.default_rng(n_views + (lattice or 0))
    per_channel, lexical, truth, weights, active = _inputs(rng, 40, n_views, lattice=lattice)
    compiled = weighting_ranks(per_channel, lexical, truth, weights, active, 10, use_numba=True)
    reference = weighting_ranks(per_channel, lexical, truth, weights, active, 10, use_numba=False)
    assert compiled.shape == (active.sum(), 40)
    assert np.array_equal(compiled, reference)
    direct = [reciprocal_ranks(np.einsum("cqn,c->qn", per_channel, w) + lexical[b], truth, 10)
              for j, w in enumerate(weights) for b in np.flatnonzero(active[j])]
    assert np.array_equal(compiled, np.array(direct))
    assert len({row.tobytes() for row in compiled}) > 1  # the weights move the ranks: the comparison says something


@pytest.mark.parametrize("k", [1, 10, 11])
def test_top_k_boundary_and_ties_count_against_the_own_view(k):
    """The own view at rank k scores 1/k and beyond k 0, where the views before it in a later block than the own
    one (the kernel stops counting past k) and ties with it count against it."""
    n_views = 3 * BLOCK
    per_channel = np.ones((1, 3, n_views))
    truth = np.array([5, 5, 5])
    per_channel[0, :, truth[0]] = 0.5
    per_channel[0, 0, 2 * BLOCK + np.arange(k - 1)] = 0.25  # k - 1 closer views, in the last block
    per_channel[0, 1, 2 * BLOCK + np.arange(k)] = 0.25  # k closer views: rank k + 1
    per_channel[0, 2, BLOCK + np.arange(k - 1)] = 0.5  # k - 1 ties: rank k
    lexical, weights, active = np.zeros((1, 3, n_views)), np.ones((1, 1)), np.ones((1, 1), bool)
    for use_numba in (True, False):
        ranks = weighting_ranks(per_channel, lexical, truth, weights, active, k, use_numba=use_numba)
        assert ranks[0].tolist() == [1.0 / k, 0.0, 1.0 / k]
