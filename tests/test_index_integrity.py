"""Index integrity (issue 14): every file of a version recorded in its manifest (size, sha256) and sealed read-only,
checked when a version is built, switched to and opened, `ticketrec index --verify`; a version that fails is neither
served nor reused; a serving process refuses a file changed under it instead of dying; disk full and killed builds
leave no temporary files and the previous version serving."""
import errno
import hashlib
import json
import logging
import os
import stat
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from recommender.cli import main
from recommender.config import Settings
from recommender.data.records import Query
from recommender.data.store import Dataset, Store
from recommender.errors import IndexStateError
from recommender.serving import index as index_mod
from recommender.serving import index_build
from recommender.serving.engine import Recommender
from recommender.serving.index import (SAMPLED_ROWS, TicketIndex, current_version, list_versions, open_current,
                                       switch_current, verify_version)
from recommender.serving.index_build import build_index

ROOT = Path(__file__).resolve().parents[1]
TICKETREC = Path(sys.executable).with_name("ticketrec")
QUERY = Query("turbine vibration", "high vibration on the turbine bearing after restart")


def _env(settings) -> dict:
    return {**os.environ, "TICKETREC_HOME": str(settings.home), "TICKETREC_MODEL": str(settings.model),
            "TICKETREC_DB": str(settings.db), "TICKETREC_BROKER_URL": ""}


def _temporaries(settings) -> list[Path]:
    return [p for p in settings.indexes_dir.iterdir() if p.name.startswith(".tmp-")]


def _payload_offset(path: Path) -> int:
    with open(path, "rb") as fh:
        np.lib.format.read_magic(fh)
        np.lib.format.read_array_header_1_0(fh)
        return fh.tell()


