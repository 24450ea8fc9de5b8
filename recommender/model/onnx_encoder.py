"""The S channel's encoder on ONNX Runtime: a sentence-transformers model exported once into a checksummed cache.

`ensure_export` builds, once per encoder and backend, under `$TICKETREC_HOME/cache/encoders/<key>/`:

    model.onnx       the transformer, pooling (and any Dense/Normalize module) as one graph, exported with
                     torch.onnx from the verified local weights, its attention and layer norms fused by
                     ONNX Runtime's transformer optimizer, and for "onnx-int8" its weights quantised to int8
                     (`quantize_dynamic`, per output channel; activations quantised on the fly)
    manifest.json    the encoder's checksum, backend, recipe, the package versions that built it, the output
                     dimension and the SHA-256 of model.onnx

The key hashes the encoder's checksum, the backend, `RECIPE` and those package versions, so the same weights built
by the same software always reuse one export (the export is deterministic: tests/test_encoder_backends.py). The
directory is written aside and renamed into place (`files.atomic_directory`) under a lock; every load checks
model.onnx against the manifest's SHA-256, and a damaged cache entry is built again.

`OnnxEncoder` tokenises with the model's own `tokenizer.json` (the Rust tokenizers library), runs each text on its
own (no padding; its vector does not depend on the texts beside it) in one ONNX Runtime session per process (a
forked index worker opens its own), one intra-op thread a run, and the runs of a call spread over as many threads
as torch may use in that process (an index worker: 1) or as `encoder_base.encode_threads` says (training and
evaluation: every CPU, torch staying on one); a text's vector is the same on any count.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from ..errors import ModelError
from ..files import atomic_directory
from .encoder_base import SentenceEncoder, encode_workers, load_sentence_transformer, progress_bar

log = logging.getLogger(__name__)
# one encoding process per core: the tokenizer's own thread pool only competes with them (and warns after a fork)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

#: Bump when the export changes (graph, optimiser, quantisation): older cache entries are then not reused.
RECIPE = 1
#: Exports kept in the cache (the most recently used): each adapted encoder of a label-free training adds one
#: (~23 MB int8, ~90 MB float32); an export pruned while still in use is built again on its next load.
KEEP_EXPORTS = 8
#: Sessions a forked process inherited from its parent: kept referenced, never run or freed (see `session`).
_INHERITED: list = []
ONNX_FILE = "model.onnx"
MANIFEST = "manifest.json"
_OPSET = 17


def cache_root() -> Path:
    """Where exported encoders live: `$TICKETREC_HOME/cache/encoders`."""
    from ..config import Settings

    return Settings.from_env().home / "cache" / "encoders"


def _versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import torch
    import transformers

    return {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__,
            "transformers": transformers.__version__}


def cache_key(checksum: str, quantized: bool) -> str:
    """The cache directory name of an encoder's export: hash of its checksum, backend, recipe and package versions."""
    spec = {"checksum": checksum, "quantized": quantized, "recipe": RECIPE, **_versions()}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:24]


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def read_verified(directory: Path) -> dict | None:
    """The manifest of a cache entry whose model.onnx matches its recorded SHA-256, else None."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
        if _sha256(directory / ONNX_FILE) == manifest["files"][ONNX_FILE]:
            return manifest
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


@contextlib.contextmanager
def cache_lock(root: Path, name: str):
    """Hold the exclusive lock of cache entry `name` under `root` (created when missing); ModelError saying what to
    do when the cache cannot be written."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / f".{name}.lock", "a+")
    except OSError as exc:
        raise ModelError(f"cannot write the sentence-encoder cache {root} ({exc.strerror}); set TICKETREC_HOME to a "
                         "writable directory, or TICKETREC_ENCODER_BACKEND=torch") from exc
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_export(source: Path, name: str, checksum: str, quantized: bool, root: Path | None = None) -> Path:
    """The verified cache directory of `source`'s export (built now when missing or damaged)."""
    root = cache_root() if root is None else Path(root)
    target = root / cache_key(checksum, quantized)
    if target.is_dir() and read_verified(target) is not None:
        _touch(target)
        return target
    with cache_lock(root, target.name):  # one process builds; the others wait and then read its result
        if target.is_dir():
            if read_verified(target) is not None:
                return target
            log.warning("the ONNX export of %s in %s is damaged (model.onnx does not match its SHA-256): "
                        "building it again", name, target)
        log.info("exporting the sentence encoder %s to ONNX%s (once per encoder)", name, " int8" if quantized else "")
        try:
            with atomic_directory(target) as tmp:
                _export(source, tmp, checksum, quantized)
        except ModelError:
            raise
        except OSError as exc:
            raise ModelError(f"cannot write the ONNX export of {name} into {root} ({exc}); free some space or set "
                             "TICKETREC_HOME to a writable directory, or TICKETREC_ENCODER_BACKEND=torch") from exc
        except Exception as exc:  # the exporter, optimiser and quantiser raise many error types
            first = (str(exc).strip().splitlines() or [""])[0]
            raise ModelError(f"cannot export the sentence encoder {name} to ONNX ({type(exc).__name__}: {first}); "
                             "use TICKETREC_ENCODER_BACKEND=torch for it") from exc
    if read_verified(target) is None:
        raise ModelError(f"the ONNX export of {name} in {target} does not match its SHA-256 right after it was built; "
                         f"the disk may be failing: remove {target} and try again")
    prune(root, keep=KEEP_EXPORTS)
    return target


