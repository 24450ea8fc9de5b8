"""Immutable index versions of precomputed ticket vectors under TICKETREC_HOME/indexes/, switched atomically.

A version directory holds `ticket_ids.json`, `updated_at.npy` (each ticket's store timestamp, for incremental
builds), `vectors.npy` (one memory-mappable row per ticket holding all its EncodedBatch vectors, `SUB.h`,
`DESC.E`, ..., side by side in the manifest's `keys` order), the BM25 postings of the same tickets (`bm25_*`,
see `bm25_postings`), `model/` (the model directory the tickets were encoded with: a version is a deployable
unit, and every reader serves the model of the version it opened, `TicketIndex.model`) and `manifest.json`
(model fingerprint and the checksums of its files, counts, dtype, metric spec, BM25 statistics). A build writes
into a hidden temporary directory, verifies it, renames it into place and only then points `CURRENT` at it
(temp file + os.replace), so a failed, interrupted or killed build leaves the previous version serving.
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
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
from tqdm.auto import tqdm

from ..lexical.postings import Bm25Postings, ChunkTerms, PostingsBuilder, ticket_terms
from ..config import Settings
from ..errors import IndexStateError
from ..files import atomic_directory, atomic_write_text
from .scoring import PackedVectors

log = logging.getLogger(__name__)

FORMAT_VERSION = 3  # 2: one packed vectors.npy, BM25 postings; 3: the model in model/
CURRENT_FILE = "CURRENT"
MANIFEST = "manifest.json"
IDS_FILE = "ticket_ids.json"
UPDATED_FILE = "updated_at.npy"
VECTORS_FILE = "vectors.npy"
MODEL_DIR = "model"
#: madvise(2) advice that maps every page of a range now (Linux ≥ 5.14); Python 3.11's mmap lacks the name.
MADV_POPULATE_READ = 22
_TMP_PREFIX = ".tmp-"
_LOCK_FILE = ".build.lock"
#: Tickets fetched from the store and encoded per step of the build.
BUILD_BATCH = 512

_RUN_INDEX = "run `ticketrec index` to build one"
_REBUILD = "rebuild the index with `ticketrec index --full` (add --model DIR when TICKETREC_MODEL is not the model)"


class TicketIndex:
    """One opened index version: ticket ids, their memory-mapped vectors and BM25 postings."""

    def __init__(self, path: Path, manifest: dict, ticket_ids: list[str], vectors: PackedVectors,
                 updated_at: np.ndarray):
        self.path = Path(path)
        self.manifest = manifest
        self.ticket_ids = ticket_ids
        self.vectors = vectors
        self.updated_at = updated_at
        self._rows: dict[str, int] | None = None
        self._bm25: Bm25Postings | None = None
        self._model = None
        self._model_lock = threading.Lock()  # the model is loaded once, by the first thread that needs it

    @property
    def version(self) -> str:
        return self.manifest["version"]

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
            return IndexStateError(f"the model of index {self.version} is missing or corrupt ({why}); {_REBUILD}")

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

    def warm(self) -> None:
        """Map every page of the vectors and postings into this process now, so queries do not pay page faults
        (a serving process calls it once per version; the files stay shared in the page cache)."""
        for arr in (self.vectors.matrix, self.bm25.rows, self.bm25.tf, self.bm25.length):
            _populate(arr)

    @property
    def bm25(self) -> Bm25Postings:
        """The version's BM25 postings (opened on first use): the embedded pre-filter over these rows."""
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
    def open(cls, path: str | Path) -> "TicketIndex":
        """Open a version directory, memory-mapping its matrices (mmap_mode='r'); IndexStateError if unusable."""
        path = Path(path)
        try:
            manifest = json.loads((path / MANIFEST).read_text())
            if manifest.get("format_version") != FORMAT_VERSION:
                raise IndexStateError(
                    f"index {path} has format version {manifest.get('format_version')}, this ticketrec reads "
                    f"{FORMAT_VERSION}; {_RUN_INDEX}"
                )
            ticket_ids = json.loads((path / IDS_FILE).read_text())
            updated_at = np.load(path / UPDATED_FILE, mmap_mode="r")
            matrix = np.load(path / VECTORS_FILE, mmap_mode="r")
            dims = {key: int(d) for key, d in manifest["keys"].items()}
        except IndexStateError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as exc:
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
            raise IndexStateError(f"index {path} is inconsistent (manifest says {n} tickets; " + ", ".join(problems)
                                  + f"); {_RUN_INDEX}")
        return cls(path, manifest, ticket_ids, PackedVectors(matrix, dims), updated_at)


