"""The pretrained channel S adapted to one knowledge base: all-MiniLM-L6-v2 fine-tuned on pairs mined from it.

Label-free training (`unsupervised.py`) fine-tunes a copy of the packaged encoder with sentence-transformers'
`MultipleNegativesRankingLoss` (each mined query against its own ticket view, the other views of the batch as
negatives), one short epoch on CPU, and keeps it only when it ranks the held-out slice better than the packaged
encoder. A kept encoder is saved inside the model directory (`sentence_encoder/`), its files' SHA-256 recorded in
the model's config, and loads from there offline (`load_adapted`), verified like the packaged one.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from ..errors import ModelError
from ..lexical.analyzer import clean
from .pretrained import PretrainedEncoder, get_encoder

#: The directory of an adapted encoder inside a model directory.
ENCODER_DIR = "sentence_encoder"
_LOADED: dict[tuple[str, str], "AdaptedEncoder"] = {}


def file_checksums(directory: Path) -> dict[str, str]:
    """SHA-256 of every file under `directory`, by its path relative to it."""
    out = {}
    for path in sorted(p for p in Path(directory).rglob("*") if p.is_file()):
        with path.open("rb") as fh:
            out[path.relative_to(directory).as_posix()] = hashlib.file_digest(fh, "sha256").hexdigest()
    return out


class AdaptedEncoder(PretrainedEncoder):
    """The S encoder fine-tuned on a knowledge base; the same `encode` as the packaged one."""

    name = "all-MiniLM-L6-v2, adapted to the knowledge base"

    def __init__(self, model_dir: Path, files: dict[str, str]):  # noqa: D107 - not the packaged files: verified here
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        found = file_checksums(model_dir) if Path(model_dir).is_dir() else {}
        if found != files:
            differ = sorted(set(found) ^ set(files) | {k for k in files if found.get(k) != files[k]})
            raise ModelError(f"the adapted sentence encoder in {model_dir} does not match the model's config "
                             f"({', '.join(differ[:3]) or 'missing'}); the model directory is damaged, retrain it")
        from sentence_transformers import SentenceTransformer

        try:
            self.model = SentenceTransformer(str(model_dir), device="cpu")
        except Exception as exc:  # a damaged directory surfaces as many error types
            raise ModelError(f"cannot load the adapted sentence encoder {model_dir} ({exc}); retrain the model") from exc


def load_adapted(model_dir: Path, files: dict[str, str]) -> AdaptedEncoder:
    """The adapted encoder saved in `model_dir` (verified against `files`), loaded once per process and verified
    again whenever a file of it changed (size or modification time)."""
    stats = tuple((p.as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
                  for p in sorted(Path(model_dir).rglob("*")) if p.is_file()) if Path(model_dir).is_dir() else ()
    key = (str(model_dir), hashlib.sha256(repr((sorted(files.items()), stats)).encode()).hexdigest())
    if key not in _LOADED:
        _LOADED[key] = AdaptedEncoder(Path(model_dir), files)
    return _LOADED[key]


def adapt(anchors: Sequence[str], positives: Sequence[str], *, seed: int = 0, epochs: int = 1, batch_size: int = 32,
          lr: float = 2e-5, max_seq_length: int = 128, progress: bool = False) -> tuple[Path, dict[str, str]]:
    """Fine-tune a copy of the packaged encoder on (anchor, positive) pairs with MultipleNegativesRankingLoss
    (in-batch negatives; give each positive once, or a batch holds false negatives); save it into a new
    temporary directory. Returns (directory, file checksums). Deterministic for a seed on one thread."""
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    base = get_encoder().model
    model = _copy(base)
    model.max_seq_length = max_seq_length
    loss = MultipleNegativesRankingLoss(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    pairs = [(clean(a), clean(p)) for a, p in zip(anchors, positives) if clean(a) and clean(p)]
    if len(pairs) < 2:
        raise ModelError("adapting the sentence encoder needs at least 2 mined pairs with text on both sides")
    steps = [order for _ in range(epochs) for order in np.array_split(rng.permutation(len(pairs)),
                                                                        max(1, len(pairs) // batch_size))]
    model.train()
    for batch in tqdm(steps, desc="adapting the sentence encoder", disable=not progress, leave=False):
        if len(batch) < 2:
            continue
        features = [model.preprocess([pairs[i][0] for i in batch]), model.preprocess([pairs[i][1] for i in batch])]
        value = loss(features, None)
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
    model.eval()
    model.max_seq_length = base.max_seq_length
    out = Path(tempfile.mkdtemp(prefix="ticketrec-encoder-"))
    model.save(str(out))
    return out, file_checksums(out)


def _copy(model):
    """A deep copy of a SentenceTransformer (the packaged encoder stays untouched)."""
    import copy

    return copy.deepcopy(model)


def save_into(source: Path, model_dir: Path) -> None:
    """Copy an adapted encoder directory into a model directory being written (`model_dir/sentence_encoder`)."""
    shutil.copytree(source, Path(model_dir) / ENCODER_DIR)
