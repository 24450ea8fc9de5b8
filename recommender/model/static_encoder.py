"""The S channel's static backend: word-piece vectors distilled from the sentence encoder, averaged (model2vec).

For knowledge bases too large for a transformer on the CPUs at hand. The distillation follows model2vec's recipe
(Tulkens & van Dongen, 2024) from the local, verified weights, offline: every word piece of the encoder's vocabulary
is encoded alone ([CLS] piece [SEP], mean of the transformer's outputs), the vectors are reduced by PCA to
`PCA_DIMS` and weighted by SIF (a / (a + p), p a Zipf estimate of the piece's frequency from its rank); a text's
vector is then the mean of its pieces' vectors (`model2vec.StaticModel`), normalised. (model2vec's own `distill`
needs its `distill` extra, which is not installed here; its inference class is all this uses of it.)

A model fitted to its knowledge base (`static_fit.py`) carries its own vectors in its encoder directory
(`static_fit/`), read instead of the distillation. The distillation is built once per encoder under
`$TICKETREC_HOME/cache/encoders/<key>/`, like the ONNX exports (`onnx_encoder.py`): written aside and renamed
into place under a lock, every file's SHA-256 in `manifest.json`, checked on load, and built again when damaged.
What it costs in ranking quality is in docs/results/encoders.md.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np

from ..errors import ModelError
from ..files import atomic_directory
from .onnx_encoder import MANIFEST, cache_lock, cache_root, prune
from .encoder_base import SentenceEncoder, file_checksums, load_sentence_transformer

log = logging.getLogger(__name__)

#: Bump when the distillation changes: older cache entries are then not reused.
RECIPE = 1
PCA_DIMS = 256
#: SIF's a: frequent pieces (a low rank) weigh less.
SIF_COEFFICIENT = 1e-4
#: Where an encoder directory keeps static vectors fitted to a knowledge base (`static_fit.py`), read when present.
STATIC_FIT_DIR = "static_fit"
#: Pieces encoded per forward pass while distilling.
DISTILL_BATCH = 512


def cache_key(checksum: str) -> str:
    """The cache directory name of an encoder's static distillation."""
    import model2vec
    import sklearn
    import torch

    spec = {"checksum": checksum, "static": RECIPE, "pca": PCA_DIMS, "sif": SIF_COEFFICIENT,
            "torch": torch.__version__, "model2vec": model2vec.__version__, "scikit-learn": sklearn.__version__}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:24]


def _verified(directory: Path) -> dict | None:
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
        found = {k: v for k, v in file_checksums(directory).items() if k != MANIFEST}
        if found == manifest["files"]:
            return manifest
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def ensure_static(source: Path, name: str, checksum: str, root: Path | None = None) -> Path:
    """The verified cache directory of `source`'s static distillation (built now when missing or damaged)."""
    root = cache_root() if root is None else Path(root)
    target = root / f"static-{cache_key(checksum)}"
    if target.is_dir() and _verified(target) is not None:
        return target
    with cache_lock(root, target.name):
        if target.is_dir() and _verified(target) is not None:
            return target
        if target.is_dir():
            log.warning("the static distillation of %s in %s is damaged: building it again", name, target)
        log.info("distilling static word-piece vectors from %s (once per encoder)", name)
        try:
            with atomic_directory(target) as tmp:
                _distill(source, tmp, checksum)
        except OSError as exc:
            raise ModelError(f"cannot write the static distillation of {name} into {root} ({exc}); free some space "
                             "or set TICKETREC_HOME to a writable directory") from exc
        except ModelError:
            raise
        except Exception as exc:  # torch, scikit-learn and model2vec raise many error types
            first = (str(exc).strip().splitlines() or [""])[0]
            raise ModelError(f"cannot distil static vectors from {name} ({type(exc).__name__}: {first}); use "
                             "another TICKETREC_ENCODER_BACKEND for it") from exc
    prune(root)
    return target