def _touch(directory: Path) -> None:
    """Mark a cache entry as used now (the prune keeps the most recently used)."""
    try:
        os.utime(directory / MANIFEST)
    except OSError:  # a read-only cache still serves
        pass


def prune(root: Path, keep: int = KEEP_EXPORTS) -> list[str]:
    """Remove all but the `keep` most recently used exports under `root`; returns the names removed."""
    entries = []
    for entry in Path(root).iterdir():
        if entry.is_dir() and not entry.name.startswith("."):
            try:
                entries.append(((entry / MANIFEST).stat().st_mtime, entry))
            except OSError:
                entries.append((0.0, entry))
    removed = []
    for _, entry in sorted(entries, reverse=True)[keep:]:
        shutil.rmtree(entry, ignore_errors=True)
        (Path(root) / f".{entry.name}.lock").unlink(missing_ok=True)
        removed.append(entry.name)
    return removed


def _pipeline(model):
    """The sentence-transformers pipeline (transformer, pooling, ...) as a module of (input_ids, attention_mask)."""
    import torch

    class Pipeline(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model({"input_ids": input_ids, "attention_mask": attention_mask})["sentence_embedding"]

    return Pipeline().eval()


def _export(source: Path, out: Path, checksum: str, quantized: bool) -> None:
    """Export `source` (a verified sentence-transformers directory) into the empty directory `out`."""
    import torch

    # eager attention: the graph ONNX Runtime's transformer optimiser recognises and fuses into one Attention op
    model = load_sentence_transformer(source, source.name, model_kwargs={"attn_implementation": "eager"})
    wrapped = _pipeline(model)
    ids = torch.tensor([[101, 2023, 2003, 102], [101, 2023, 102, 0]], dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.long)  # padding in the example: no masks folded
    raw = out / "raw.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        # The TorchScript exporter (deprecated in torch 2.9, kept in the pinned 2.13): the torch.export one gives a
        # graph whose attention ONNX Runtime does not fuse, measured 1.8x slower in int8 (docs/results/encoders.md).
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapped, (ids, mask), str(raw), dynamo=False, opset_version=_OPSET,
                          input_names=["input_ids", "attention_mask"], output_names=["sentence_embedding"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"},
                                        "sentence_embedding": {0: "batch"}})
        dim = int(wrapped(ids, mask).shape[-1])
    prompt = (model.prompts or {}).get(model.default_prompt_name or "", "") if hasattr(model, "prompts") else ""
    fused = _optimise(raw, out / "fused.onnx", model)
    final = out / ONNX_FILE
    if quantized:
        quantize_int8(fused, final)
    else:
        fused.rename(final)  # inside the directory atomic_directory is building
    for leftover in (raw, out / "fused.onnx"):
        leftover.unlink(missing_ok=True)
    for extra in out.iterdir():  # an exporter that wrote external data files beside the graph
        if extra.name != ONNX_FILE:
            shutil.rmtree(extra) if extra.is_dir() else extra.unlink()
    manifest = {"checksum": checksum, "backend": "onnx-int8" if quantized else "onnx", "recipe": RECIPE,
                "versions": _versions(), "dim": dim, "opset": _OPSET, "max_seq_length": int(model.max_seq_length),
                "lower_case": bool(getattr(model[0], "do_lower_case", False)), "prompt": prompt or "",
                "files": {ONNX_FILE: _sha256(final)}}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")


