"""HeteroSpec's complexity oracle (§4.1) and its bin lookup (§4.2), pure NumPy.

Φ is the cumulative meta-path top-K entropy of one draft path; the bins are the 8 leaves of
a depth-3 CART regression tree over Φ, stored as its 7 sorted thresholds (fitting lives in
apps/train/bins.py; this module only looks them up).
"""

from __future__ import annotations

import numpy as np


def topk_entropy(probs: np.ndarray, k: int) -> np.ndarray:
    """I_t: entropy of the renormalized top-k of each row. probs (..., V) -> (...)."""
    p = np.asarray(probs, dtype=np.float64)
    k = min(k, p.shape[-1])
    top = -np.partition(-p, k - 1, axis=-1)[..., :k]  # (..., k), the k largest
    pt = top / np.maximum(top.sum(-1, keepdims=True), 1e-30)  # p̃_{t,i}
    return -(np.where(pt > 0, pt * np.log(np.maximum(pt, 1e-30)), 0.0)).sum(-1)


def meta_path_entropy(path_probs: np.ndarray, k: int) -> float:
    """Φ(P) = Σ_t I_t(P) = -Σ_t Σ_{i≤K} p̃_{t,i} log p̃_{t,i} (HeteroSpec eq. 1).

    path_probs (T, V): the draft's distribution at each position of the path."""
    return float(topk_entropy(path_probs, k).sum())  # eq. (1)


def bin_of(phi: float, thresholds) -> int:
    """Index of the entropy bin holding `phi`: 0 for the lowest-entropy bin (eq. 2's leaves,
    ordered by Φ). thresholds: sorted split points (7 for a depth-3 tree)."""
    return int(np.searchsorted(np.asarray(thresholds, dtype=np.float64), phi, side="right"))
