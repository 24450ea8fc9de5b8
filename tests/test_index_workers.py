"""The parallel index build (forked encoding workers) writes byte-identical matrices to the serial build."""
import numpy as np
import pytest

from recommender.serving import index_build
from recommender.errors import IndexStateError
from recommender.serving.index import open_current
from recommender.serving.index_build import build_index


def _files(settings, version) -> dict[str, bytes]:
    folder = settings.indexes_dir / version
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.npy"))}  # vectors, BM25 postings, timestamps


def test_two_workers_build_the_same_bytes_as_the_serial_build(kb_home, tiny_ticket_model, monkeypatch):
    (settings, store), model = kb_home, tiny_ticket_model
    monkeypatch.setattr(index_build, "BUILD_BATCH", 16)  # 80 tickets → 5 chunks spread over the workers
    serial = build_index(store, model, settings, incremental=False, progress=False, workers=1)
    parallel = build_index(store, model, settings, incremental=False, progress=False, workers=2)
    assert serial != parallel
    a, b = _files(settings, serial), _files(settings, parallel)
    assert "vectors.npy" in a and "bm25_rows.npy" in a and set(a) == set(b)
    for name in a:
        assert a[name] == b[name], f"{name} differs between the serial and the 2-worker build"
    idx = open_current(settings)
    assert idx.version == parallel and idx.ticket_ids == store.ticket_ids()
    expected = model.encode_tickets(store.get_tickets(idx.ticket_ids))
    for key, mat in idx.vectors.items():  # other batch boundaries: equal to float rounding, not to the bit
        np.testing.assert_allclose(np.asarray(mat), expected[key], rtol=1e-5, atol=1e-6)


def test_workers_below_one_are_refused(kb_home, tiny_ticket_model):
    (settings, store), model = kb_home, tiny_ticket_model
    with pytest.raises(IndexStateError, match="workers"):
        build_index(store, model, settings, progress=False, workers=0)