def quantize_int8(source: Path, target: Path) -> None:
    """`source`'s MatMul weights as int8 per output channel, activations quantised on the fly (`quantize_dynamic`):
    the int8 backend's graph, and what `benchmarks/encoder_speed.py --only ceiling` measures."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet_root_logger():
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})


@contextlib.contextmanager
def _quiet_root_logger():
    """The quantiser advises pre-processing on the root logger at WARNING; the fused graph needs none."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _optimise(raw: Path, out: Path, model) -> Path:
    """Fuse attention, layer norms and GELU with ONNX Runtime's transformer optimiser (BERT-like encoders); the
    graph as exported when the optimiser cannot read it."""
    try:
        from onnxruntime.transformers import optimizer

        config = model[0].auto_model.config
        with _quiet_root_logger(), contextlib.redirect_stdout(open(os.devnull, "w")):
            optimised = optimizer.optimize_model(str(raw), model_type="bert", opt_level=0,
                                                 num_heads=int(getattr(config, "num_attention_heads", 0) or 0),
                                                 hidden_size=int(getattr(config, "hidden_size", 0) or 0))
            optimised.save_model_to_file(str(out))
        return out
    except Exception as exc:  # an architecture the optimiser does not know: the plain graph still runs
        log.info("the ONNX transformer optimiser could not fuse %s (%s); using the graph as exported", raw, exc)
        return raw


