"""Least-squares fits of the latency models' linear forms, with R².

Calibration measures times against a knob (draft steps K, window length T) and
fits y ≈ intercept + slope·x: T_edge(K) = α_edge·K + β (FlexSpec §IV-B),
T_cloud(K) = T_base + K·δ_cloud (FlexSpec eq. (9)), c_ℓ(T) = c0 + c1·T. Pure
numpy; knows nothing about models or clocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LinearFit:
    """y ≈ intercept + slope·x over n points, with its coefficient of determination."""

    intercept: float
    slope: float
    r2: float
    n: int

    def __call__(self, x):
        return self.intercept + self.slope * np.asarray(x, dtype=float)


def r_squared(y: np.ndarray, y_hat: np.ndarray) -> float:
    """R² = 1 − SS_res / SS_tot (1.0 when y is constant and fitted exactly)."""
    y, y_hat = np.asarray(y, float), np.asarray(y_hat, float)
    ss_res = float(np.sum((y - y_hat) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    if ss_tot == 0.0:
        return 1.0 if ss_res == 0.0 else 0.0
    return 1.0 - ss_res / ss_tot


def fit_linear(x, y, *, nonnegative: bool = True) -> LinearFit:
    """Ordinary least squares for y = a + b·x.

    nonnegative: times cannot be negative, so a negative intercept or slope is
    clamped to 0 and the other coefficient refitted with it held there.
    """
    x, y = np.asarray(x, float).ravel(), np.asarray(y, float).ravel()
    if x.size < 2 or x.size != y.size:
        raise ValueError(f"fit_linear needs >= 2 paired points, got x {x.size}, y {y.size}")
    if np.ptp(x) == 0:
        raise ValueError("fit_linear needs at least two distinct x values")
    A = np.stack([np.ones_like(x), x], axis=1)  # (n, 2) design matrix
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    if nonnegative and b < 0:
        a, b = float(y.mean()), 0.0
    if nonnegative and a < 0:
        a, b = 0.0, max(float(x @ y / (x @ x)), 0.0)  # through the origin
    return LinearFit(float(a), float(b), r_squared(y, a + b * x), int(x.size))
