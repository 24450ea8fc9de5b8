"""How much of an index version is in memory (mincore), loading it at open where memory allows, locking it up to
TICKETREC_INDEX_PIN (mlock), and the figure in `ticketrec status` and on the status page."""
import json
import logging
import os
import re

import numpy as np
import pytest
from click.testing import CliRunner

from recommender.cli import main
from recommender.config import PIN_ALL, Settings
from recommender.errors import TicketrecError
from recommender.serving import residency
from recommender.serving.engine import Recommender
from recommender.serving.index import open_current
from recommender.serving.index_build import build_index
from recommender.serving.residency import resident_bytes


@pytest.fixture
def built(kb_home, tiny_ticket_model):
    """(settings, store): the tiny knowledge base with an index version built (float32)."""
    settings, store = kb_home
    build_index(store, tiny_ticket_model, settings, progress=False)
    return settings, store


def _drop_from_page_cache(index) -> bool:
    """Ask the kernel to drop the version's clean pages (only these files); whether it did (tmpfs cannot)."""
    for name in [p for p in os.listdir(index.path) if p.endswith(".npy")]:
        fd = os.open(index.path / name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    memory = index.memory()
    return memory["resident_bytes"] < memory["bytes"]


def _locked_kib() -> int:
    """VmLck of this process (/proc/self/status), in KiB."""
    return int(re.search(r"VmLck:\s+(\d+) kB", open("/proc/self/status").read()).group(1))


def test_pin_setting_reads_sizes_and_refuses_anything_else():
    assert Settings.from_env({}).index_pin == 0
    assert Settings.from_env({"TICKETREC_INDEX_PIN": "4G"}).index_pin == 4 << 30
    assert Settings.from_env({"TICKETREC_INDEX_PIN": "800m"}).index_pin == 800 << 20
    assert Settings.from_env({"TICKETREC_INDEX_PIN": "all"}).index_pin == PIN_ALL
    for bad in ("lots", "-1G", "inf"):
        with pytest.raises(TicketrecError, match=r"TICKETREC_INDEX_PIN must be a size such as .*fix or unset it"):
            Settings.from_env({"TICKETREC_INDEX_PIN": bad})


def test_resident_figure_follows_the_page_cache(tmp_path):
    data = np.arange(300_000, dtype=np.float32)
    np.save(tmp_path / "a.npy", data)
    mapped = np.load(tmp_path / "a.npy", mmap_mode="r")
    fd = os.open(tmp_path / "a.npy", os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    dropped = resident_bytes(mapped)
    float(mapped[::1024].sum())  # one value per page read
    assert resident_bytes(mapped) == mapped.nbytes
    if dropped == mapped.nbytes:
        pytest.skip("the kernel kept the pages (tmpfs?): only the loaded figure could be checked")
    assert dropped < mapped.nbytes


def test_warm_loads_the_version_and_locks_up_to_the_pin(built):
    settings, _ = built
    index = open_current(settings)
    assert index.pin == 0 and index.warmed is None
    _drop_from_page_cache(index)  # so that warm has pages to load (where the kernel drops them)
    done = index.warm()
    memory = index.memory()
    assert done["loaded"] and done["locked_bytes"] == 0 and done["reason"] is None
    assert memory["resident_bytes"] == memory["bytes"] > memory["vectors_bytes"] == index.vectors.matrix.nbytes
    assert memory["vectors_resident_bytes"] == memory["vectors_bytes"] and memory["locked_bytes"] == 0

    before = _locked_kib()
    pinned = open_current(settings.replace(index_pin=PIN_ALL))
    assert pinned.pin == PIN_ALL
    done = pinned.warm()
    if done["reason"] and "could not lock" in done["reason"]:
        pytest.skip(f"this process may not lock memory: {done['reason']}")
    assert done["locked_bytes"] == done["bytes"] == pinned.memory()["locked_bytes"]
    assert (_locked_kib() - before) * 1024 >= done["bytes"]  # the kernel agrees

    # a budget below the vectors' size locks the postings only (whole arrays, vectors first)
    small = open_current(settings.replace(index_pin=pinned.vectors.matrix.nbytes - 1))
    done = small.warm()
    assert 0 < done["locked_bytes"] < small.vectors.matrix.nbytes


def test_an_index_that_does_not_fit_is_not_loaded(built, monkeypatch, caplog):
    settings, _ = built
    index = open_current(settings.replace(index_pin=PIN_ALL))
    _drop_from_page_cache(index)
    missing = index.memory()["bytes"] - index.memory()["resident_bytes"]
    if missing == 0:
        pytest.skip("the kernel kept the pages (tmpfs?): nothing is left to load")
    monkeypatch.setattr(residency, "memory_info", lambda: {"total": 1 << 30, "available": residency.MIN_HEADROOM})
    with caplog.at_level(logging.WARNING, logger="recommender.serving.residency"):
        done = index.warm()
    assert not done["loaded"] and done["locked_bytes"] == 0  # nothing locked either: locking would load it
    assert "not loaded at open" in done["reason"] and "not loaded at open" in caplog.text


def test_a_refused_lock_says_what_to_do(built, monkeypatch):
    settings, _ = built

    def refuse(arr):
        return OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(residency, "_lock", refuse)
    done = open_current(settings.replace(index_pin=PIN_ALL)).warm()
    assert done["loaded"] and done["locked_bytes"] == 0
    assert "could not lock vectors.npy" in done["reason"] and "ulimit -l" in done["reason"]


def test_the_engine_warms_with_the_settings_pin(built, tiny_ticket_model):
    settings, store = built
    engine = Recommender(settings.replace(index_pin=PIN_ALL), store=store, model=tiny_ticket_model)
    index = engine.index
    assert index.warmed is not None and index.warmed["loaded"]
    assert index.warmed["locked_bytes"] in (0, index.warmed["bytes"])  # 0 only where locking is refused


def test_status_command_reports_the_resident_share(built):
    settings, _ = built
    env = {"TICKETREC_HOME": str(settings.home), "TICKETREC_INDEX_PIN": "1G"}
    index = open_current(settings)
    index.warm()
    result = CliRunner().invoke(main, ["status"], env=env)
    assert result.exit_code == 0, result.output
    assert f"index     {index.version}" in result.output
    assert re.search(r"resident  [\d.]+ GiB of [\d.]+ GiB \(100%\); vectors 100% in memory now", result.output)
    assert "1.00 GiB locked in memory by each serving process" in result.output
    data = json.loads(CliRunner().invoke(main, ["status", "--json"], env=env).stdout)
    assert data["tickets"] == len(index) and data["dtype"] == "float32" and data["pin"] == 1 << 30
    assert data["memory"]["resident_bytes"] == data["memory"]["bytes"] == index.memory()["bytes"]


def test_status_command_without_an_index_says_how_to_build_one(tmp_path):
    result = CliRunner().invoke(main, ["status"], env={"TICKETREC_HOME": str(tmp_path / "empty")})
    assert result.exit_code == 1 and "run `ticketrec index` to build one" in result.output


def test_status_page_shows_how_much_of_the_index_is_in_memory(engine_app):
    app = engine_app()
    page = app.test_client().get("/status").get_data(as_text=True)
    assert re.search(r"<dt>In memory</dt><dd>\d+% of [\d,]+ MiB", page)


# -- how versions store their vectors (TICKETREC_INDEX_DTYPE): float16 halves what has to be in memory ---------------
def test_dtype_setting_and_its_auto_threshold():
    from recommender.config import FLOAT16_FROM

    assert Settings.from_env({}).index_dtype == "auto"
    auto = Settings.from_env({"TICKETREC_INDEX_DTYPE": "AUTO"})
    assert auto.vector_dtype(FLOAT16_FROM - 1) == "float32" and auto.vector_dtype(FLOAT16_FROM) == "float16"
    assert Settings.from_env({"TICKETREC_INDEX_DTYPE": "float32"}).vector_dtype(10**7) == "float32"
    assert Settings.from_env({"TICKETREC_INDEX_DTYPE": "float16"}).vector_dtype(1) == "float16"
    with pytest.raises(TicketrecError, match="TICKETREC_INDEX_DTYPE must be auto, float16 or float32, not 'half'"):
        Settings.from_env({"TICKETREC_INDEX_DTYPE": "half"})


def test_builds_follow_the_dtype_setting_unless_told(kb_home, tiny_ticket_model, monkeypatch):
    from recommender import config

    settings, store = kb_home
    build_index(store, tiny_ticket_model, settings, progress=False)  # auto, 80 tickets: float32
    assert open_current(settings).manifest["dtype"] == "float32"
    monkeypatch.setattr(config, "FLOAT16_FROM", 50)  # auto now means float16 for this knowledge base
    version = build_index(store, tiny_ticket_model, settings, progress=False)
    index = open_current(settings)
    assert index.version == version and index.manifest["dtype"] == "float16"
    assert index.manifest["reused"] == 0 and index.vectors.matrix.dtype == np.float16  # another dtype: re-encoded
    assert build_index(store, tiny_ticket_model, settings, progress=False) == version  # up to date: reused as is
    env = {"TICKETREC_HOME": str(settings.home), "TICKETREC_MODEL": str(settings.model), "TICKETREC_INDEX_WORKERS": "1"}
    result = CliRunner().invoke(main, ["index", "--float32"], env={**env, "TICKETREC_INDEX_DTYPE": "float16"})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["dtype"] == "float32"  # the flag wins over the setting
    result = CliRunner().invoke(main, ["index"], env={**env, "TICKETREC_INDEX_DTYPE": "float16"})
    assert json.loads(result.stdout)["dtype"] == "float16"