def _damage(path: Path, how: str, row: int = 0, keep_mtime: bool = False) -> None:
    """Truncate `path` to half, or overwrite one float32 row of it in place (`row` of a [n, width] .npy, size kept):
    with NaN ("nan") or finite garbage ("ones"); `keep_mtime` puts the modification time back (a stealthy change)."""
    before = path.stat()
    os.chmod(path, 0o644)  # the files are read-only (root ignores that; other users must lift it first)
    with open(path, "r+b") as fh:
        if how == "truncate":
            fh.truncate(before.st_size // 2)
        else:
            width = np.load(path, mmap_mode="r").shape[1]
            fh.seek(_payload_offset(path) + row * width * 4)
            fh.write(np.full(width, np.nan if how == "nan" else 1.0, np.float32).tobytes())
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_every_file_is_recorded_sealed_read_only_and_verifies(kb_home, tiny_ticket_model):
    (settings, store), model = kb_home, tiny_ticket_model
    version = build_index(store, model, settings, progress=False)
    path = settings.indexes_dir / version
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format_version"] == index_mod.FORMAT_VERSION == 4
    on_disk = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
    assert set(manifest["files"]) == set(on_disk) - {"manifest.json"}
    assert {"vectors.npy", "bm25_rows.npy", "ticket_ids.json", "model/weights.pt"} <= set(manifest["files"])
    for name, entry in manifest["files"].items():
        data = (path / name).read_bytes()
        assert entry["bytes"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest(), name
    assert {stat.S_IMODE((path / name).stat().st_mode) for name in on_disk} == {0o444}
    report = verify_version(settings)
    assert report["problems"] == [] and report["version"] == version and report["files"] == len(on_disk) - 1


def test_verify_cli_names_each_bad_file_on_its_own_line(kb_home, tiny_ticket_model):
    (settings, store), model = kb_home, tiny_ticket_model
    version = build_index(store, model, settings, progress=False)
    path = settings.indexes_dir / version
    runner = CliRunner()
    ok = runner.invoke(main, ["index", "--verify"], env=_env(settings))
    assert ok.exit_code == 0, ok.output
    report = json.loads(ok.stdout)
    assert report["ok"] is True and report["version"] == version and report["path"] == str(path)
    assert report["files"] > 10 and report["bytes"] > 0 and ok.stderr == ""
    _damage(path / "vectors.npy", "ones", row=5, keep_mtime=True)  # same size, same mtime: only the checksum knows
    TicketIndex.open(path).close()  # the cheap check on open does not hash an unchanged-looking file...
    _damage(path / "bm25_rows.npy", "truncate")
    bad = runner.invoke(main, ["index", "--verify", version], env=_env(settings))  # ...the full one does
    assert bad.exit_code == 1
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in bad.output
    assert lines[0].startswith(f"error: index {version}: bm25_rows.npy: ") and "the manifest says" in lines[0]
    assert lines[1].startswith(f"error: index {version}: vectors.npy: ") and "sha256" in lines[1]
    missing = runner.invoke(main, ["index", "--verify", "20990101T000000000000-abcdef"], env=_env(settings))
    assert missing.exit_code == 1 and "does not exist" in missing.stderr and len(missing.stderr.splitlines()) == 1
    mixed = runner.invoke(main, ["index", "--verify", "--full"], env=_env(settings))
    assert mixed.exit_code == 1 and "builds nothing" in mixed.stderr


def test_an_incremental_build_repairs_a_truncated_postings_file(kb_home, tiny_ticket_model, caplog):
    (settings, store), model = kb_home, tiny_ticket_model
    first = build_index(store, model, settings, progress=False)
    _damage(settings.indexes_dir / first / "bm25_tf.npy", "truncate")
    with caplog.at_level(logging.WARNING, logger="recommender.serving.index_build"):
        second = build_index(store, model, settings, progress=False)  # not "up to date"
    assert second != first and current_version(settings) == second
    assert any("bm25_tf.npy" in r.getMessage() and "from scratch" in r.getMessage() for r in caplog.records)
    idx = open_current(settings)
    assert idx.manifest["encoded"] == 80 and idx.manifest["reused"] == 0
    assert "bm25_tf.npy" in idx.manifest["full_build_reason"]
    assert verify_version(settings)["problems"] == []
    assert Recommender(settings, store=store).recommend(QUERY, k=3).info.index_version == second


def test_corrupt_rows_the_cheap_check_misses_are_never_reused(kb_home, tiny_ticket_model, caplog):
    (settings, store), model = kb_home, tiny_ticket_model
    first = build_index(store, model, settings, progress=False)
    sampled = set(np.linspace(0, 79, SAMPLED_ROWS).astype(np.int64).tolist())
    row = next(r for r in range(80) if r not in sampled)
    _damage(settings.indexes_dir / first / "vectors.npy", "nan", row=row, keep_mtime=True)
    assert open_current(settings).version == first  # the open's sample does not see it
    with caplog.at_level(logging.WARNING, logger="recommender.serving.index_build"):
        second = build_index(store, model, settings, progress=False)  # nothing changed, but the checksum did
    assert second != first and any("full build" in r.getMessage() for r in caplog.records)
    idx = open_current(settings)
    assert idx.version == second and idx.manifest["reused"] == 0 and "vectors.npy" in idx.manifest["full_build_reason"]
    assert np.isfinite(np.asarray(idx.vectors.matrix)).all()  # the NaN row did not propagate
    assert build_index(store, model, settings, progress=False) == second  # a good version is reused as before


class _NaNFor:
    """The real model, with NaN in the vectors of some tickets (a broken model we cannot train on purpose)."""

    def __init__(self, model, ids):
        self._model, self.ids = model, set(ids)

    def __getattr__(self, name):
        return getattr(self._model, name)

    def encode_tickets(self, tickets, **kw):
        out = self._model.encode_tickets(tickets, **kw)
        for i, ticket in enumerate(tickets):
            if ticket.id in self.ids:
                out["DESC.E"][i, 1] = np.nan
        return out


def test_non_finite_vectors_are_refused_at_build_naming_the_tickets(kb_home, tiny_ticket_model):
    (settings, store), model = kb_home, tiny_ticket_model
    first = build_index(store, model, settings, progress=False)
    broken = store.ticket_ids()[7:9]
    with pytest.raises(IndexStateError, match="non-finite DESC.E") as err:
        build_index(store, _NaNFor(model, broken), settings, incremental=False, progress=False)
    assert all(tid in str(err.value) for tid in broken)
    assert current_version(settings) == first and list_versions(settings) == [first] and not _temporaries(settings)


def test_a_version_failing_verification_is_skipped_with_a_warning(kb_home, tiny_ticket_model, caplog):
    from web import create_app

    (settings, store), model = kb_home, tiny_ticket_model
    first = build_index(store, model, settings, progress=False)
    second = build_index(store, model, settings, incremental=False, progress=False)
    _damage(settings.indexes_dir / second / "vectors.npy", "nan", row=3)  # mtime moves: the open hashes it
    with pytest.raises(IndexStateError, match="inconsistent with its manifest.*vectors.npy.*ticketrec index --full"):
        open_current(settings, fallback=False)
    with caplog.at_level(logging.WARNING, logger="recommender.serving.index"):
        assert open_current(settings).version == first
    assert any(second in r.getMessage() and f"previous good version {first}" in r.getMessage() for r in caplog.records)
    with pytest.raises(IndexStateError, match=f"refusing to switch to index {second}"):
        switch_current(settings, second)
    client = create_app({"TESTING": True, "TICKETREC_SETTINGS": settings}).test_client()
    body = client.post("/api/v1/recommendations", json={"subject": "turbine vibration", "k": 3}).get_json()
    assert body["index_version"] == first
    health = client.get("/api/v1/healthz").get_json()
    assert health["index"]["version"] == first and second in health["index"]["warning"]
    assert "vectors.npy" in health["index"]["warning"]
    page = client.get("/status").get_data(as_text=True)
    assert f"index {second} (CURRENT) is not served" in page


_SERVER = """
import json, sys
from recommender.config import Settings
from recommender.data.records import Query
from recommender.errors import TicketrecError
from recommender.serving.engine import Recommender
engine = Recommender(Settings.from_env())
for line in sys.stdin:
    try:
        answer = engine.recommend(Query("turbine vibration", line.strip()), k=3)
        print(json.dumps({"version": answer.info.index_version, "ids": [r.ticket.id for r in answer]}), flush=True)
    except TicketrecError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
"""


@pytest.mark.parametrize("how", ["truncate", "nan"])
def test_a_serving_process_refuses_a_file_changed_under_it_instead_of_dying(kb_home, tiny_ticket_model, how):
    (settings, store), model = kb_home, tiny_ticket_model
    first = build_index(store, model, settings, progress=False)
    second = build_index(store, model, settings, incremental=False, progress=False)
    server = subprocess.Popen([sys.executable, "-c", _SERVER], cwd=ROOT, env=_env(settings), text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def ask(text: str) -> dict:
            server.stdin.write(text + "\n")
            server.stdin.flush()
            line = server.stdout.readline()
            assert line, f"the server died ({server.poll()}): {server.stderr.read()[-2000:]}"
            return json.loads(line)

        assert ask("high vibration on the turbine bearing")["version"] == second
        _damage(settings.indexes_dir / second / "vectors.npy", how, row=40)  # its pages are mapped by the server
        for _ in range(2):
            answer = ask("high vibration on the turbine bearing")
            assert "changed on disk" in answer["error"] and "vectors.npy" in answer["error"]
            assert server.poll() is None
        server.stdin.close()
        assert server.wait(timeout=60) == 0  # a clean exit, not SIGBUS
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    fresh = subprocess.run([str(TICKETREC), "recommend", "--json", "--subject", "turbine vibration", "--description",
                            "high vibration on the turbine bearing"], cwd=ROOT, env=_env(settings),
                           capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr
    assert json.loads(fresh.stdout)["info"]["index_version"] == first  # the previous good version serves
    assert f"previous good version {first}" in fresh.stderr and second in fresh.stderr


def test_the_free_space_is_checked_before_a_build(kb_home, tiny_ticket_model, monkeypatch):
    (settings, store), model = kb_home, tiny_ticket_model
    first = build_index(store, model, settings, progress=False)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(index_build.shutil, "disk_usage", lambda path: usage(10 ** 9, 10 ** 9 - 5000, 5000))
    with pytest.raises(IndexStateError, match=r"5,000 bytes free, about [\d,]+ needed; free some space") as err:
        build_index(store, model, settings, incremental=False, progress=False)
    needed = int(str(err.value).split("about ")[1].split(" needed")[0].replace(",", ""))
    assert needed > sum(p.stat().st_size for p in (settings.indexes_dir / first).rglob("*.npy"))
    assert current_version(settings) == first and list_versions(settings) == [first] and not _temporaries(settings)


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("where", ["numpy.save", "os.posix_fallocate"])
def test_a_disk_that_fills_up_mid_build_leaves_no_temporaries(kb_home, tiny_ticket_model, monkeypatch, where):
    (settings, store), model = kb_home, tiny_ticket_model
    first = build_index(store, model, settings, progress=False)
    module, name = where.split(".")
    monkeypatch.setattr(np if module == "numpy" else os, name, _no_space)  # a fault we cannot cause otherwise
    with pytest.raises(IndexStateError, match=f"filled up during the index build.*index {first} still serves"):
        build_index(store, model, settings, incremental=False, progress=False)
    monkeypatch.undo()
    assert current_version(settings) == first and list_versions(settings) == [first] and not _temporaries(settings)
    assert Recommender(settings, store=store).recommend(QUERY, k=3).info.index_version == first


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (skipped where it cannot be mounted: not root, or no CAP_SYS_ADMIN in a container)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a small tmpfs to fill up ({exc})")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill up ({done.stderr.strip() or done.returncode})")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_real_full_disk(small_disk, tmp_path, tiny_model, tiny_ticket_model, another_model, monkeypatch):
    settings = Settings.from_env({"TICKETREC_HOME": str(small_disk / "home"), "TICKETREC_DB": str(tmp_path / "kb.db"),
                                  "TICKETREC_MODEL": str(tiny_model[0])})
    with Store(settings.db) as store:
        store.import_dataset(Dataset(tiny_model[1].tickets, source="kb"))
        first = build_index(store, tiny_ticket_model, settings, progress=False)
        filler = small_disk / "filler"

        def leave(kib: int) -> None:  # fill the disk up to `kib` KiB free
            filler.unlink(missing_ok=True)
            disk = os.statvfs(small_disk)
            filler.write_bytes(b"\0" * (disk.f_bavail * disk.f_frsize - kib * 1024))

        leave(16)  # less than the vectors alone (36 KB): writing them through the map was a SIGBUS
        with pytest.raises(IndexStateError, match=r"bytes free, about [\d,]+ needed"):
            build_index(store, tiny_ticket_model, settings, incremental=False, progress=False)
        monkeypatch.setattr(index_build, "_check_free_space", lambda root, needed: None)  # past it: a real full disk
        # the same model (hard links) with no room for the vectors, then another model (saved again by torch) with
        # room for the vectors and postings only
        for model, kib in ((tiny_ticket_model, 16), (another_model, 16), (another_model, 160)):
            leave(kib)
            with pytest.raises(IndexStateError, match=f"filled up during the index build.*index {first} still serves"):
                build_index(store, model, settings, incremental=False, progress=False)
            assert list_versions(settings) == [first] and not _temporaries(settings)
        filler.unlink()
        second = build_index(store, another_model, settings, progress=False)
    assert current_version(settings) == second and verify_version(settings)["problems"] == []


def test_stale_temporaries_are_removed_by_the_next_build_not_during_one(kb_home, tiny_ticket_model):
    (settings, store), model = kb_home, tiny_ticket_model
    first = build_index(store, model, settings, progress=False)
    stale = settings.indexes_dir / f".tmp-{first}x.killed"  # what a build killed with SIGKILL leaves
    stale.mkdir()
    (stale / "vectors.npy").write_bytes(b"\0" * 1_000_000)
    with index_build._build_lock(settings.indexes_dir):  # a build is running: its temporaries are not stale
        with pytest.raises(IndexStateError, match="another index build"):
            build_index(store, model, settings, progress=False)
        assert stale.exists()
    done = CliRunner().invoke(main, ["index"], env=_env(settings))  # up to date, and tidies up
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["version"] == first and not stale.exists() and not _temporaries(settings)


def test_a_format_3_version_is_served_but_not_reused(kb_home, tiny_ticket_model, caplog):
    (settings, store), model = kb_home, tiny_ticket_model
    first = build_index(store, model, settings, progress=False)
    manifest_path = settings.indexes_dir / first / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["format_version"] = 3
    del manifest["files"], manifest["full_build_reason"]
    os.chmod(manifest_path, 0o644)
    manifest_path.write_text(json.dumps(manifest))  # what ticketrec 3's builds wrote
    assert open_current(settings).version == first
    problems = verify_version(settings)["problems"]
    assert len(problems) == 1 and "format 3" in problems[0] and "ticketrec index --full" in problems[0]
    with caplog.at_level(logging.WARNING, logger="recommender.serving.index_build"):
        second = build_index(store, model, settings, progress=False)
    assert second != first and open_current(settings).manifest["reused"] == 0
    assert any("format 3" in r.getMessage() for r in caplog.records)