class OnnxEncoder(SentenceEncoder):
    """A sentence-transformers model on ONNX Runtime (float32 or int8 weights), from the checksummed cache."""

    def __init__(self, directory: Path, name: str, checksum: str, quantized: bool = True, root: Path | None = None):
        from tokenizers import Tokenizer

        self.directory, self.name, self.checksum = Path(directory), name, checksum
        self.backend = "onnx-int8" if quantized else "onnx"
        self.export_dir = ensure_export(self.directory, name, checksum, quantized, root)
        manifest = read_verified(self.export_dir) or {}
        self.dim = int(manifest.get("dim", 0))
        self.onnx_sha256 = manifest.get("files", {}).get(ONNX_FILE, "")
        tokenizer_file = self.directory / "tokenizer.json"
        try:
            self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:
            raise ModelError(f"cannot read {tokenizer_file} ({exc}); the ONNX backends need a fast tokenizer file: "
                             "use TICKETREC_ENCODER_BACKEND=torch for this encoder") from exc
        self._tokenizer.no_padding()
        # what sentence-transformers does before its tokenizer, as the export recorded it
        self.max_seq_length = int(manifest.get("max_seq_length") or 256)
        self.lower, self.prompt = bool(manifest.get("lower_case")), str(manifest.get("prompt") or "")
        self._tokenizers: dict[int, object] = {}
        #: Texts per ONNX Runtime run, and whether runs group texts by length. One text per run pads nothing, and a
        #: text's int8 vector never depends on the texts beside it (dynamic quantisation scales each run's
        #: activations as a whole); it was also the fastest (docs/results/encoders.md). Benchmarks change them.
        self.run_texts, self.sort_runs = 1, True
        self._session = None
        self._session_pid = -1
        self._executor: ThreadPoolExecutor | None = None
        self._executor_size = 0
        self._executor_pid = -1
        self._lock = threading.Lock()

    def _tokenizer_for(self, max_tokens: int):
        """A tokenizer that truncates to `max_tokens` (one per length: a shared one's settings are not thread-safe)."""
        tok = self._tokenizers.get(max_tokens)
        if tok is None:
            with self._lock:
                tok = self._tokenizers.get(max_tokens)
                if tok is None:
                    from tokenizers import Tokenizer

                    tok = Tokenizer.from_str(self._tokenizer.to_str())
                    tok.no_padding()
                    tok.enable_truncation(max_length=max_tokens)
                    self._tokenizers[max_tokens] = tok
        return tok

    def session(self):
        """This process's ONNX Runtime session (a forked process opens its own: sessions do not survive a fork)."""
        if self._session is None or self._session_pid != os.getpid():
            with self._lock:
                if self._session is None or self._session_pid != os.getpid():
                    if self._session is not None:  # the parent's: freeing it here joins threads the fork did not
                        _INHERITED.append(self._session)  # copy, which hangs; it is never used again
                    self._session = self._open_session()
                    self._session_pid = os.getpid()
        return self._session

    def _open_session(self):
        import onnxruntime as ort

        # One thread per run, and the runs of a call spread over this process's threads (`_encode_groups`): a
        # second intra-op thread did not speed up one query's texts, two texts at once halved its time
        # (docs/results/encoders.md). An index worker has set one thread.
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # no busy-waiting on shared cores
        path = self.export_dir / ONNX_FILE
        if _sha256(path) != self.onnx_sha256:
            raise ModelError(f"{path} changed since it was verified; remove {self.export_dir} and run the command again")
        try:
            return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise ModelError(f"ONNX Runtime cannot load {path} ({exc}); remove {self.export_dir} to rebuild it") from exc

    def _encode(self, texts, max_tokens, batch_size, progress):
        return self._encode_groups([(texts, max_tokens)], batch_size, progress)[0]

    def _encode_groups(self, groups, batch_size, progress):
        """All groups' texts in runs of `run_texts` (longest first when `sort_runs`), spread over this process's
        threads when there are several runs: one query's components encode side by side."""
        encodings = []
        for texts, max_tokens in groups:
            limit = min(max_tokens or self.max_seq_length, self.max_seq_length)
            texts = [self.prompt + (t.lower() if self.lower else t) for t in texts]
            encodings.extend(self._tokenizer_for(limit).encode_batch(texts))
        session = self.session()
        out = np.zeros((len(encodings), self.dim), dtype=np.float32)

        def run(batch: np.ndarray) -> None:
            width = max(len(encodings[int(i)].ids) for i in batch)
            ids = np.zeros((len(batch), width), dtype=np.int64)
            mask = np.zeros((len(batch), width), dtype=np.int64)
            for row, i in enumerate(batch):
                piece = encodings[int(i)].ids
                ids[row, : len(piece)] = piece
                mask[row, : len(piece)] = 1
            out[batch] = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]

        lengths = [len(e.ids) for e in encodings]
        runs = _batches(lengths, self.run_texts, self.sort_runs)
        workers = encode_workers()
        shares = _shares(runs, lengths, workers)

        def run_all(share: list[np.ndarray], bar=None) -> None:
            for batch in share:
                run(batch)
                if bar is not None:
                    bar.update(len(batch))

        with progress_bar(len(encodings), progress) as bar:
            pool = self._pool(workers) if len(shares) > 1 else None
            others = {pool.submit(run_all, share): sum(map(len, share)) for share in shares[1:]}
            run_all(shares[0], bar)  # this thread takes a share too: one hand-off fewer
            for done in as_completed(others):
                done.result()
                bar.update(others[done])
        ends = np.cumsum([len(texts) for texts, _ in groups])
        return np.split(out, ends[:-1])

    def _pool(self, workers: int) -> ThreadPoolExecutor:
        """This process's threads for runs, at least `workers` − 1 of them: the calling thread runs a share itself
        (`_encode_groups`). A forked process makes its own, as it opens its own session; a pool too small for
        `workers` is replaced (the old one, no longer referenced, finishes what it was given and its threads end)."""
        need = max(1, workers - 1)
        if self._executor is None or self._executor_pid != os.getpid() or self._executor_size < need:
            with self._lock:
                if self._executor is None or self._executor_pid != os.getpid() or self._executor_size < need:
                    self._executor = ThreadPoolExecutor(need, thread_name_prefix="ticketrec-s")
                    self._executor_pid, self._executor_size = os.getpid(), need
        return self._executor


def _shares(runs: list[np.ndarray], lengths: list[int], workers: int) -> list[list[np.ndarray]]:
    """The runs split into at most `workers` shares of about equal word pieces (each run, longest first, to the
    share with the fewest so far), each kept in the order given; one share for one worker or one run."""
    if workers <= 1 or len(runs) <= 1:
        return [list(runs)]
    size = [sum(lengths[int(i)] for i in batch) for batch in runs]
    shares: list[list[int]] = [[] for _ in range(min(workers, len(runs)))]
    load = [0] * len(shares)
    for r in sorted(range(len(runs)), key=lambda r: -size[r]):
        k = load.index(min(load))
        shares[k].append(r)
        load[k] += size[r]
    return [[runs[r] for r in sorted(share)] for share in shares]


def _batches(lengths: list[int], size: int, by_length: bool) -> list[np.ndarray]:
    """Indices of the texts of each run: `size` at a time, longest first when `by_length`, else in order."""
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable") if by_length else np.arange(len(lengths))
    return [order[i : i + size] for i in range(0, len(order), size)]