def _populate(arr: np.ndarray) -> None:
    """Fault every page of a memory-mapped array in: one madvise call, or one read per page where it fails."""
    mm = getattr(arr, "_mmap", None)
    if mm is not None:
        try:
            mm.madvise(MADV_POPULATE_READ)
            return
        except (OSError, ValueError):
            pass
    flat = np.asarray(arr).reshape(-1)
    if flat.size:
        float(flat[:: max(1, 4096 // flat.itemsize)].sum())


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


def open_version(settings: Settings, version: str) -> TicketIndex:
    """Open one named version."""
    if not version or "/" in version or version.startswith("."):
        raise IndexStateError(f"{version!r} is not an index version name")
    path = settings.indexes_dir / version
    if not path.is_dir():
        kept = list_versions(settings)
        current = current_version(settings)
        listed = ", ".join(f"{v} (current)" if v == current else v for v in kept)
        raise IndexStateError(f"index version {version} does not exist (pruned?); "
                              + (f"the kept versions are: {listed}" if kept else _RUN_INDEX))
    return TicketIndex.open(path)


def open_current(settings: Settings) -> TicketIndex:
    """Open the version that serves now; IndexStateError telling to run `ticketrec index` when there is none."""
    version = current_version(settings)
    if version is None:
        raise IndexStateError(f"no ticket index in {settings.indexes_dir} yet; {_RUN_INDEX}")
    return open_version(settings, version)


def switch_current(settings: Settings, version: str) -> None:
    """Point CURRENT at `version` atomically (readers see the old or the new name, never a partial one)."""
    if not (settings.indexes_dir / version / MANIFEST).exists():
        raise IndexStateError(f"index version {version} is not complete; refusing to switch to it")
    atomic_write_text(settings.indexes_dir / CURRENT_FILE, version + "\n", prefix=_TMP_PREFIX)


@contextmanager
def _build_lock(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / _LOCK_FILE, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IndexStateError(f"another index build is running in {root}; wait for it to finish") from None
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
    return prev is not None and prev.model_version == model.version and prev.manifest.get("dtype") == dtype


def build_index(store, model, settings: Settings, incremental: bool = True, float16: bool = False,
                progress: bool = True, prefilter=None, workers: int | None = None) -> str:
    """Encode the store's tickets into a new immutable index version, verify it, switch CURRENT to it; its name.

    Incremental: rows of tickets unchanged since the current version (same model, same dtype) are copied, only
    new or changed tickets are encoded; when nothing changed the current version is returned as is.
    `prefilter`: a BM25 backend whose `index(tickets)` must be fed (Elasticsearch); FTS5 is kept in sync by the
    store itself, and every version writes its own BM25 postings, so those need nothing.
    `workers` > 1 encodes in that many forked processes (the model is shared by fork, not reloaded); the batches
    are the same as the serial build's, so the matrices are byte-identical. None: `settings.encoding_processes`.
    """
    if workers is None:
        workers = settings.encoding_processes
    if workers < 1:
        raise IndexStateError(f"workers must be at least 1, not {workers}")
    root = settings.indexes_dir
    dtype = "float16" if float16 else "float32"
    with _build_lock(root):
        _remove_stale_temporaries(root)
        prev = None
        if current_version(settings) is not None:
            try:
                prev = open_current(settings)
            except IndexStateError as exc:
                log.warning("the current index cannot be reused (%s); building from scratch", exc)
        versions = store.ticket_versions()
        ids = [tid for tid in store.ticket_ids() if tid in versions]
        if not ids:
            raise IndexStateError("the knowledge base is empty; import tickets first (`ticketrec import FILE`)")
        updated = np.array([versions[tid] for tid in ids], np.float64)

        reuse_src = np.full(len(ids), -1, np.int64)
        if incremental and _reusable(prev, model, dtype):
            lookup = prev.row_of
            for i, tid in enumerate(ids):
                row = lookup.get(tid)
                if row is not None and prev.updated_at[row] == updated[i]:
                    reuse_src[i] = row
            if (reuse_src >= 0).all() and len(prev) == len(ids) and (reuse_src == np.arange(len(ids))).all():
                log.info("index %s is up to date (%d tickets); nothing to build", prev.version, len(ids))
                return prev.version
        to_encode = np.flatnonzero(reuse_src < 0)
        workers = min(workers, -(-len(to_encode) // BUILD_BATCH) or 1)  # a small build is not worth a fork

        version = _new_version_name(list_versions(settings))
        started = time.time()
        with atomic_directory(root / version, prefix=f"{_TMP_PREFIX}{version}.") as tmp:
            keys, bm25_stats = _write_matrices(tmp, store, model, ids, reuse_src, to_encode, prev, np.dtype(dtype),
                                               progress, prefilter, workers)
            model_entry = _store_model(tmp, model, prev)
            np.save(tmp / UPDATED_FILE, updated)
            (tmp / IDS_FILE).write_text(json.dumps(ids))
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
                "dtype": dtype,
                "keys": keys,
                "prefilter": settings.prefilter,
                "bm25": bm25_stats,
                "build_seconds": round(time.time() - started, 3),
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
            built = TicketIndex.open(tmp)  # verify: shapes, counts, loadable files
            built.bm25  # noqa: B018 - opening verifies the postings
            built.model  # noqa: B018 - so does loading the model copy (checksums, fingerprint)
            if built.model_version != model.version or len(built) != len(ids):
                raise IndexStateError(f"the build in {tmp} did not verify; the current index is unchanged")
        switch_current(settings, version)
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
    postings = PostingsBuilder(n)

    def allocate(shapes: dict[str, int]) -> PackedVectors:
        matrix = np.lib.format.open_memmap(tmp / VECTORS_FILE, mode="w+", dtype=dtype, shape=(n, sum(shapes.values())))
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
                if not np.isfinite(arr).all():
                    raise IndexStateError(f"the model produced non-finite {key} vectors; check the model, then rebuild")
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
    for start in range(0, len(reused), step):  # reuse happens only for the same model: the same layout
        dst = reused[start : start + step]
        matrix[dst] = prev.vectors.matrix[reuse_src[dst]]
    matrix.flush()
    if len(reused):
        new_row_of_prev = np.full(len(prev), -1, np.int64)
        new_row_of_prev[reuse_src[reused]] = reused
        postings.add_reused(prev.bm25, new_row_of_prev)
    return dict(vectors.dims), postings.write(tmp)
