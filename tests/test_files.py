"""recommender.files: the one atomic-write helper (files and directories), and that every writer uses it."""
import os
import re
from pathlib import Path

import pytest

import recommender.files as files
from recommender.errors import InputError
from recommender.files import atomic_directory, atomic_file, atomic_write_bytes, atomic_write_text

ROOT = Path(__file__).resolve().parents[1]


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "a.txt"
    atomic_write_text(target, "one ✓\n")
    atomic_write_text(target, "two\n")
    assert target.read_text(encoding="utf-8") == "two\n"
    atomic_write_bytes(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.txt", "b.bin", "sub"]
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask()  # an ordinary file, not mkstemp's private one
    assert files._umask() == _umask()


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "a.jsonl"
    target.write_text("old\n")
    with pytest.raises(RuntimeError):
        with atomic_file(target) as fh:
            fh.write("half of the new")
            raise RuntimeError("killed half way")
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["a.jsonl"]
    with pytest.raises(ValueError, match="mode"):
        with atomic_file(target, "a"):
            pass


def test_atomic_directory_replaces_a_directory_whole(tmp_path):
    target = tmp_path / "model"
    with atomic_directory(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".model.tmp-") and not target.exists()
        (tmp / "a").write_text("1")
        (tmp / "b").write_text("1")
    with atomic_directory(target) as tmp:
        (tmp / "a").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["a"] and (target / "a").read_text() == "2"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert target.stat().st_mode & 0o777 == 0o777 & ~_umask()


def test_a_directory_that_is_not_ours_is_refused_before_anything_is_written(tmp_path):
    """With a marker, only a new path, an empty directory or one holding the marker may be replaced: a user's folder
    named by mistake (a home directory given as --out) is refused whole, not deleted."""
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    with pytest.raises(InputError, match="holds other files and no config.json"):
        with atomic_directory(mine, marker="config.json") as tmp:
            (tmp / "config.json").write_text("{}")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="is a file"):
        with atomic_directory(tmp_path / "file", marker="config.json"):
            pass
    assert (mine / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "notes"]
    for ours in (tmp_path / "new", tmp_path / "empty", tmp_path / "model"):
        if ours.name != "new":
            ours.mkdir()
        if ours.name == "model":
            (ours / "config.json").write_text("{}")
            (ours / "weights.pt").write_text("old")
        with atomic_directory(ours, marker="config.json") as tmp:
            (tmp / "config.json").write_text("{\"new\": 1}")
        assert sorted(p.name for p in ours.iterdir()) == ["config.json"]


def test_a_failed_directory_write_leaves_the_old_directory(tmp_path):
    target = tmp_path / "index"
    with atomic_directory(target, prefix=".tmp-") as tmp:
        (tmp / "a").write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_directory(target, prefix=".tmp-") as tmp:
            (tmp / "a").write_text("new")
            raise KeyboardInterrupt
    assert (target / "a").read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["index"]


def test_a_failed_final_rename_puts_the_old_directory_back(tmp_path, monkeypatch):
    """The one fault that cannot be caused for real: the rename of the new directory failing (a full disk)."""
    target = tmp_path / "model"
    with atomic_directory(target) as tmp:
        (tmp / "a").write_text("old")
    real = os.replace

    def failing(src, dst):  # the new directory's rename fails; putting the old one back works
        if Path(dst) == target and Path(src).name.startswith(".model.tmp-"):
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(files.os, "replace", failing)
    with pytest.raises(OSError, match="No space"):
        with atomic_directory(target) as tmp:
            (tmp / "a").write_text("new")
    assert (target / "a").read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["model"]


def test_every_writer_uses_the_one_helper():
    """No package writes by temp-file-and-rename on its own; topic_models (no recommender import) writes in place
    into the directory it is given, which TicketModel.save makes atomic."""
    pattern = re.compile(r"\bos\.(replace|rename)\(|\bmkstemp\(|\.replace\(directory|_write_atomic|_atomic_write")
    offenders = []
    for package in ("recommender", "topic_models", "web", "workers"):
        for path in (ROOT / package).rglob("*.py"):
            if path == ROOT / "recommender" / "files.py":
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []
