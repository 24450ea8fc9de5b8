"""Atomic writes: a reader sees a file's (or a directory's) old content or its new content, never a partial one.

Every write goes to a temporary sibling (same file system, so the final rename is atomic), is fsync'ed, and is
renamed over the target; the parent directory is fsync'ed so the rename survives a crash. On any failure,
interrupt included, the temporary is removed and the target is left as it was. Leftover temporaries of a killed
process start with "." and contain ".tmp-" (or the caller's `prefix`), so a cleanup can recognise them.

Immutable outputs (index versions) are sealed read-only (`seal_tree`); a file written through a memory map has its
blocks reserved first (`preallocate`), so a full disk is an OSError, not a SIGBUS; `disk_full` recognises that
error wherever it was wrapped.
"""
from __future__ import annotations

import errno
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

from .errors import InputError

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_file", "atomic_directory", "check_replaceable",
           "create_private_once", "seal_tree", "preallocate", "disk_full", "READ_ONLY"]

#: The mode of a sealed file: readable by all, writable by none (root aside).
READ_ONLY = 0o444


def _umask() -> int:
    """The process umask, read without changing it where Linux tells it (os.umask sets it, racing other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # a platform or file system that cannot open directories: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _prefix(path: Path, prefix: str | None) -> str:
    return prefix if prefix is not None else f".{path.name}.tmp-"


@contextmanager
def atomic_file(path: str | Path, mode: str = "w", encoding: str | None = "utf-8",
                prefix: str | None = None) -> Iterator[IO]:
    """Open a temporary sibling of `path` for writing (`mode` "w" or "wb"); on a clean exit it is flushed, fsync'ed
    and renamed over `path` (an ordinary file: mode 0666 less the umask). On an exception it is removed."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file writes a whole file: mode 'w' or 'wb', not {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_prefix(path, prefix))
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; the result is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes, prefix: str | None = None) -> Path:
    """Write `data` to `path` atomically; returns the path."""
    with atomic_file(path, "wb", prefix=prefix) as fh:
        fh.write(data)
    return Path(path)


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8", prefix: str | None = None) -> Path:
    """Write `text` to `path` atomically; returns the path."""
    with atomic_file(path, "w", encoding=encoding, prefix=prefix) as fh:
        fh.write(text)
    return Path(path)


def create_private_once(path: str | Path, text: str, encoding: str = "utf-8") -> bool:
    """Create `path` holding `text` with mode 0600 unless it exists; never replace it. The file appears whole
    (written aside, then hard-linked into place): of processes racing to create it, the first link wins and all
    read that one. Returns True when this call created it."""
    path = Path(path)
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_prefix(path, None))  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding=encoding) as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # atomic, and unlike a rename it never replaces a file another process made
        except FileExistsError:
            return False
        _fsync_dir(path.parent)
        return True
    finally:
        os.unlink(tmp)


def _fsync_tree(root: Path) -> None:
    for directory, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(directory))


def check_replaceable(path: str | Path, marker: str) -> None:
    """Refuse (InputError) to put a directory whose files include `marker` (a model's config.json) over `path` when
    `path` holds something else: a file, or a non-empty directory without `marker`. Replacing it would delete it."""
    path = Path(path)
    if not os.path.lexists(path):
        return
    if not path.is_dir():
        raise InputError(f"{path} is a file, not a directory to write into: name a new directory (nothing was written)")
    if (path / marker).is_file() or not any(path.iterdir()):
        return
    raise InputError(f"{path} holds other files and no {marker}, so it is not one of ours: writing there would delete "
                     "them; name a new directory (nothing was written)")


@contextmanager
def atomic_directory(path: str | Path, prefix: str | None = None, marker: str | None = None) -> Iterator[Path]:
    """Yield an empty temporary sibling directory of `path` to fill; on a clean exit its files are fsync'ed and it
    is renamed to `path`, replacing an existing `path` (moved aside, then deleted). On an exception it is deleted
    and `path` is left as it was. With `marker`, a `path` that holds something else than a directory with that file
    (`check_replaceable`) is refused before anything is written."""
    path = Path(path)
    if marker is not None:
        check_replaceable(path, marker)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_prefix(path, prefix), dir=path.parent))
    aside: Path | None = None
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; the result is an ordinary directory
        yield tmp
        _fsync_tree(tmp)
        if path.exists():
            aside = Path(tempfile.mkdtemp(prefix=_prefix(path, prefix) + "old-", dir=path.parent))
            os.replace(path, aside / path.name)
        os.replace(tmp, path)
    except BaseException:
        if aside is not None and not path.exists():  # the old one goes back where it was
            os.replace(aside / path.name, path)
        shutil.rmtree(tmp, ignore_errors=True)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
        raise
    _fsync_dir(path.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def seal_tree(root: str | Path, mode: int = READ_ONLY) -> None:
    """Make every file under `root` read-only (`mode`), so that no process can truncate or overwrite it by mistake
    (directories stay writable: the tree can still be deleted as a whole)."""
    for directory, _, files in os.walk(root):
        for name in files:
            os.chmod(os.path.join(directory, name), mode)


def preallocate(path: str | Path) -> None:
    """Reserve the disk blocks of the whole (possibly sparse) file now. Writing through a memory map into a sparse
    file on a full disk kills the process with SIGBUS; after this a full disk is an OSError (ENOSPC) here."""
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size:
            os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)


def disk_full(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from, says the disk (or the user's quota) is full."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(exc):  # torch and zipfile wrap the OSError in their own errors
            return True
        exc = exc.__cause__ or exc.__context__
    return False
