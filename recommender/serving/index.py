"""Immutable index versions of precomputed ticket vectors under TICKETREC_HOME/indexes/, switched atomically.

A version directory holds `ticket_ids.json`, `updated_at.npy` (each ticket's store timestamp, for incremental
builds), `vectors.npy` (one memory-mappable row per ticket holding its EncodedBatch vectors, `SUB.h`, `DESC.E`,
..., side by side in the manifest's `keys` order: those the metric weighs above zero and the topic pre-filter's,
`TicketModel.served_keys`), the BM25 postings of the same tickets (`bm25_*`,
see `bm25_postings`), `model/` (the model directory the tickets were encoded with: a version is a deployable
unit, and every reader serves the model of the version it opened, `TicketIndex.model`) and `manifest.json`
(model fingerprint, the size, sha256 and modification time of every file it holds, counts, dtype, metric spec,
BM25 statistics). A build checks the free disk space, writes into a hidden temporary directory, seals its files
read-only, records them in the manifest, verifies it, renames it into place and only then points `CURRENT` at it
(temp file + os.replace), so a failed, interrupted, disk-full or killed build leaves the previous version serving;
the next build removes what a killed one left.

Integrity: opening a version checks every file's size against the manifest (and its sha256 where its modification
time differs from the manifest's) and finite values in a sample of vector rows; `verify_version` (`ticketrec index
--verify`) checks every checksum and every row. A version that fails is not served (`open_current` falls back to
the newest older version that passes) and never reused by an incremental build. An opened version keeps its mapped
files open and refuses to be read once one of them changed size or content on disk (`TicketIndex.changed_files`),
so a truncated file is an IndexStateError rather than a SIGBUS (see docs/internals.md for what remains).

This module reads versions; `index_build.py` writes them, `residency.py` keeps their arrays in memory.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Sequence

import numpy as np

from ..lexical.postings import Bm25Postings, postings_files
from ..config import Settings
from ..errors import IndexStateError
from ..files import atomic_write_text
from .scoring import PackedVectors
from .residency import load_into_memory, resident_bytes

log = logging.getLogger(__name__)

FORMAT_VERSION = 4  # 2: one packed vectors.npy, BM25 postings; 3: the model in model/; 4: every file's checksum
#: Formats this ticketrec opens. 3 records checksums of model/ only: it is served, but never reused by a build.
READABLE_FORMATS = (3, 4)
CURRENT_FILE = "CURRENT"
MANIFEST = "manifest.json"
IDS_FILE = "ticket_ids.json"
UPDATED_FILE = "updated_at.npy"
VECTORS_FILE = "vectors.npy"
MODEL_DIR = "model"
#: The memory-mapped files of a version: a reader checks them for changes before every use (the postings' files
#: depend on the version: `postings_files`).
MAPPED_FILES = (VECTORS_FILE, *postings_files({"impacts": True}))
#: Rows of vectors.npy checked for finite values when a version is opened (evenly spaced; every row when verified).
SAMPLED_ROWS = 64
TMP_PREFIX = ".tmp-"
_RUN_INDEX = "run `ticketrec index` to build one"
_REBUILD = "rebuild the index with `ticketrec index --full` (add --model DIR when TICKETREC_MODEL is not the model)"
#: Why a version could not be served by this process (its path → one line), until it opens again; health pages
#: read it (`serving_warning`).
_REFUSED: dict[str, str] = {}


class _FileGuard:
    """Open descriptors of a version's mapped files with their size and modification time when it was opened.

    `changed()` costs one fstat per file (about a microsecond each): a reader calls it before touching the pages,
    so that a file truncated under it (whose pages would raise SIGBUS) or overwritten in place is refused with a
    message instead. The descriptors follow the mapped inode even when the path is replaced."""

    def __init__(self, directory: Path, names: Sequence[str]):
        self.fds: dict[str, int] = {}
        self.stamps: dict[str, tuple[int, int]] = {}
        self._finalizer = weakref.finalize(self, _close_fds, self.fds)
        for name in names:
            fd = os.open(directory / name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            self.fds[name] = fd
            st = os.fstat(fd)
            self.stamps[name] = (st.st_size, st.st_mtime_ns)

    def changed(self) -> list[str]:
        """One line per file whose size or modification time is not what it was when the version was opened."""
        out = []
        for name, fd in self.fds.items():
            st = os.fstat(fd)
            size, mtime = self.stamps[name]
            if st.st_size != size:
                out.append(f"{name} is {st.st_size:,} bytes, was {size:,} (truncated or rewritten)")
            elif st.st_mtime_ns != mtime:
                out.append(f"{name} was overwritten")
        return out

    def close(self) -> None:
        self._finalizer()


def _close_fds(fds: dict[str, int]) -> None:
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()


class TicketIndex:
    """One opened index version: ticket ids, their memory-mapped vectors and BM25 postings."""

    def __init__(self, path: Path, manifest: dict, ticket_ids: list[str], vectors: PackedVectors,
                 updated_at: np.ndarray, guard: _FileGuard | None = None):
        self.path = Path(path)
        self.manifest = manifest
        self.ticket_ids = ticket_ids
        self._vectors = vectors
        self.updated_at = updated_at
        self._guard = guard
        self._rows: dict[str, int] | None = None
        self._bm25: Bm25Postings | None = None
        self._model = None
        self._model_lock = threading.Lock()  # the model is loaded once, by the first thread that needs it
        #: Bytes `warm` may lock in memory (TICKETREC_INDEX_PIN; `open_version` sets it from the settings).
        self.pin = 0
        #: What `warm` did (None before it ran): see `load_into_memory`.
        self.warmed: dict | None = None

    @property
    def version(self) -> str:
        return self.manifest["version"]

    @property
    def vectors(self) -> PackedVectors:
        """The memory-mapped ticket vectors; IndexStateError when a mapped file changed on disk since the open."""
        self.check_unchanged()
        return self._vectors

    def changed_files(self) -> list[str]:
        """One line per mapped file that was truncated or overwritten on disk since this version was opened."""
        return self._guard.changed() if self._guard is not None else []

    def check_unchanged(self) -> None:
        """IndexStateError when a mapped file changed on disk under this reader (reading its pages could crash it
        with SIGBUS, or serve other numbers than the ones built): a clear error instead."""
        changed = self.changed_files()
        if changed:
            raise IndexStateError(f"index {self.version} changed on disk while it was served ({'; '.join(changed)});"
                                  " restart to serve the previous good version, or rebuild with `ticketrec index --full`")

    @property
    def model_version(self) -> str:
        return self.manifest["model_version"]

    @property
    def metric_spec(self) -> dict:
        """The metric the index was built for (workers score with it without loading the model)."""
        return self.manifest["metric_spec"]

    @property
    def model_dir(self) -> Path:
        """The copy of the model directory this version was encoded with."""
        return self.path / MODEL_DIR

    @property
    def model(self):
        """The `TicketModel` this version was encoded with, loaded from `model/` on first use (once, thread-safe)
        and checked against the manifest's checksums and fingerprint; IndexStateError saying how to rebuild."""
        model = self._model
        if model is None:
            with self._model_lock:
                if self._model is None:
                    self._model = self._load_model()
                model = self._model
        return model

    def _load_model(self):
        from ..errors import ModelError
        from ..model.bundle import TicketModel

        def broken(why: str) -> IndexStateError:
            why = " ".join(str(why).split())  # one line
            message = f"the model of index {self.version} is missing or corrupt ({why}); {_REBUILD}"
            _REFUSED[str(self.path)] = message
            return IndexStateError(message)

        expected = (self.manifest.get("model") or {}).get("files")
        if not self.model_dir.is_dir() or not expected:
            raise broken(f"no {MODEL_DIR}/ directory in {self.path}")
        found = checksums(self.model_dir)
        changed = sorted(name for name, digest in expected.items() if found.get(name) != digest)
        if changed:
            raise broken(f"{', '.join(changed[:3])} missing or changed since the build (checksums)")
        try:
            model = TicketModel.load(self.model_dir)
        except ModelError as exc:
            raise broken(exc) from exc
        if model.version != self.model_version:
            raise broken(f"its fingerprint is {model.version}, the vectors were encoded with {self.model_version}")
        getattr(model, "_ensure_inference", lambda: None)()  # inference caches built now, not by racing queries
        return model

    def __len__(self) -> int:
        return len(self.ticket_ids)

    def close(self) -> None:
        """Close the file descriptors kept for the change check (the maps stay readable until dropped)."""
        if self._guard is not None:
            self._guard.close()

    def warm(self, pin: int | None = None) -> dict:
        """Load the vectors and the postings queries read into memory now, so queries do not pay page faults (a
        serving process calls it once per version; the files stay shared in the page cache): every page mapped and
        read once when they fit in the available memory, then locked (mlock) up to `pin` bytes, vectors first
        (default: TICKETREC_INDEX_PIN of the settings the version was opened with). Returns what it did
        (`load_into_memory`), also kept as `self.warmed`."""
        arrays = {VECTORS_FILE: self.vectors.matrix,
                  **{f"postings {i}": arr for i, arr in enumerate(self.bm25.hot_arrays())}}
        self.warmed = load_into_memory(arrays, self.pin if pin is None else pin, label=f"index {self.version}")
        return self.warmed

    def memory(self) -> dict:
        """How much of the mapped vectors and postings is in memory now: {"bytes", "resident_bytes" (pages in the
        page cache, by mincore(2); None where it cannot be asked), "vectors_bytes", "vectors_resident_bytes",
        "locked_bytes" (locked by this process's `warm`), "pin" (its budget)}. A separate process (`ticketrec status`)
        sees the same page cache, so it can tell how much of a served version is resident."""
        self.check_unchanged()
        vectors = self._vectors.matrix
        arrays = [vectors, *self.bm25.hot_arrays()]
        resident = [resident_bytes(arr) for arr in arrays]
        return {"bytes": int(sum(arr.nbytes for arr in arrays)),
                "resident_bytes": None if None in resident else int(sum(resident)),
                "vectors_bytes": int(vectors.nbytes), "vectors_resident_bytes": resident[0],
                "locked_bytes": int((self.warmed or {}).get("locked_bytes", 0)), "pin": int(self.pin)}

    @property
    def bm25(self) -> Bm25Postings:
        """The version's BM25 postings (opened on first use): the embedded pre-filter over these rows; IndexStateError
        when a mapped file changed on disk since the open."""
        self.check_unchanged()
        if self._bm25 is None:
            self._bm25 = Bm25Postings.open(self.path, self.manifest.get("bm25"), len(self))
        return self._bm25

    @property
    def row_of(self) -> dict[str, int]:
        """ticket id → row in the matrices."""
        if self._rows is None:
            self._rows = {tid: i for i, tid in enumerate(self.ticket_ids)}
        return self._rows

    def rows_for(self, ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(rows, positions) of the ids this index holds; `positions` index into `ids` (unknown ids skipped)."""
        lookup = self.row_of
        rows, positions = [], []
        for pos, tid in enumerate(ids):
            row = lookup.get(tid)
            if row is not None:
                rows.append(row)
                positions.append(pos)
        return np.asarray(rows, np.int64), np.asarray(positions, np.int64)

    def shard_rows(self, shard: int, n_shards: int) -> tuple[int, int]:
        """The contiguous row range [start, stop) of shard `shard` of `n_shards`."""
        return shard_bounds(len(self), shard, n_shards)

    @classmethod
    def open(cls, path: str | Path, full: bool = False) -> "TicketIndex":
        """Open a version directory, memory-mapping its matrices (mmap_mode='r'); IndexStateError if unusable.

        Checked first: every file the manifest lists has its size (and its sha256 where its modification time is not
        the manifest's), the shapes agree, and SAMPLED_ROWS rows of the vectors are finite. `full`: every sha256
        and every row (`verify_version`)."""
        path = Path(path)
        manifest = _read_manifest(path)
        missing, bad = file_problems(path, manifest, full=full)
        if missing:
            raise IndexStateError(f"index {path} is missing or corrupt ({'; '.join(missing[:3])}); {_REBUILD}")
        if bad:
            raise IndexStateError(f"index {path} is inconsistent with its manifest ({'; '.join(bad[:3])}); {_REBUILD}")
        return cls._load(path, manifest, every_row=full)

    @classmethod
    def _load(cls, path: Path, manifest: dict, every_row: bool = False) -> "TicketIndex":
        """Map a version whose files were checked: shapes against the manifest, then finite vectors (a sample)."""
        guard = None
        try:
            ticket_ids = json.loads((path / IDS_FILE).read_text())
            updated_at = np.load(path / UPDATED_FILE)  # small: read, not mapped
            mapped = (VECTORS_FILE, *postings_files(manifest.get("bm25")))
            guard = _FileGuard(path, mapped)
            recorded = {name: _manifest_bytes(manifest, name) for name in mapped}
            if any(recorded[name] not in (None, size) for name, (size, _) in guard.stamps.items()):
                raise ValueError("a file changed while the version was opened")
            matrix = np.load(path / VECTORS_FILE, mmap_mode="r")
            dims = {key: int(d) for key, d in manifest["keys"].items()}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if guard is not None:
                guard.close()
            raise IndexStateError(f"index {path} is missing or corrupt ({exc}); {_RUN_INDEX}") from exc
        n = manifest.get("n_tickets")
        problems = []
        if len(ticket_ids) != n:
            problems.append(f"{IDS_FILE} has {len(ticket_ids)} ids")
        if updated_at.shape != (n,):
            problems.append(f"{UPDATED_FILE} has shape {updated_at.shape}")
        if matrix.shape != (n, sum(dims.values())):
            problems.append(f"{VECTORS_FILE} has shape {matrix.shape}, not ({n}, {sum(dims.values())})")
        if problems:
            guard.close()
            raise IndexStateError(f"index {path} is inconsistent (manifest says {n} tickets; " + ", ".join(problems)
                                  + f"); {_RUN_INDEX}")
        rows = None if every_row else np.unique(np.linspace(0, n - 1, min(n, SAMPLED_ROWS)).astype(np.int64))
        bad = nonfinite_rows(matrix, rows)
        if len(bad):
            guard.close()
            raise IndexStateError(f"index {path} holds non-finite vectors (NaN or infinity) for tickets "
                                  f"{some_items(ticket_ids[int(r)] for r in bad)}; {_REBUILD}")
        return cls(path, manifest, ticket_ids, PackedVectors(matrix, dims), updated_at, guard)


def nonfinite_rows(matrix: np.ndarray, rows: np.ndarray | None = None, step: int = 65536) -> np.ndarray:
    """The rows of `matrix` (of `rows`, default all of them) holding a NaN or an infinity, read in slices."""
    bad = []
    total = matrix.shape[0] if rows is None else len(rows)
    for start in range(0, total, step):
        block = matrix[start : start + step] if rows is None else matrix[rows[start : start + step]]
        found = np.flatnonzero(~np.isfinite(block).all(axis=1))
        if len(found):
            bad.append(found + start if rows is None else rows[start : start + step][found])
    return np.concatenate(bad) if bad else np.zeros(0, np.int64)


def some_items(items, n: int = 5) -> str:
    """The first n of many names, and how many there are in all."""
    items = list(items)
    shown = ", ".join(map(str, items[:n]))
    return shown + (f" ({len(items)} in all)" if len(items) > n else "")


def _read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise IndexStateError(f"index {path} is missing or corrupt ({MANIFEST}: {exc}); {_RUN_INDEX}") from exc
    if not isinstance(manifest, dict) or manifest.get("format_version") not in READABLE_FORMATS:
        found = manifest.get("format_version") if isinstance(manifest, dict) else None
        raise IndexStateError(f"index {path} has format version {found}, this ticketrec reads "
                              f"{' and '.join(map(str, READABLE_FORMATS))}; {_REBUILD}")
    return manifest


def _manifest_bytes(manifest: dict, name: str) -> int | None:
    entry = (manifest.get("files") or {}).get(name)
    return entry.get("bytes") if isinstance(entry, dict) else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checksums(directory: Path) -> dict[str, str]:
    """sha256 of every file under `directory`, by its path relative to it."""
    return {path.relative_to(directory).as_posix(): _sha256(path)
            for path in sorted(p for p in directory.rglob("*") if p.is_file())}


def file_records(directory: Path) -> dict[str, dict]:
    """The manifest's `files`: size, sha256 and modification time of every file under `directory` but the manifest."""
    out = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        name = path.relative_to(directory).as_posix()
        if name != MANIFEST:
            st = path.stat()
            out[name] = {"bytes": st.st_size, "sha256": _sha256(path), "mtime_ns": st.st_mtime_ns}
    return out


def file_problems(path: Path, manifest: dict, full: bool, extras: bool = False) -> tuple[list[str], list[str]]:
    """(missing, bad): one line per file of the version at `path` that is missing or unreadable, or whose size, or
    sha256, is not the manifest's. The sha256 is computed when `full`, or when the file's modification time is not
    the manifest's (a copy of the directory, or a write since the build); `extras` also lists unrecorded files.
    Format 3 recorded checksums of model/ only: those are checked when `full`."""
    files = manifest.get("files")
    if not isinstance(files, dict):
        model_files = (manifest.get("model") or {}).get("files") or {}
        files = {f"{MODEL_DIR}/{name}": {"sha256": digest} for name, digest in model_files.items()} if full else {}
        extras = False
    missing, bad = [], []
    for name, entry in sorted(files.items()):
        file = path / name
        try:
            st = file.stat()
            if entry.get("bytes") is not None and st.st_size != entry["bytes"]:
                bad.append(f"{name}: {st.st_size:,} bytes, the manifest says {entry['bytes']:,} "
                           "(truncated or overwritten since the build)")
            elif (full or st.st_mtime_ns != entry.get("mtime_ns")) and _sha256(file) != entry.get("sha256"):
                bad.append(f"{name}: its sha256 is not the manifest's (overwritten since the build)")
        except FileNotFoundError:
            missing.append(f"{name}: missing")
        except OSError as exc:
            missing.append(f"{name}: unreadable ({exc.strerror or exc})")
    if extras:
        found = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()}
        bad += [f"{name}: not in the manifest (added since the build)" for name in sorted(found - set(files) - {MANIFEST})]
    return missing, bad


def verify_version(settings: Settings, version: str | None = None) -> dict:
    """Check a version (default: CURRENT) in full: every file's sha256 and size against the manifest, no file
    missing or added, the shapes, every vector row finite, the postings and the model loadable. Returns
    {"version", "path", "files", "bytes", "seconds", "problems"}: one line per bad file (empty: it verifies)."""
    started = time.perf_counter()
    if version is None:
        version = current_version(settings)
        if version is None:
            raise IndexStateError(f"no ticket index in {settings.indexes_dir} yet; {_RUN_INDEX}")
    path = _version_path(settings, version)
    try:
        manifest = _read_manifest(path)
    except IndexStateError as exc:
        return {"version": version, "path": str(path), "files": 0, "bytes": 0,
                "seconds": round(time.perf_counter() - started, 3), "problems": [f"{MANIFEST}: {exc}"]}
    missing, bad = file_problems(path, manifest, full=True, extras=True)
    problems = missing + bad
    if not isinstance(manifest.get("files"), dict):
        problems.append(f"{MANIFEST}: format {manifest.get('format_version')} records no checksums of the vectors "
                        f"and postings, so they cannot be verified; {_REBUILD}")
    if not missing and not bad:
        try:
            index = TicketIndex._load(path, manifest, every_row=True)
            index.bm25  # noqa: B018 - opening checks the postings' shapes
            index.model  # noqa: B018 - loading checks the model's fingerprint
            index.close()
        except IndexStateError as exc:
            problems.append(str(exc))
    files = manifest.get("files") or {}
    return {"version": version, "path": str(path), "files": len(files),
            "bytes": int(sum(e.get("bytes", 0) for e in files.values())),
            "seconds": round(time.perf_counter() - started, 3), "problems": problems}


def shard_bounds(n: int, shard: int, n_shards: int) -> tuple[int, int]:
    """Row range [start, stop) of shard `shard` when n rows are cut into `n_shards` near-equal slices."""
    if n_shards < 1 or not 0 <= shard < n_shards:
        raise ValueError(f"shard must be in [0, {n_shards}), got {shard}")
    return n * shard // n_shards, n * (shard + 1) // n_shards


def current_version(settings: Settings) -> str | None:
    """The version `CURRENT` points at, or None before the first build."""
    try:
        version = (settings.indexes_dir / CURRENT_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    return version or None


def list_versions(settings: Settings) -> list[str]:
    """Complete version directories, oldest first (names sort by build time)."""
    root = settings.indexes_dir
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
                  and (p / MANIFEST).exists())


def _version_path(settings: Settings, version: str) -> Path:
    """The directory of an existing version; IndexStateError listing the kept ones when it does not exist."""
    if not version or "/" in version or version.startswith("."):
        raise IndexStateError(f"{version!r} is not an index version name")
    path = settings.indexes_dir / version
    if not path.is_dir():
        kept = list_versions(settings)
        current = current_version(settings)
        listed = ", ".join(f"{v} (current)" if v == current else v for v in kept)
        raise IndexStateError(f"index version {version} does not exist (pruned?); "
                              + (f"the kept versions are: {listed}" if kept else _RUN_INDEX))
    return path


def open_version(settings: Settings, version: str) -> TicketIndex:
    """Open one named version (checked: see `TicketIndex.open`)."""
    path = _version_path(settings, version)
    try:
        index = TicketIndex.open(path)
    except IndexStateError as exc:
        _REFUSED[str(path)] = str(exc)
        raise
    _REFUSED.pop(str(path), None)
    index.pin = settings.index_pin
    return index


def open_current(settings: Settings, fallback: bool = True) -> TicketIndex:
    """Open the version that serves now; IndexStateError telling to run `ticketrec index` when there is none.

    When CURRENT's version fails its checks and `fallback`, the newest older version that passes them serves
    instead (logged as a warning; `serving_warning` tells the health pages); when none does, CURRENT's error."""
    version = current_version(settings)
    if version is None:
        raise IndexStateError(f"no ticket index in {settings.indexes_dir} yet; {_RUN_INDEX}")
    try:
        return open_version(settings, version)
    except IndexStateError as exc:
        if not fallback:
            raise
        for older in reversed([v for v in list_versions(settings) if v < version]):
            try:
                index = open_version(settings, older)
            except IndexStateError:
                continue
            log.warning("index %s (CURRENT) cannot be served (%s); serving the previous good version %s",
                        version, exc, older)
            return index
        raise


def serving_warning(settings: Settings, index: TicketIndex) -> str | None:
    """Why the served version is not the one it should be, in one line (None when all is well): its files changed
    on disk under this process, or CURRENT names a version this process refused (an older good one serves)."""
    changed = index.changed_files()
    if changed:
        return (f"index {index.version} changed on disk while it was served ({'; '.join(changed)}); queries fail "
                f"until the server restarts (it then serves the previous good version) or `ticketrec index --full` runs")
    latest = current_version(settings)
    if latest and latest != index.version:
        why = _REFUSED.get(str(settings.indexes_dir / latest))
        if why:
            return f"index {latest} (CURRENT) is not served, index {index.version} is: {why}"
    return None


def switch_current(settings: Settings, version: str) -> None:
    """Point CURRENT at `version` atomically (readers see the old or the new name, never a partial one), once it
    passes the checks of an open (sizes, changed files' checksums, shapes, sampled rows)."""
    if not (settings.indexes_dir / version / MANIFEST).exists():
        raise IndexStateError(f"index version {version} is not complete; refusing to switch to it")
    try:
        TicketIndex.open(settings.indexes_dir / version).close()
    except IndexStateError as exc:
        raise IndexStateError(f"refusing to switch to index {version}: {exc}") from exc
    atomic_write_text(settings.indexes_dir / CURRENT_FILE, version + "\n", prefix=TMP_PREFIX)
