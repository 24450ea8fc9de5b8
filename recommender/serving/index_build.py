"""Building an index version (`ticketrec index`): the store's tickets encoded with the model (in parallel worker
processes for large builds; unchanged tickets' rows copied from the previous version when it verifies), their BM25
postings, the model's files, a manifest of checksums; written aside under the build lock, checked for free disk space
first, verified, then switched to (`index.switch_current`), the oldest versions beyond TICKETREC_KEEP_INDEXES pruned.
The layout and the integrity checks are `index.py`'s."""
from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
from tqdm.auto import tqdm

from ..lexical.postings import ChunkTerms, PostingsBuilder, ticket_terms
from ..config import Settings
from ..errors import IndexBusyError, IndexStateError, TicketrecError
from ..files import atomic_directory, disk_full, preallocate, seal_tree
from .scoring import PackedVectors
from .index import (FORMAT_VERSION, IDS_FILE, MANIFEST, MODEL_DIR, TMP_PREFIX, UPDATED_FILE, VECTORS_FILE,
                    TicketIndex, checksums, current_version, file_problems, file_records, list_versions,
                    open_current, some_items, switch_current)

log = logging.getLogger(__name__)

#: The free-space check wants the estimated size of the new version times SPACE_FACTOR, plus SPACE_SLACK bytes.
SPACE_FACTOR = 1.1
SPACE_SLACK = 1 << 20
_LOCK_FILE = ".build.lock"
#: Tickets fetched from the store and encoded per step of the build.
BUILD_BATCH = 512


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
        if p.name.startswith(TMP_PREFIX) and p.name != _LOCK_FILE:
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


def _new_version_name(existing: Sequence[str] = ()) -> str:
    """A name that sorts after every existing version: UTC time to the microsecond, plus a random tag."""
    while True:
        now = time.time()
        name = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now % 1 * 1e6):06d}-{secrets.token_hex(3)}"
        if not existing or name[:21] > max(existing)[:21]:
            return name
        time.sleep(0.001)


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
        files = checksums(target) if target.is_dir() else {}
        if files == expected:
            return {"dir": MODEL_DIR, "version": model.version, "files": files, "bytes": _size(target)}
        shutil.rmtree(target, ignore_errors=True)
    model.save(target)
    return {"dir": MODEL_DIR, "version": model.version, "files": checksums(target), "bytes": _size(target)}


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
    missing, bad = file_problems(prev.path, prev.manifest, full=True)
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
            with atomic_directory(root / version, prefix=f"{TMP_PREFIX}{version}.") as tmp, _full_disk_detected(root):
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
                    "files": file_records(tmp),
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

    from ..model.encoder_base import forget_encode_threads

    global _WORKER_MODEL
    _WORKER_MODEL = model
    torch.set_num_threads(1)  # one process per core; and OpenMP thread pools do not survive a fork
    forget_encode_threads()  # so its encoder runs on that one thread too, whatever block the build ran in
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
                                          f"{some_items(ids[int(positions[b])] for b in bad)}; check the model (its weights, "
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
                                  f"{some_items(ids[int(dst[b])] for b in bad)}; rebuild with `ticketrec index --full`")
        matrix[dst] = block
    matrix.flush()
    if len(reused):
        new_row_of_prev = np.full(len(prev), -1, np.int64)
        new_row_of_prev[reuse_src[reused]] = reused
        postings.add_reused(prev.bm25, new_row_of_prev)
    return dict(vectors.dims), postings.write(tmp)
