"""The other Siamese networks of our sources as extra channels of the multi-channel Manhattan metric.

    C  the character-level Siamese BLSTM (`char_siamese.CharSiamese`, Neculoiu et al. 2016): unit output vectors,
       so L1 between them tracks the cosine energy the network was trained on;
    V  the variational Siamese encoder (`var_siamese.VarSiamese`, Deudon 2018): [μ ; σ] rows, whose L1 distance is
       the Manhattan analogue of the element-wise Wasserstein-2 distance.

A channel's encoder is trained on its own (`ticketrec train --arch char-siamese|var-siamese --out DIR`) and given to
the Replicated Siamese model's training (`ticketrec train --channel DIR`): like the topic channel T, it turns each
component's text (SUB, DESC, SOL, the merged ALL) into a vector once per ticket, stored in the index; the metric
weighs it with the other channels and the weight selection decides whether it serves (0 drops it). The encoder is
saved inside the model directory (`channels/C/`, `channels/V/`, each verified by its own checksums) and its version
is part of the model's.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from ..errors import ModelError

#: channel → the architecture whose encoder computes it (the `arch` of its model directory's config.json).
CHANNEL_ARCH = {"C": "char-siamese", "V": "var-siamese"}
#: The directory of a model that holds its extra channels' encoders.
CHANNELS_DIR = "channels"


class ChannelEncoder(Protocol):
    """What an extra channel needs of its encoder."""

    version: str
    #: width of a channel vector
    dim: int

    def channel_vectors(self, texts: Sequence[str]) -> np.ndarray: ...

    def save(self, path: str | Path) -> None: ...


def encoder_class(channel: str):
    """The encoder class of an extra channel ("C" or "V")."""
    if channel == "C":
        from .char_siamese import CharSiamese

        return CharSiamese
    if channel == "V":
        from .var_siamese import VarSiamese

        return VarSiamese
    raise ModelError(f"{channel!r} is not an extra channel; use one of {', '.join(CHANNEL_ARCH)}")


def load_channel_encoder(path: str | Path) -> tuple[str, ChannelEncoder]:
    """(channel, encoder) of a char-siamese or var-siamese model directory (verified as its class loads it);
    ModelError naming what to do for anything else."""
    path = Path(path)
    try:
        arch = json.loads((path / "config.json").read_text(encoding="utf-8")).get("arch")
    except (OSError, ValueError, AttributeError) as exc:
        raise ModelError(f"no model directory at {path} ({exc}); train a channel's encoder first: ticketrec train "
                         f"--arch char-siamese|var-siamese --out {path}") from exc
    channel = {a: c for c, a in CHANNEL_ARCH.items()}.get(arch)
    if channel is None:
        raise ModelError(f"{path} holds a {arch or 'Replicated Siamese LSTM'} model; --channel takes the directory of "
                         "a model trained with --arch char-siamese or --arch var-siamese")
    return channel, encoder_class(channel).load(path)


def channel_record(encoders: dict[str, ChannelEncoder]) -> dict:
    """What a model's config records of its extra channels: each channel's architecture and encoder version."""
    return {c: {"arch": CHANNEL_ARCH[c], "version": e.version} for c, e in sorted(encoders.items())}


def load_channel_encoders(model_dir: Path, record: dict) -> dict[str, ChannelEncoder]:
    """The encoders a saved model's `record` names, from `model_dir/channels/`, each checked against its version."""
    out = {}
    for channel, entry in record.items():
        directory = model_dir / CHANNELS_DIR / channel
        encoder = encoder_class(channel).load(directory)
        if encoder.version != entry.get("version"):
            raise ModelError(f"the {entry.get('arch', channel)} encoder in {directory} is version {encoder.version}, "
                             f"the model was trained with {entry.get('version')}; the artifact is inconsistent, "
                             "retrain the model")
        out[channel] = encoder
    return out