def _distill(source: Path, out: Path, checksum: str) -> None:
    import torch
    from model2vec import StaticModel
    from sklearn.decomposition import PCA
    from tokenizers import Tokenizer

    model = load_sentence_transformer(source, source.name)
    transformer = model[0].auto_model.eval()
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    vocab = tokenizer.get_vocab()
    size = max(vocab.values()) + 1
    special = {tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "<s>", "</s>", "<pad>")}
    special.discard(None)
    cls_id = tokenizer.token_to_id("[CLS]") if tokenizer.token_to_id("[CLS]") is not None else tokenizer.token_to_id("<s>")
    sep_id = tokenizer.token_to_id("[SEP]") if tokenizer.token_to_id("[SEP]") is not None else tokenizer.token_to_id("</s>")
    if cls_id is None or sep_id is None:
        raise ModelError(f"the static backend needs a BERT- or RoBERTa-style tokenizer ({source}); use another backend")
    ids = np.arange(size, dtype=np.int64)
    vectors = np.zeros((size, transformer.config.hidden_size), dtype=np.float32)
    with torch.no_grad():
        for start in range(0, size, DISTILL_BATCH):
            batch = torch.from_numpy(ids[start : start + DISTILL_BATCH])
            x = torch.stack([torch.full_like(batch, cls_id), batch, torch.full_like(batch, sep_id)], dim=1)
            hidden = transformer(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state
            vectors[start : start + len(batch)] = hidden.mean(dim=1).numpy()
    keep = np.array([i not in special for i in range(size)])
    pca = PCA(n_components=min(PCA_DIMS, vectors.shape[1]), random_state=0, svd_solver="full").fit(vectors[keep])
    reduced = pca.transform(vectors).astype(np.float32)
    rank_probability = 1.0 / np.arange(2, size + 2)
    rank_probability /= rank_probability.sum()
    reduced *= (SIF_COEFFICIENT / (SIF_COEFFICIENT + rank_probability))[:, None].astype(np.float32)
    reduced[~keep] = 0.0
    StaticModel(reduced, tokenizer, normalize=True, base_model_name=source.name).save_pretrained(str(out))
    files = file_checksums(out)
    manifest = {"checksum": checksum, "backend": "static", "recipe": RECIPE, "dim": int(reduced.shape[1]),
                "max_seq_length": int(model.max_seq_length), "files": files}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")


class StaticEncoder(SentenceEncoder):
    """The encoder's distilled word-piece vectors, averaged: thousands of texts per second on one core."""

    backend = "static"

    def __init__(self, directory: Path, name: str, checksum: str, root: Path | None = None):
        try:
            from model2vec import StaticModel
        except ImportError as exc:
            raise ModelError("the static backend needs the package model2vec (the bench extra: make bench-deps); "
                             "install it or choose another TICKETREC_ENCODER_BACKEND") from exc

        self.directory, self.name, self.checksum = Path(directory), name, checksum
        fitted = self.directory / STATIC_FIT_DIR  # vectors fitted to a knowledge base (`static_fit.py`)
        if (fitted / MANIFEST).is_file():
            self.static_dir = fitted
        else:
            self.static_dir = ensure_static(self.directory, name, checksum, root)
        manifest = _verified(self.static_dir) or {}
        self.dim, self.max_seq_length = int(manifest.get("dim", 0)), int(manifest.get("max_seq_length") or 256)
        try:
            self._static = StaticModel.from_pretrained(str(self.static_dir), force_download=False)
        except Exception as exc:
            raise ModelError(f"cannot load the static vectors {self.static_dir} ({exc}); remove it to rebuild") from exc

    @property
    def static_model(self):
        """The word-piece vectors and tokenizer (a `model2vec.StaticModel`)."""
        return self._static

    def _encode(self, texts, max_tokens, batch_size, progress):
        limit = min(max_tokens or self.max_seq_length, self.max_seq_length)
        return self._static.encode(list(texts), max_length=limit, normalize=True, use_multiprocessing=False,
                                   show_progress_bar=progress)
