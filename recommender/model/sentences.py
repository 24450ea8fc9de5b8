"""Sentence splitting: a Punkt splitter whose parameters are learnt from the knowledge base (no NLTK data)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer, PunktTrainer

from ..errors import ModelError
from ..lexical.analyzer import clean


class _MemoPunkt(PunktSentenceTokenizer):
    """Punkt that remembers its decision for each candidate break's context (the word before a period and the
    token after it). The decision depends on that context and the fixed parameters only, and contexts repeat
    (", e.g. the", "valve. Replace"): Punkt took half the time on the synthetic knowledge base, same result."""

    MAX_REMEMBERED = 200_000

    def __init__(self, params: PunktParameters):
        super().__init__(params)
        self._decisions: dict[str, bool] = {}

    def text_contains_sentbreak(self, text: str) -> bool:
        decision = self._decisions.get(text)
        if decision is None:
            decision = super().text_contains_sentbreak(text)
            if len(self._decisions) >= self.MAX_REMEMBERED:
                self._decisions.clear()
            self._decisions[text] = decision
        return decision


class SentenceSplitter:
    """Punkt sentence splitter whose parameters are learnt from the knowledge base (no NLTK data download)."""

    def __init__(self, params: PunktParameters | None = None):
        self.params = params or PunktParameters()
        self._tokenizer = _MemoPunkt(self.params)

    @classmethod
    def train(cls, texts: Iterable[str]) -> "SentenceSplitter":
        """Learn abbreviations, collocations and sentence starters from raw texts."""
        trainer = PunktTrainer()
        trainer.INCLUDE_ALL_COLLOCS = True
        for text in texts:
            trainer.train(clean(text), finalize=False)
        trainer.finalize_training()
        return cls(trainer.get_params())

    def split(self, text: str) -> list[str]:
        """Sentences of `text` (an empty text gives no sentence)."""
        text = clean(text)
        return [s for s in self._tokenizer.tokenize(text) if s.strip()] if text else []

    def to_dict(self) -> dict:
        p = self.params
        return {
            "abbrev_types": sorted(p.abbrev_types),
            "collocations": sorted([list(c) for c in p.collocations]),
            "sent_starters": sorted(p.sent_starters),
            "ortho_context": dict(p.ortho_context),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "SentenceSplitter":
        p = PunktParameters()
        p.abbrev_types = set(data.get("abbrev_types", []))
        p.collocations = {tuple(c) for c in data.get("collocations", [])}
        p.sent_starters = set(data.get("sent_starters", []))
        for word, flags in data.get("ortho_context", {}).items():
            p.ortho_context[word] = int(flags)
        return cls(p)

    def save(self, path: str | Path) -> None:
        """Write the Punkt parameters as JSON."""
        Path(path).write_text(json.dumps(self.to_dict()), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "SentenceSplitter":
        """Read Punkt parameters written by `save`."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise ModelError(f"cannot read the sentence splitter {path}: {exc}; retrain the model") from exc
