"""Hyperparameter dataclasses saved with a model, that grow: a field added after models were saved keeps those models
loadable, reproducible and their versions as they were."""
from __future__ import annotations

from dataclasses import asdict
from typing import ClassVar


class SavedConfig:
    """Mixin of a dataclass of hyperparameters saved with a model (and hashed into its version).

    A field added after models were saved goes into `ADDED_FIELDS` with the value that reproduces those models (the
    behaviour before the field). Loading a saved config (`from_saved`) fills a field it does not name with that value,
    and at that value the field is left out of the version (`fingerprint_dict`): adding a field neither changes a
    saved model's version (its index versions stay valid) nor makes a loader call the model corrupt.
    """

    ADDED_FIELDS: ClassVar[dict] = {}

    @classmethod
    def from_saved(cls, data: dict):
        """The config a model was saved with (`from_dict` of the saved JSON, with `ADDED_FIELDS` under it)."""
        return cls.from_dict({**cls.ADDED_FIELDS, **data})

    def fingerprint_dict(self) -> dict:
        """The fields as JSON, less those of `ADDED_FIELDS` at their added value: what a version hashes."""
        return {k: v for k, v in asdict(self).items()
                if not (k in self.ADDED_FIELDS and v == self.ADDED_FIELDS[k])}
