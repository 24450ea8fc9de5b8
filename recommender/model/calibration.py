"""Isotonic calibration of the raw similarity g ∈ (0, 1] to the 1–5 relatedness scale, stored as JSON (never pickled)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from sklearn.isotonic import IsotonicRegression

from ..errors import ModelError


class Calibrator:
    """A monotone map g → score in [1, 5]: linear interpolation between fitted thresholds, clipped outside them."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.x = np.asarray(x, dtype=np.float64)
        self.y = np.asarray(y, dtype=np.float64)
        if self.x.ndim != 1 or self.x.shape != self.y.shape or len(self.x) == 0:
            raise ValueError("calibrator thresholds must be two 1-d arrays of the same non-zero length")

    @classmethod
    def fit(cls, g: np.ndarray, scores: np.ndarray) -> "Calibrator":
        """Fit scikit-learn's IsotonicRegression(out_of_bounds="clip", y_min=1, y_max=5) of scores on g."""
        iso = IsotonicRegression(out_of_bounds="clip", y_min=1.0, y_max=5.0, increasing=True)
        iso.fit(np.asarray(g, dtype=np.float64), np.asarray(scores, dtype=np.float64))
        return cls(iso.X_thresholds_, iso.y_thresholds_)

    @classmethod
    def fit_centered(cls, g: np.ndarray, scores: np.ndarray, margin: float = 0.05) -> "Calibrator":
        """Centred isotonic regression (Oron & Flournoy 2017): strictly increasing, so ties break by raw score.

        Isotonic regression pools g into blocks of one value each, and every g of a block (or beyond the last
        one) gets the same score: ten results at 4.8. Here each block becomes one knot (its mean g, its value),
        the scores are squeezed into [1 + margin, 5 − margin] (order kept), and the map interpolates linearly
        between the knots, from (0, 1) below the first to (1, 5) above the last: a higher g always gets a
        higher score, and only g = 1 (the same text) reaches 5.
        """
        g = np.asarray(g, dtype=np.float64)
        scores = np.asarray(scores, dtype=np.float64)
        if g.ndim != 1 or g.shape != scores.shape or len(g) == 0:
            raise ValueError("calibration needs two 1-d arrays of the same non-zero length")
        iso = IsotonicRegression(out_of_bounds="clip", y_min=1.0, y_max=5.0, increasing=True).fit(g, scores)
        xs = np.unique(g)
        fitted = iso.predict(xs)
        weights = np.array([np.count_nonzero(g == x) for x in xs], dtype=np.float64)
        starts = np.flatnonzero(np.r_[True, np.diff(fitted) > 1e-12])
        ends = np.r_[starts[1:], len(xs)]
        knots_x = np.array([np.average(xs[a:b], weights=weights[a:b]) for a, b in zip(starts, ends)])
        knots_y = 1.0 + margin + (fitted[starts] - 1.0) * (4.0 - 2.0 * margin) / 4.0
        inside = (knots_x > 0.0) & (knots_x < 1.0)
        x = np.r_[0.0, knots_x[inside], 1.0]
        y = np.r_[1.0, knots_y[inside], 5.0]
        return cls(x, y)

    def __call__(self, g: np.ndarray) -> np.ndarray:
        """Calibrated scores (same as IsotonicRegression.predict)."""
        g = np.asarray(g, dtype=np.float64)
        if len(self.x) == 1:
            return np.full(g.shape, self.y[0])
        return np.interp(g, self.x, self.y)

    def to_dict(self) -> dict:
        return {"X_thresholds_": self.x.tolist(), "y_thresholds_": self.y.tolist()}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "Calibrator":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls(np.array(data["X_thresholds_"], dtype=np.float64), np.array(data["y_thresholds_"], dtype=np.float64))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelError(f"cannot read the calibrator {path}: {exc}; retrain the model") from exc
