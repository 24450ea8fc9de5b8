"""The static S backend fitted to one knowledge base: its word-piece vectors taught to mimic the transformer there.

The distilled static vectors (`static_encoder.py`) see each word piece alone, out of context; averaged over a
ticket they rank SeaMonkey's duplicates far below BM25 (docs/results/encoders.md). Training fits them to the
knowledge base, as tokenlearn does for model2vec (Tulkens & van Dongen): a sample of the tickets' texts is encoded
by the transformer (ONNX int8, the teacher), and the vectors are fitted so that a text's mean vector points where
the teacher's does (1 − cosine, Adam), starting from the distilled vectors mapped into the teacher's space by least
squares. A held-out share of the texts stops the fit at its best epoch (epoch 0 is the mapped start). Only the
pieces the sample contains move; the rest keep their mapped vectors.

The fitted vectors live in the model's own encoder directory (`sentence_encoder/static_fit/`, a copy of the
encoder it was fitted from), so they are checksummed, saved and loaded with the model like an adapted encoder, and
the index, the engine and evaluation all encode with them.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from ..data.records import Ticket, component_text
from ..lexical.analyzer import clean
from .encoder_base import SentenceEncoder, file_checksums
from .static_encoder import STATIC_FIT_DIR

#: Tickets whose texts the teacher encodes (a random sample beyond this).
FIT_TICKETS = 5000
#: Each ticket's texts: the components S compares, and the merged ticket.
FIT_COMPONENTS = ("SUB", "DESC", "SOL", "SUB+DESC+SOL")
#: Word pieces per text (MAX_TOKENS of the long components).
FIT_TOKENS = 256
EPOCHS = 30
LEARNING_RATE = 1e-2
BATCH = 256
#: Share of the texts held out to stop the fit (by text).
HELD_OUT_SHARE = 0.2
#: Fewer texts than this: nothing is fitted.
MIN_TEXTS = 20


def fit_texts(tickets: Sequence[Ticket], seed: int = 0) -> list[str]:
    """The distinct, cleaned, non-empty texts of up to `FIT_TICKETS` tickets (a seeded sample of larger sets)."""
    tickets = list(tickets)
    if len(tickets) > FIT_TICKETS:
        rows = np.random.default_rng(seed).choice(len(tickets), FIT_TICKETS, replace=False)
        tickets = [tickets[int(i)] for i in sorted(rows)]
    texts = (clean(component_text(t, comp)) for t in tickets for comp in FIT_COMPONENTS)
    return list(dict.fromkeys(t for t in texts if t))


def _piece_ids(static_model, texts: Sequence[str]) -> list[np.ndarray]:
    return [np.asarray(ids[:FIT_TOKENS], dtype=np.int64) for ids in static_model.tokenize(list(texts))]


def _mean_vectors(table: np.ndarray, ids: Sequence[np.ndarray]) -> np.ndarray:
    out = np.zeros((len(ids), table.shape[1]), dtype=np.float32)
    for i, row in enumerate(ids):
        if len(row):
            out[i] = table[row].mean(axis=0)
    return out


def fit_vectors(static: SentenceEncoder, teacher: SentenceEncoder, texts: Sequence[str], seed: int = 0,
                progress: bool = False) -> tuple[np.ndarray, dict]:
    """(vectors [pieces, teacher dim], report): `static`'s word-piece vectors (a `StaticEncoder`) fitted so that
    each text's mean vector points where `teacher` puts the text. Deterministic for a seed."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    table = np.asarray(static.static_model.embedding, dtype=np.float32)
    ids = _piece_ids(static.static_model, texts)
    rows = np.array([i for i, r in enumerate(ids) if len(r)], dtype=np.int64)
    target = teacher.encode([texts[int(i)] for i in rows], max_tokens=FIT_TOKENS, progress=progress)
    ids = [ids[int(i)] for i in rows]
    order = rng.permutation(len(ids))
    n_held = max(1, int(round(HELD_OUT_SHARE * len(ids))))
    held, train = np.sort(order[:n_held]), np.sort(order[n_held:])

    start = _mean_vectors(table, ids)
    start /= np.maximum(np.linalg.norm(start, axis=1, keepdims=True), 1e-12)
    mapping, *_ = np.linalg.lstsq(start[train], target[train], rcond=None)
    bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy((table @ mapping).astype(np.float32)),
                                                freeze=False, mode="mean")
    optimizer = torch.optim.Adam(bag.parameters(), lr=LEARNING_RATE)
    goal = torch.from_numpy(target)

    def loss(sel: np.ndarray) -> torch.Tensor:
        flat = torch.from_numpy(np.concatenate([ids[int(i)] for i in sel]))
        offsets = torch.from_numpy(np.cumsum([0] + [len(ids[int(i)]) for i in sel[:-1]]))
        return (1 - torch.nn.functional.cosine_similarity(bag(flat, offsets), goal[sel])).mean()

    def held_loss() -> float:
        with torch.no_grad():
            return float(loss(held))

    first = best = held_loss()
    best_vectors, best_epoch = bag.weight.detach().clone(), 0
    for epoch in tqdm(range(1, EPOCHS + 1), desc="fitting static S vectors", disable=not progress, leave=False):
        for batch in np.array_split(rng.permutation(train), max(1, len(train) // BATCH)):
            value = loss(batch)
            optimizer.zero_grad()
            value.backward()
            optimizer.step()
        now = held_loss()
        if now < best:
            best, best_vectors, best_epoch = now, bag.weight.detach().clone(), epoch
    report = {"texts": int(len(ids)), "held_out_texts": int(n_held), "held_out_distance_mapped": round(first, 4),
              "held_out_distance": round(best, 4), "epochs": best_epoch, "max_epochs": EPOCHS,
              "teacher": teacher.backend}
    return best_vectors.numpy().astype(np.float32), report


def write_fitted(source: Path, static: SentenceEncoder, vectors: np.ndarray, out: Path, report: dict) -> dict[str, str]:
    """Write an encoder directory into `out`: a copy of the encoder directory `source` (its own `static_fit/` left
    out) with the fitted vectors in `static_fit/`. Returns the checksums of its files."""
    from model2vec import StaticModel

    from .onnx_encoder import MANIFEST

    out = Path(out)
    shutil.copytree(source, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(STATIC_FIT_DIR))
    fitted = out / STATIC_FIT_DIR
    StaticModel(vectors, static.static_model.tokenizer, normalize=True,
                base_model_name=static.name).save_pretrained(str(fitted))
    manifest = {"checksum": static.checksum, "backend": "static", "fitted": report, "dim": int(vectors.shape[1]),
                "max_seq_length": int(static.max_seq_length), "files": file_checksums(fitted)}
    (fitted / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return file_checksums(out)


def runs_static(model) -> bool:
    """Whether `model` (a TicketModel) weighs S and computes it on the static backend."""
    return "S" in model.siamese_config.active_channels and (model.s_channel or {}).get("backend") == "static"


def fit_static_encoder(model, tickets: Sequence[Ticket], seed: int = 0, progress: bool = False) -> dict | None:
    """When `model` (a TicketModel) computes S on the static backend: fit its vectors to `tickets` (`fit_vectors`,
    the teacher the same encoder on ONNX int8), make the result the model's own encoder (meta "sentence_encoder",
    `sentence_encoder_dir`, a scratch directory until `adaptation.keep_saved_encoder`) and its S record. Returns
    the fit's report, or None when the model's S is not static or the tickets give fewer than `MIN_TEXTS` texts."""
    from .adaptation import scratch_directory
    from .pretrained import channel_record, load_encoder

    if not runs_static(model):
        return None
    record = model.s_channel
    texts = fit_texts([model.model_input(t) for t in tickets], seed)  # as the model reads them
    if len(texts) < MIN_TEXTS:
        return None
    static = model.sentence_encoder()
    vectors, report = fit_vectors(static, model.sentence_encoder("onnx-int8"), texts, seed, progress)
    directory = scratch_directory()
    files = write_fitted(static.directory, static, vectors, directory, report)
    own = dict(model.meta.get("sentence_encoder") or {"base": static.name})
    model.meta["sentence_encoder"] = {**own, "files": files, "static_fit": report}
    model.sentence_encoder_dir = directory
    fitted = load_encoder(directory, files, "static",
                          name=f"{static.name}, static vectors fitted to the knowledge base")
    model.meta["s_channel"] = model.s_channel = channel_record(fitted, record.get("max_tokens"))
    model.invalidate()
    return report
