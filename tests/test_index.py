"""Index versions: build, verify, atomic switch, incremental reuse, pruning, and builds that fail or are killed."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from recommender.serving import index_build
from recommender.config import Settings
from recommender.errors import IndexStateError
from recommender.serving.index import TicketIndex, current_version, list_versions, open_current
from recommender.serving.index_build import build_index
from recommender.data.records import Ticket
from recommender.data.store import Dataset, Store

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model(tiny_model):
    from recommender.model.bundle import TicketModel

    return TicketModel.load(tiny_model[0])


@pytest.fixture
def home(tmp_path, tiny_model):
    """(settings, store) of a fresh home holding the tiny model's knowledge base."""
    settings = Settings.from_env({"TICKETREC_HOME": str(tmp_path / "home"), "TICKETREC_MODEL": str(tiny_model[0]),
                                  "TICKETREC_KEEP_INDEXES": "2"})
    store = Store(settings.db)
    store.import_dataset(Dataset(tiny_model[1].tickets, source="kb"))
    yield settings, store
    store.close()


def test_build_writes_a_verified_memory_mapped_version(home, model):
    settings, store = home
    version = build_index(store, model, settings, progress=False)
    assert current_version(settings) == version
    idx = open_current(settings)
    assert idx.version == version and idx.model_version == model.version
    assert idx.ticket_ids == store.ticket_ids()
    manifest = json.loads((settings.indexes_dir / version / "manifest.json").read_text())
    assert manifest["n_tickets"] == len(idx) == 80
    assert manifest["dtype"] == "float32" and manifest["metric_spec"] == model.metric_spec()
    assert manifest["encoded"] == 80 and manifest["reused"] == 0
    expected = model.encode_tickets(store.get_tickets(idx.ticket_ids))
    assert set(idx.vectors) == set(expected)
    assert isinstance(idx.vectors.matrix, np.memmap) and idx.vectors.matrix.dtype == np.float32
    assert (settings.indexes_dir / version / "vectors.npy").exists()  # one record per ticket, keys side by side
    assert idx.vectors.matrix.shape == (80, sum(v.shape[1] for v in expected.values()))
    for key, mat in idx.vectors.items():
        assert mat.dtype == np.float32 and np.shares_memory(mat, idx.vectors.matrix)
        np.testing.assert_allclose(mat, expected[key], atol=1e-5)
    idx.warm()  # maps the pages in; the numbers stay what they were
    np.testing.assert_allclose(idx.vectors["SOL.E"], expected["SOL.E"], atol=1e-5)


def test_incremental_build_encodes_only_new_and_changed_tickets(home, model):
    settings, store = home
    first = build_index(store, model, settings, progress=False)
    assert build_index(store, model, settings, progress=False) == first  # nothing changed: no new version
    old = open_current(settings)
    changed = store.get_ticket(old.ticket_ids[3])
    changed.description += " The seal was replaced twice."
    store.clock = lambda: 4e9  # the update's timestamp differs from the first import's, without waiting
    store.import_dataset(Dataset([changed, Ticket("NEW-1", "Valve leaks", "Steam leaks at the valve stem.",
                                                  "Tighten the packing.")], source="update"))
    second = build_index(store, model, settings, progress=False)
    assert second != first
    new = open_current(settings)
    assert new.manifest["encoded"] == 2 and new.manifest["reused"] == 80 - 1
    assert new.ticket_ids == store.ticket_ids() and len(new) == 81
    fresh = model.encode_tickets(store.get_tickets(new.ticket_ids))
    for key, mat in new.vectors.items():
        np.testing.assert_allclose(mat, fresh[key], atol=1e-5)  # reused rows and new rows are both right
    assert not np.allclose(new.vectors["DESC.E"][3], old.vectors["DESC.E"][3])


def test_a_different_model_or_dtype_re_encodes_everything(home, model):
    settings, store = home
    build_index(store, model, settings, progress=False)
    version = build_index(store, model, settings, float16=True, progress=False)
    idx = open_current(settings)
    assert idx.version == version and idx.manifest["encoded"] == 80
    assert all(m.dtype == np.float16 for m in idx.vectors.values())
    full = build_index(store, model, settings, incremental=False, float16=True, progress=False)
    assert full != version and open_current(settings).manifest["encoded"] == 80


