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
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import secrets
import shutil
import threading
import time
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
from tqdm.auto import tqdm

from ..lexical.postings import Bm25Postings, ChunkTerms, PostingsBuilder, postings_files, ticket_terms
from ..config import Settings
from ..errors import IndexBusyError, IndexStateError, TicketrecError
from ..files import atomic_directory, atomic_write_text, disk_full, preallocate, seal_tree
from .scoring import PackedVectors

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
#: The free-space check wants the estimated size of the new version times SPACE_FACTOR, plus SPACE_SLACK bytes.
SPACE_FACTOR = 1.1
SPACE_SLACK = 1 << 20
#: madvise(2) advice that maps every page of a range now (Linux ≥ 5.14); Python 3.11's mmap lacks the name.
MADV_POPULATE_READ = 22
_TMP_PREFIX = ".tmp-"
_LOCK_FILE = ".build.lock"
#: Tickets fetched from the store and encoded per step of the build.
BUILD_BATCH = 512

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
        found = _checksums(self.model_dir)
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
        missing, bad = _file_problems(path, manifest, full=full)
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
                                  f"{_some(ticket_ids[int(r)] for r in bad)}; {_REBUILD}")
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


def _some(items, n: int = 5) -> str:
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


def _file_records(directory: Path) -> dict[str, dict]:
    """The manifest's `files`: size, sha256 and modification time of every file under `directory` but the manifest."""
    out = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        name = path.relative_to(directory).as_posix()
        if name != MANIFEST:
            st = path.stat()
            out[name] = {"bytes": st.st_size, "sha256": _sha256(path), "mtime_ns": st.st_mtime_ns}
    return out


def _file_problems(path: Path, manifest: dict, full: bool, extras: bool = False) -> tuple[list[str], list[str]]:
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
    missing, bad = _file_problems(path, manifest, full=True, extras=True)
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


def _populate(arr: np.ndarray) -> None:
    """Fault every page of a memory-mapped array in (one madvise call), then read every page once (`_touch`)."""
    mm = getattr(arr, "_mmap", None)
    if mm is not None:
        try:
            mm.madvise(MADV_POPULATE_READ)
        except (OSError, ValueError):
            pass
    _touch(arr)


