"""An index's memory-mapped arrays in memory: loaded at open when they fit (madvise, then one read per page),
locked (mlock) up to TICKETREC_INDEX_PIN bytes, and how much of them is resident now (mincore)."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

#: madvise(2) advice that maps every page of a range now (Linux ≥ 5.14); Python 3.11's mmap lacks the name.
MADV_POPULATE_READ = 22


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