def test_old_versions_are_pruned_beyond_keep_indexes(home, model):
    settings, store = home
    built = [build_index(store, model, settings, incremental=False, progress=False) for _ in range(3)]
    assert list_versions(settings) == built[1:]
    assert current_version(settings) == built[-1]


def test_missing_or_corrupt_index_says_to_run_ticketrec_index(home, model):
    settings, store = home
    with pytest.raises(IndexStateError, match="ticketrec index"):
        open_current(settings)
    version = build_index(store, model, settings, progress=False)
    (settings.indexes_dir / version / "vectors.npy").unlink()
    with pytest.raises(IndexStateError, match="ticketrec index"):
        open_current(settings)
    np.save(settings.indexes_dir / version / "vectors.npy", np.zeros((3, 2), np.float32))
    with pytest.raises(IndexStateError, match="inconsistent"):
        TicketIndex.open(settings.indexes_dir / version)


def test_an_empty_knowledge_base_is_refused(tmp_path, model):
    settings = Settings.from_env({"TICKETREC_HOME": str(tmp_path)})
    with Store(settings.db) as store, pytest.raises(IndexStateError, match="import"):
        build_index(store, model, settings, progress=False)
    assert current_version(settings) is None


class _FailsMidway:
    """The real model, with an interrupt raised on the second batch (a fault we cannot cause otherwise)."""

    def __init__(self, model):
        self._model, self.calls = model, 0

    def __getattr__(self, name):
        return getattr(self._model, name)

    def encode_tickets(self, tickets, **kw):
        self.calls += 1
        if self.calls == 2:
            raise KeyboardInterrupt
        return self._model.encode_tickets(tickets, **kw)


def test_an_interrupted_build_leaves_the_current_version_serving(home, model, monkeypatch):
    settings, store = home
    first = build_index(store, model, settings, progress=False)
    monkeypatch.setattr(index_build, "BUILD_BATCH", 16)
    with pytest.raises(KeyboardInterrupt):
        build_index(store, _FailsMidway(model), settings, incremental=False, progress=False)
    assert current_version(settings) == first and list_versions(settings) == [first]
    assert not [p for p in settings.indexes_dir.iterdir() if p.name.startswith(".tmp-") and p.is_dir()]
    assert len(open_current(settings)) == 80


def test_a_second_concurrent_build_is_refused(home, model):
    settings, store = home
    with index_build._build_lock(settings.indexes_dir):
        with pytest.raises(IndexStateError, match="another index build"):
            build_index(store, model, settings, progress=False)


_SLOW_BUILD = """
import sys, time
from recommender.serving import index_build
from recommender.config import Settings
from recommender.model.bundle import TicketModel
from recommender.data.store import Store
settings = Settings.from_env()
model = TicketModel.load(settings.model)
encode = model.encode_tickets
def slow(tickets, **kw):
    time.sleep(0.3)  # make the build last long enough to be killed in the middle
    return encode(tickets, **kw)
model.encode_tickets = slow
index_build.BUILD_BATCH = 8
print("building", flush=True)
index_build.build_index(Store(settings.db), model, settings, incremental=False, progress=False)
print("finished", flush=True)
"""


def test_a_build_killed_with_sigkill_leaves_the_previous_version_serving(home, model, tiny_model):
    from recommender.serving.engine import Recommender
    from recommender.data.records import Query

    settings, store = home
    first = build_index(store, model, settings, progress=False)
    env = {**os.environ, "TICKETREC_HOME": str(settings.home), "TICKETREC_MODEL": str(settings.model)}
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_BUILD], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        partial = None
        while time.monotonic() < deadline and proc.poll() is None:
            tmp = [p for p in settings.indexes_dir.iterdir() if p.name.startswith(".tmp-") and p.is_dir()]
            if tmp and list(tmp[0].glob("*.npy")):
                partial = tmp[0]
                break
            time.sleep(0.05)
        assert partial is not None, "the build never started writing"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert "finished" not in proc.stdout.read()
    assert current_version(settings) == first
    engine = Recommender(settings, store=store, model=model)
    results = engine.recommend(Query("turbine vibration", "high vibration on the turbine bearing"), k=3)
    assert len(results) == 3 and results.info.index_version == first
    second = build_index(store, model, settings, incremental=False, progress=False)  # cleans the leftover
    assert not partial.exists() and current_version(settings) == second