def _touch(arr: np.ndarray) -> None:
    """Read one word of every page of an array (one read per 4 KiB page). Pages mapped long ago and left unread can
    be slow to reach even while the guest counts them resident (seen on this project's virtual machines at 1M
    tickets); a read makes them fast again. `benchmarks/serving.py --loading` measures it (docs/results/serving.md,
    "Loading at open")."""
    flat = np.asarray(arr).reshape(-1)
    if flat.size:
        words = flat.view(np.uint8)
        words = words[: words.size - words.size % 8].view(np.uint64)
        int(words[:: max(1, PAGE_SIZE // 8)].sum())


#: Memory left free when `load_into_memory` decides whether an index fits: at least this many bytes...
MIN_HEADROOM = 512 << 20
#: ...or this share of the machine's memory, whichever is larger.
HEADROOM_SHARE = 0.05
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MEMLOCK_HELP = ("raise this process's locked-memory limit (`ulimit -l unlimited`, systemd LimitMEMLOCK=infinity, "
                 "docker run --ulimit memlock=-1 or --cap-add IPC_LOCK) or lower TICKETREC_INDEX_PIN")


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _span(arr: np.ndarray) -> tuple[int, int]:
    """(page-aligned start address, length in bytes) of an array's data, for mincore(2) and mlock(2)."""
    start = np.asarray(arr).ctypes.data
    aligned = start - start % PAGE_SIZE
    return aligned, arr.nbytes + (start - aligned)


def memory_info() -> dict[str, int]:
    """{"total", "available"} bytes of this machine's memory (/proc/meminfo's MemTotal and MemAvailable, else sysconf)."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        return {"total": int(fields["MemTotal"].split()[0]) * 1024, "available": int(fields["MemAvailable"].split()[0]) * 1024}
    except (OSError, KeyError, ValueError):
        pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
        free = os.sysconf("SC_AVPHYS_PAGES") if hasattr(os, "sysconf") else 0
        return {"total": pages * PAGE_SIZE, "available": free * PAGE_SIZE}


def resident_bytes(arr: np.ndarray) -> int | None:
    """Bytes of a memory-mapped array whose pages are in memory now (mincore(2), page granularity; None where the
    system cannot say). For a file mapping it is the page cache: the same figure in every process."""
    import ctypes

    if arr.nbytes == 0:
        return 0
    address, length = _span(arr)
    vec = np.zeros(-(-length // PAGE_SIZE), np.uint8)
    try:
        failed = _libc().mincore(ctypes.c_void_p(address), ctypes.c_size_t(length), vec.ctypes.data_as(ctypes.c_void_p))
    except (OSError, AttributeError):
        return None
    if failed:
        return None
    return int(min(arr.nbytes, int(np.count_nonzero(vec & 1)) * PAGE_SIZE))


def _lock(arr: np.ndarray) -> OSError | None:
    """mlock(2) an array's pages (they are read in and stay in memory until unmapped); the error, or None."""
    import ctypes

    address, length = _span(arr)
    try:
        libc = _libc()
        if libc.mlock(ctypes.c_void_p(address), ctypes.c_size_t(length)) == 0:
            return None
        errno = ctypes.get_errno()
    except (OSError, AttributeError) as exc:
        return OSError(str(exc))
    return OSError(errno, os.strerror(errno))


def load_into_memory(arrays: dict[str, np.ndarray], pin: int = 0, label: str = "index") -> dict:
    """Load memory-mapped arrays into memory when they fit (`_populate`), then lock (mlock) whole arrays, in order,
    while their bytes fit in `pin`. They fit when the bytes not yet resident leave MIN_HEADROOM (or HEADROOM_SHARE of
    the machine's memory) of the available memory free; an index that does not fit is left to be read from disk by
    the queries (logged), rather than evicting everything else. A lock that fails (the locked-memory limit) is logged
    once with what to do, and nothing more is locked.

    Returns {"loaded": bool, "bytes", "resident_bytes" (after loading), "locked_bytes", "pin", "reason"}."""
    total = int(sum(arr.nbytes for arr in arrays.values()))
    before = [resident_bytes(arr) for arr in arrays.values()]
    missing = total - int(sum(b or 0 for b in before))
    memory = memory_info()
    headroom = max(MIN_HEADROOM, int(memory["total"] * HEADROOM_SHARE))
    loaded = missing <= memory["available"] - headroom
    reason = None
    if loaded:
        for arr in arrays.values():
            _populate(arr)
    else:
        reason = (f"{label}: {missing / 2**30:.1f} GiB of it are not in memory and {memory['available'] / 2**30:.1f} GiB "
                  f"are available; not loaded at open, so queries read its pages from disk (more memory, a float16 "
                  f"index or more shards make it fit)")
        log.warning("%s", reason)
    locked, budget = 0, int(pin) if loaded else 0
    for name, arr in arrays.items():
        if not 0 < arr.nbytes <= budget:
            continue
        error = _lock(arr)
        if error is not None:
            reason = f"{label}: could not lock {name} ({arr.nbytes:,} bytes) in memory ({error.strerror or error}); {_MEMLOCK_HELP}"
            log.warning("%s", reason)
            break
        locked += arr.nbytes
        budget -= arr.nbytes
    after = [resident_bytes(arr) for arr in arrays.values()]
    return {"loaded": loaded, "bytes": total, "resident_bytes": None if None in after else int(sum(after)),
            "locked_bytes": int(locked), "pin": int(pin), "reason": reason}


def shard_bounds(n: int, shard: int, n_shards: int) -> tuple[int, int]:
    """Row range [start, stop) of shard `shard` when n rows are cut into `n_shards` near-equal slices."""
    if n_shards < 1 or not 0 <= shard < n_shards:
        raise ValueError(f"shard must be in [0, {n_shards}), got {shard}")
    return n * shard // n_shards, n * (shard + 1) // n_shards


# -- where versions live -------------------------------------------------------------------------------------
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
    atomic_write_text(settings.indexes_dir / CURRENT_FILE, version + "\n", prefix=_TMP_PREFIX)


@contextmanager
def _build_lock(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / _LOCK_FILE, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IndexBusyError(f"another index build is running in {root}; wait for it to finish") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _remove_stale_temporaries(root: Path) -> None:
    """Remove what killed builds left behind (only called while holding the build lock)."""
    for p in root.iterdir():
        if p.name.startswith(_TMP_PREFIX) and p.name != _LOCK_FILE:
            log.info("removing %s left by an interrupted build", p)
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def prune(settings: Settings) -> list[str]:
    """Delete the oldest versions beyond `settings.keep_indexes` (never the current one); returns the deleted."""
    keep = max(1, settings.keep_indexes)
    current = current_version(settings)
    versions = list_versions(settings)
    doomed = [v for v in versions[: max(0, len(versions) - keep)] if v != current]
    for v in doomed:
        shutil.rmtree(settings.indexes_dir / v, ignore_errors=True)
    return doomed


# -- building --------------------------------------------------------------------------------------------------
def _new_version_name(existing: Sequence[str] = ()) -> str:
    """A name that sorts after every existing version: UTC time to the microsecond, plus a random tag."""
    while True:
        now = time.time()
        name = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now % 1 * 1e6):06d}-{secrets.token_hex(3)}"
        if not existing or name[:21] > max(existing)[:21]:
            return name
        time.sleep(0.001)


def _checksums(directory: Path) -> dict[str, str]:
    """sha256 of every file under `directory`, by its path relative to it."""
    out = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        out[path.relative_to(directory).as_posix()] = digest.hexdigest()
    return out


def _store_model(version_dir: Path, model, prev: TicketIndex | None) -> dict:
    """Put the model into `version_dir/model/`: hard links to the previous version's copy when it is the same model
    (its files verified), else `model.save`; returns the manifest's "model" entry (fingerprint, file checksums)."""
    target = version_dir / MODEL_DIR
    expected = (prev.manifest.get("model") or {}).get("files") if prev is not None else None
    if expected and prev.model_version == model.version and prev.model_dir.is_dir():
        try:
            for name in expected:
                dst = target / name
                dst.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(prev.model_dir / name, dst)
                except OSError:  # another file system, or no hard links here
                    shutil.copy2(prev.model_dir / name, dst)
        except OSError as exc:
            log.info("cannot reuse the model files of index %s (%s); saving the model again", prev.version, exc)
        files = _checksums(target) if target.is_dir() else {}
        if files == expected:
            return {"dir": MODEL_DIR, "version": model.version, "files": files, "bytes": _size(target)}
        shutil.rmtree(target, ignore_errors=True)
    model.save(target)
    return {"dir": MODEL_DIR, "version": model.version, "files": _checksums(target), "bytes": _size(target)}


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _reusable(prev: TicketIndex | None, model, dtype: str) -> bool:
    """Can `prev`'s rows be copied: the same model, dtype and stored vectors (an index built before vectors of
    weight 0 were left out holds more keys; it is rebuilt in full once)."""
    return (prev is not None and prev.model_version == model.version and prev.manifest.get("dtype") == dtype
            and set(prev.manifest.get("keys", {})) == model.served_keys("ticket"))


def _reuse_problems(prev: TicketIndex) -> list[str]:
    """Why the rows and postings of `prev` must not be copied into a new version (empty: every checksum verifies)."""
    if not isinstance(prev.manifest.get("files"), dict):
        return [f"format {prev.manifest.get('format_version')} records no checksums of its vectors and postings"]
    missing, bad = _file_problems(prev.path, prev.manifest, full=True)
    return missing + bad + prev.changed_files()


def _estimate_bytes(store, model, ids: list[str], prev: TicketIndex | None, dtype: np.dtype) -> int:
    """About how many bytes the new version takes on disk: the vectors (the previous version's width for the same
    model, else one encoded ticket's), the other files at the previous version's bytes per ticket (else the postings
    of a sample of tickets), and the model's files unless they are hard links to the previous version's."""
    n = len(ids)
    model_dir = getattr(model, "path", None)
    model_bytes = _size(Path(model_dir)) if model_dir and Path(model_dir).is_dir() else 0
    same_model = prev is not None and len(prev) > 0 and prev.model_version == model.version
    if same_model:
        width = prev._vectors.matrix.shape[1]
        model_bytes = 0
    else:
        width = sum(arr.shape[1] for arr in model.encode_tickets(store.get_tickets(ids[:1])).values())
    if prev is not None and len(prev):
        sizes = {p.relative_to(prev.path).as_posix(): p.stat().st_size for p in prev.path.rglob("*") if p.is_file()}
        prev_model = sum(b for name, b in sizes.items() if name.startswith(MODEL_DIR + "/"))
        per_row = (sum(sizes.values()) - prev_model - sizes.get(VECTORS_FILE, 0)) / len(prev)
        if not same_model and not model_bytes:
            model_bytes = prev_model
    else:
        sample = store.get_tickets(ids[:: max(1, n // 256)][:256])
        terms = ticket_terms(sample)  # postings: 12 bytes each (row, impact, tf); terms; lengths, timestamps, ids
        per_row = (len(terms.docs) * 12 + sum(len(t) + 4 for t in terms.terms)) / max(1, len(sample)) + 12 + \
            sum(len(i) + 4 for i in ids[:256]) / min(n, 256)
    return int(n * (width * dtype.itemsize + per_row) + model_bytes)


class _DiskFull(Exception):
    """A build step failed on a full disk (the step's own error is the cause)."""


@contextmanager
def _full_disk_detected(root: Path) -> Iterator[None]:
    """Re-raise an error of a build step as _DiskFull when the disk is full: torch, zipfile and others hide the
    ENOSPC behind errors of their own, so the free space is read at once, before the temporary files go."""
    try:
        yield
    except Exception as exc:
        if disk_full(exc) or (not isinstance(exc, TicketrecError) and shutil.disk_usage(root).free < SPACE_SLACK):
            raise _DiskFull(f"{type(exc).__name__}: {exc}") from exc
        raise


def _check_free_space(root: Path, needed: int) -> None:
    """IndexStateError naming the free and the needed bytes when the disk of `root` cannot hold `needed` bytes."""
    free = shutil.disk_usage(root).free
    if free < needed:
        raise IndexStateError(
            f"not enough free disk space for a new index version in {root}: {free:,} bytes free, about {needed:,} "
            "needed; free some space (older versions are pruned only after a build: lower TICKETREC_KEEP_INDEXES "
            "or delete old version folders) and run `ticketrec index` again")


def stored_tickets(store) -> tuple[list[str], np.ndarray]:
    """The store's ticket ids in their stored order and each one's last update time (what a build encodes)."""
    versions = store.ticket_versions()
    ids = [tid for tid in store.ticket_ids() if tid in versions]
    return ids, np.array([versions[tid] for tid in ids], np.float64)


def unchanged_rows(index: TicketIndex, ids: Sequence[str], updated: Sequence[float] | np.ndarray) -> np.ndarray:
    """For each ticket of `ids` (last updated at `updated`, the store's times), its row in `index` when the index
    holds it as it is now, else -1 (a ticket new since the build, or changed)."""
    rows = np.full(len(ids), -1, np.int64)
    lookup = index.row_of
    for i, tid in enumerate(ids):
        row = lookup.get(tid)
        if row is not None and index.updated_at[row] == updated[i]:
            rows[i] = row
    return rows


def build_index(store, model, settings: Settings, incremental: bool = True, float16: bool | None = None,
                progress: bool = True, prefilter=None, workers: int | None = None) -> str:
    """Encode the store's tickets into a new immutable index version, verify it, switch CURRENT to it; its name.

    Incremental: rows of tickets unchanged since the current version (same model, same dtype) are copied, only
    new or changed tickets are encoded; when nothing changed the current version is returned as is. The current
    version's files are verified against every checksum first: one that fails is not reused (a full build, logged).
    `prefilter`: a BM25 backend whose `index(tickets)` must be fed (Elasticsearch); FTS5 is kept in sync by the
    store itself, and every version writes its own BM25 postings, so those need nothing.
    `float16`: store the vectors as float16 (True) or float32 (False); None: TICKETREC_INDEX_DTYPE
    (`settings.vector_dtype`: auto = float16 from 100,000 tickets up). A version of another dtype is never reused.
    `workers` > 1 encodes in that many forked processes (the model is shared by fork, not reloaded); the batches
    are the same as the serial build's, so the matrices are byte-identical. None: `settings.encoding_processes`.
    Before writing, the free disk space is checked against the estimated size; a disk that fills up anyway is an
    IndexStateError saying so, and every failure removes the build's temporary files.
    """
    if workers is None:
        workers = settings.encoding_processes
    if workers < 1:
        raise IndexStateError(f"workers must be at least 1, not {workers}")
    root = settings.indexes_dir
    with _build_lock(root):
        _remove_stale_temporaries(root)
        prev = None
        full_because = None
        if current_version(settings) is not None:
            try:
                prev = open_current(settings, fallback=False)
            except IndexStateError as exc:
                full_because = f"the current index cannot be reused ({exc})"
                log.warning("%s; building from scratch", full_because)
        ids, updated = stored_tickets(store)
        if not ids:
            raise IndexStateError("the knowledge base is empty; import tickets first (`ticketrec import FILE`)")
        dtype = settings.vector_dtype(len(ids)) if float16 is None else ("float16" if float16 else "float32")

        reuse_src = np.full(len(ids), -1, np.int64)
        if incremental and _reusable(prev, model, dtype):
            problems = _reuse_problems(prev)
            if problems:
                full_because = f"index {prev.version} fails verification ({'; '.join(problems[:3])})"
                log.warning("%s; not reusing its rows: encoding every ticket again (a full build)", full_because)
                prev = None
        if incremental and _reusable(prev, model, dtype):
            reuse_src = unchanged_rows(prev, ids, updated)
            if (reuse_src >= 0).all() and len(prev) == len(ids) and (reuse_src == np.arange(len(ids))).all():
                log.info("index %s is up to date (%d tickets); nothing to build", prev.version, len(ids))
                return prev.version
        to_encode = np.flatnonzero(reuse_src < 0)
        workers = min(workers, -(-len(to_encode) // BUILD_BATCH) or 1)  # a small build is not worth a fork
        needed = int(_estimate_bytes(store, model, ids, prev, np.dtype(dtype)) * SPACE_FACTOR) + SPACE_SLACK
        _check_free_space(root, needed)

        version = _new_version_name(list_versions(settings))
        started = time.time()
        try:
            with atomic_directory(root / version, prefix=f"{_TMP_PREFIX}{version}.") as tmp, _full_disk_detected(root):
                keys, bm25_stats = _write_matrices(tmp, store, model, ids, reuse_src, to_encode, prev,
                                                   np.dtype(dtype), progress, prefilter, workers)
                model_entry = _store_model(tmp, model, prev)
                np.save(tmp / UPDATED_FILE, updated)
                (tmp / IDS_FILE).write_text(json.dumps(ids))
                seal_tree(tmp)  # read-only from now on: no reader's file can be rewritten by mistake
                manifest = {
                    "format_version": FORMAT_VERSION,
                    "version": version,
                    "model_version": model.version,
                    "model_path": str(getattr(model, "path", "") or ""),
                    "model": model_entry,
                    "metric_spec": model.metric_spec(),
                    "created_at": time.time(),
                    "n_tickets": len(ids),
                    "encoded": int(len(to_encode)),
                    "reused": int(len(ids) - len(to_encode)),
                    "previous": prev.version if prev is not None else None,
                    "full_build_reason": full_because if incremental else None,
                    "dtype": dtype,
                    "keys": keys,
                    "prefilter": settings.prefilter,
                    "bm25": bm25_stats,
                    "files": _file_records(tmp),
                    "build_seconds": round(time.time() - started, 3),
                }
                (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
                seal_tree(tmp)
                built = TicketIndex.open(tmp)  # verify: sizes, shapes, sampled rows (every row was checked above)
                built.bm25  # noqa: B018 - opening verifies the postings
                built.model  # noqa: B018 - so does loading the model copy (checksums, fingerprint)
                built.close()
                if built.model_version != model.version or len(built) != len(ids):
                    raise IndexStateError(f"the build in {tmp} did not verify; the current index is unchanged")
            try:
                switch_current(settings, version)
            except BaseException:
                shutil.rmtree(root / version, ignore_errors=True)
                raise
            if prefilter is not None and prev is not None:  # tickets removed from the store since `prev`
                kept = set(ids)
                try:
                    prefilter.remove([tid for tid in prev.ticket_ids if tid not in kept])
                except TicketrecError as exc:  # harmless meanwhile: a candidate the index lacks is skipped
                    log.warning("the pre-filter still holds tickets removed from the store (%s); `ticketrec "
                                "prefilter-index` rebuilds it", exc)
        except (_DiskFull, OSError) as exc:
            if not isinstance(exc, _DiskFull) and not disk_full(exc):
                raise
            serving = current_version(settings)
            raise IndexStateError(
                f"the disk holding {root} filled up during the index build ({shutil.disk_usage(root).free:,} bytes "
                f"free now that its partial files are removed, about {needed:,} needed); "
                + (f"index {serving} still serves" if serving else "no index serves yet")
                + "; free some space and run `ticketrec index` again") from exc
        removed = prune(settings)
        log.info("index %s: %d tickets (%d encoded, %d reused); pruned %s", version, len(ids), len(to_encode),
                 len(ids) - len(to_encode), removed or "nothing")
        return version


_WORKER_MODEL = None  # the model a forked encoding worker inherited from the building process


def _set_worker_model(model, parent: int) -> None:
    import torch

    global _WORKER_MODEL
    _WORKER_MODEL = model
    torch.set_num_threads(1)  # one process per core; and OpenMP thread pools do not survive a fork
    _die_with_parent(parent)


def _die_with_parent(parent: int) -> None:
    """Have Linux kill this encoding worker when the build process dies (even by SIGKILL), so a killed build
    leaves no orphans behind; elsewhere the pool's own shutdown has to do."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the call above took effect
        os._exit(1)


def _encode(model, tickets: list) -> tuple[dict[str, np.ndarray], ChunkTerms]:
    """A chunk's vectors and its BM25 term counts (both are per-ticket work, so both go to the workers)."""
    return model.encode_tickets(tickets), ticket_terms(tickets)


def _encode_in_worker(tickets: list) -> tuple[dict[str, np.ndarray], ChunkTerms]:
    return _encode(_WORKER_MODEL, tickets)


def _encode_chunks(model, chunks: Iterator[tuple[np.ndarray, list]], workers: int
                   ) -> Iterator[tuple[np.ndarray, list, tuple]]:
    """(positions, tickets, (encoded, terms)) per chunk, in order; `workers` > 1 encodes in forked processes.

    Each chunk is encoded whole by one process with the same batches as the serial path, so results are identical.
    """
    import multiprocessing

    if workers > 1 and multiprocessing.current_process().daemon:
        log.info("encoding in this process: a daemonic process (a Celery prefork child) cannot start workers")
        workers = 1
    if workers <= 1:
        for positions, tickets in chunks:
            yield positions, tickets, _encode(model, tickets)
        return
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    getattr(model, "_ensure_inference", lambda: None)()  # before the fork, so every worker inherits a ready model
    ctx = multiprocessing.get_context("fork")
    pending: deque = deque()
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_set_worker_model,
                             initargs=(model, os.getpid())) as pool:
        try:
            for positions, tickets in chunks:
                pending.append((positions, tickets, pool.submit(_encode_in_worker, tickets)))
                if len(pending) >= 2 * workers:
                    positions, tickets, future = pending.popleft()
                    yield positions, tickets, future.result()
            while pending:
                positions, tickets, future = pending.popleft()
                yield positions, tickets, future.result()
        finally:
            for _, _, future in pending:
                future.cancel()


def _write_matrices(tmp: Path, store, model, ids: list[str], reuse_src: np.ndarray, to_encode: np.ndarray,
                    prev: TicketIndex | None, dtype: np.dtype, progress: bool, prefilter,
                    workers: int = 1) -> tuple[dict[str, int], dict]:
    """Fill `vectors.npy` (one record per ticket) and the BM25 postings: encoded rows for `to_encode`, copied
    rows for the rest. Returns the widths of the EncodedBatch keys and the BM25 statistics."""
    n = len(ids)
    postings = PostingsBuilder(n, workdir=tmp)  # spilled postings: unlinked temporary files beside the version

    def allocate(shapes: dict[str, int]) -> PackedVectors:
        matrix = np.lib.format.open_memmap(tmp / VECTORS_FILE, mode="w+", dtype=dtype, shape=(n, sum(shapes.values())))
        preallocate(tmp / VECTORS_FILE)  # a full disk is an OSError now, not a SIGBUS while writing the map
        return PackedVectors(matrix, shapes)

    vectors = allocate(prev.vectors.dims) if prev is not None and len(to_encode) < n else None

    def chunks() -> Iterator[tuple[np.ndarray, list]]:
        for start in range(0, len(to_encode), BUILD_BATCH):
            positions = to_encode[start : start + BUILD_BATCH]
            batch_ids = [ids[p] for p in positions]
            tickets = store.get_tickets(batch_ids)
            if len(tickets) != len(batch_ids):
                found = {t.id for t in tickets}
                missing = [tid for tid in batch_ids if tid not in found]
                raise IndexStateError(f"tickets {missing[:5]} vanished from the store during the build; run it again")
            yield positions, tickets

    bar = tqdm(total=len(to_encode), desc="encoding tickets", unit="ticket", disable=not progress)
    try:
        for positions, tickets, (encoded, terms) in _encode_chunks(model, chunks(), workers):
            if vectors is None:
                vectors = allocate({key: arr.shape[1] for key, arr in encoded.items()})
            if set(encoded) != set(vectors):
                raise IndexStateError(f"the model encodes {sorted(encoded)}, the index holds {sorted(vectors)}; "
                                      f"rebuild without reuse (`ticketrec index --full`)")
            for key, arr in encoded.items():
                arr = np.asarray(arr)
                if arr.shape != (len(positions), vectors.dims[key]):
                    raise IndexStateError(f"the model returned {key} of shape {arr.shape} for {len(positions)} tickets")
                bad = np.flatnonzero(~np.isfinite(arr).all(axis=1))
                if len(bad):
                    raise IndexStateError(f"the model encoded non-finite {key} vectors (NaN or infinity) for tickets "
                                          f"{_some(ids[int(positions[b])] for b in bad)}; check the model (its weights, "
                                          "or those tickets' text), then rebuild; the current index is unchanged")
                vectors[key][positions] = arr
            postings.add(positions, terms)
            if prefilter is not None:
                prefilter.index(tickets, progress=False)
            bar.update(len(positions))
    finally:
        bar.close()

    reused = np.flatnonzero(reuse_src >= 0)
    if vectors is None:
        raise IndexStateError("nothing was encoded or reused; the build is empty")
    matrix = vectors.matrix
    step = 65536
    source = prev.vectors.matrix if len(reused) else None
    for start in range(0, len(reused), step):  # reuse happens only for the same model: the same layout
        dst = reused[start : start + step]
        block = source[reuse_src[dst]]
        bad = np.flatnonzero(~np.isfinite(block).all(axis=1))
        if len(bad):
            raise IndexStateError(f"index {prev.version} holds non-finite vectors (NaN or infinity) for tickets "
                                  f"{_some(ids[int(dst[b])] for b in bad)}; rebuild with `ticketrec index --full`")
        matrix[dst] = block
    matrix.flush()
    if len(reused):
        new_row_of_prev = np.full(len(prev), -1, np.int64)
        new_row_of_prev[reuse_src[reused]] = reused
        postings.add_reused(prev.bm25, new_row_of_prev)
    return dict(vectors.dims), postings.write(tmp)
