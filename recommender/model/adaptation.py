"""The pretrained channel S adapted to one knowledge base: all-MiniLM-L6-v2 fine-tuned on pairs mined from it.

Label-free training (`mined_adaptation.py`) fine-tunes a copy of the packaged encoder with sentence-transformers'
`MultipleNegativesRankingLoss` (each mined query against its own ticket view, the other views of the batch as
negatives), one short epoch on CPU, and keeps it only when it ranks the held-out slice better than the packaged
encoder. A kept encoder is saved inside the model directory (`sentence_encoder/`), its files' SHA-256 recorded in
the model's config, and loads from there offline (`load_adapted`), verified like the packaged one, on the backend
new models use (`pretrained.selected`: ONNX Runtime int8 unless set otherwise), exported on first use into the
checksummed cache of `onnx_encoder.py` like any encoder.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from ..errors import InputError, ModelError
from ..lexical.analyzer import clean
from .pretrained import SentenceEncoder, file_checksums, forget, get_encoder, load_encoder, selected

#: The directory of an adapted encoder inside a model directory.
ENCODER_DIR = "sentence_encoder"
__all__ = ["ENCODER_DIR", "adapt", "apart", "check_threads", "discard", "file_checksums", "keep_saved_encoder",
           "load_adapted", "save_into", "scratch_directory", "torch_threads"]


def load_adapted(model_dir: Path, files: dict[str, str], backend: str | None = None) -> SentenceEncoder:
    """The adapted encoder saved in `model_dir` (verified against `files`) on `backend` (None: the one new models
    use), loaded once per process and verified again whenever a file of it changed (size or modification time)."""
    return load_encoder(model_dir, files, backend or selected()[1], name="adapted to the knowledge base")


def check_threads(threads) -> int:
    """`threads` when it is a whole number of at least 1 (the torch threads of a fine-tuning), else InputError."""
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise InputError(f"threads must be a whole number of at least 1, not {threads!r}")
    return threads


@contextlib.contextmanager
def torch_threads(threads: int):
    """torch on `threads` threads within the block, on its count before after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(check_threads(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def adapt(anchors: Sequence[str], positives: Sequence[str], out: str | Path, *, negatives: Sequence[str] | None = None,
          groups: Sequence | None = None, base=None, seed: int = 0, epochs: int = 1, batch_size: int = 32,
          lr: float = 2e-5, max_seq_length: int = 128, progress: bool = False, threads: int = 1) -> dict[str, str]:
    """Fine-tune a copy of `base` (a SentenceTransformer; None: the encoder new models use, the packaged one unless
    `--encoder DIR` chose another) on (anchor, positive) pairs with MultipleNegativesRankingLoss (in-batch negatives:
    give each positive once, or pass `groups`, one label per pair, and pairs of one group never share a batch, where
    each would be the other's false negative); with `negatives`, one per pair, on (anchor, positive, negative)
    triplets, each anchor then ranked against every positive and negative of its batch; save it into the directory
    `out` (e.g. a `scratch_directory`). Returns its files' checksums. Runs on `threads` torch threads: deterministic
    for a seed and a thread count, and another encoder for another count (sums taken in another order)."""
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    check_threads(threads)
    base = get_encoder().model if base is None else base
    model = _copy(base)
    model.max_seq_length = max_seq_length
    _checkpoint_gradients(model, True)
    loss = MultipleNegativesRankingLoss(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    if negatives is not None and len(negatives) != len(anchors):
        raise ModelError(f"adapting the sentence encoder needs one negative per pair: {len(negatives)} for "
                         f"{len(anchors)} pairs")
    if groups is not None and len(groups) != len(anchors):
        raise ModelError(f"adapting the sentence encoder needs one group per pair: {len(groups)} for "
                         f"{len(anchors)} pairs")
    columns = [anchors, positives] if negatives is None else [anchors, positives, negatives]
    # each pair's cleaned (anchor, positive[, negative]) and group (its own without `groups`); a pair with an empty
    # text is left out
    cleaned = zip(*([clean(t) for t in column] for column in columns))
    kept = [(texts, g) for texts, g in zip(cleaned, range(len(anchors)) if groups is None else groups) if all(texts)]
    pairs, labels = [texts for texts, _ in kept], [g for _, g in kept]
    if len(pairs) < 2:
        raise ModelError("adapting the sentence encoder needs at least 2 mined pairs with text on both sides")
    n_batches = max(1, len(pairs) // batch_size)
    steps = [b for _ in range(epochs) for b in apart(rng.permutation(len(pairs)), labels, n_batches)]
    model.train()
    with torch_threads(threads):
        for batch in tqdm(steps, desc="adapting the sentence encoder", disable=not progress, leave=False):
            if len(batch) < 2:
                continue
            features = [model.preprocess([pairs[i][c] for i in batch]) for c in range(len(columns))]
            value = loss(features, None)
            optimizer.zero_grad()
            value.backward()
            optimizer.step()
    model.eval()
    _checkpoint_gradients(model, False)
    model.max_seq_length = base.max_seq_length
    model.save(str(out))
    del model, loss, optimizer
    _return_freed_memory()
    return file_checksums(Path(out))


def apart(order: np.ndarray, groups: Sequence, n_batches: int) -> list[np.ndarray]:
    """`order` cut into `n_batches` batches as `np.array_split` cuts it, except that no two pairs of one group share a
    batch: a pair whose group its batch holds already goes to the next batch (cyclically) with room and without its
    group, else to the smallest batch without it, else (its group is in every batch) to a new batch. Pairs of
    distinct groups: `np.array_split`'s cut; batches: as many as `n_batches` or the largest group."""
    sizes = [len(part) for part in np.array_split(np.arange(len(order)), n_batches)]
    home = np.repeat(np.arange(n_batches), sizes)
    rows: list[list[int]] = [[] for _ in range(n_batches)]
    held: list[set] = [set() for _ in range(n_batches)]
    for position, i in enumerate(order):
        g = groups[int(i)]
        tries = [(home[position] + step) % n_batches for step in range(n_batches)] + list(range(n_batches, len(rows)))
        free = [b for b in tries if g not in held[b]]
        b = next((b for b in free if b < n_batches and len(rows[b]) < sizes[b]), None)
        if b is None and free:
            b = min(free, key=lambda b: len(rows[b]))
        if b is None:
            b = len(rows)
            rows.append([])
            held.append(set())
        rows[b].append(int(i))
        held[b].add(g)
    return [np.array(r, np.int64) for r in rows if r]


def _return_freed_memory() -> None:
    """Hand what the adaptation freed back to the operating system. glibc keeps freed blocks in its heaps, and a
    process that adapts S several times (`train --with-feedback`: one adaptation per cross-validation fold, then the
    kept one) sat on 1 to 1.5 GB more after each; `malloc_trim` releases them. Nothing where the C library has no
    such call."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError, TypeError):  # no such call (musl, macOS), or no process handle (Windows)
        pass


def _checkpoint_gradients(model, on: bool) -> bool:
    """Switch gradient checkpointing of `model`'s transformer on or off; whether it could (a module without it is
    left as it is). Each layer's activations are computed again during the backward pass instead of kept: the
    adaptation's peak memory on CPU about halves (4.8 -> 2.5 GB for 130 pairs of SeaMonkey tickets, batches of 32,
    128 word pieces) for about a fifth more time, and the adapted weights are bit for bit the same (dropout replays
    its random draws)."""
    transformer = getattr(model[0], "auto_model", None) if len(model) else None
    if transformer is None or not getattr(transformer, "supports_gradient_checkpointing", False):
        return False
    if on:
        transformer.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        transformer.activation_checkpointing_disable()
    return True


def scratch_directory() -> Path:
    """A new temporary directory for an adapted encoder (about 90 MB) that nobody has saved yet; removed when the
    process exits if `discard` has not removed it before."""
    directory = Path(tempfile.mkdtemp(prefix="ticketrec-encoder-"))
    atexit.register(discard, directory)
    return directory


def discard(directory: Path) -> None:
    """Remove a `scratch_directory` and forget the encoders loaded from it (gone already: nothing to do)."""
    forget(directory)
    shutil.rmtree(directory, ignore_errors=True)


def _copy(model):
    """A deep copy of a SentenceTransformer (the packaged encoder stays untouched)."""
    import copy

    return copy.deepcopy(model)


def save_into(source: Path, model_dir: Path) -> None:
    """Copy an adapted encoder directory into a model directory being written (`model_dir/sentence_encoder`)."""
    shutil.copytree(source, Path(model_dir) / ENCODER_DIR)


def keep_saved_encoder(model, out_dir: str | Path) -> None:
    """After `model.save(out_dir)` of a TicketModel whose own encoder (adapted, or with static vectors fitted) is in
    a scratch directory: read it from the saved copy and remove the scratch directory."""
    scratch = model.sentence_encoder_dir
    model.sentence_encoder_dir = Path(out_dir) / ENCODER_DIR
    discard(scratch)
