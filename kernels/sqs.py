"""SQS-SD's edge-side rules: K-SQS and C-SQS supports, the conformal threshold, bit costs, L^t.

- K-SQS keeps the top-K tokens (SQS §2); C-SQS keeps {x : q(x) >= beta} (eq. 6),
  never empty (the argmax stays, as Lemma 4 assumes).
- `ConformalThreshold` runs the online update of beta (eq. 8) at the edge for
  every drafted token and, after the cloud's verdict, backtracks to the value
  after the last kept token (Alg. 1 lines 11-13), so that the average dropped
  mass over kept tokens obeys Theorem 2 (eq. 9).
- Bit costs: eq. (1) = subset bits (eq. 5; plus ceil(log2 V) for K under C-SQS,
  §3) + lattice bits (eq. 2). `batch_length` applies the per-batch budget B of §4.

Each support rule has a plain twin (`*_reference`). What it is not: the byte
format (kernels/payload_sqs.py) or the verifier (kernels/verify.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kernels.enumerative import bits_for, composition_bits, subset_bits
from kernels.lattice import lattice_quantize


def topk_support(q: np.ndarray, k: int) -> np.ndarray:
    """K-SQS support: the ids of the K largest q (ties: lower id), ascending."""
    q = np.asarray(q)
    if not 1 <= k <= q.size:
        raise ValueError(f"K must be in [1, {q.size}], got {k}")
    order = np.lexsort((np.arange(q.size), -q))  # by prob desc, then id asc
    return np.sort(order[:k])


def topk_support_reference(q: Sequence[float], k: int) -> list[int]:
    """Plain twin of topk_support."""
    return sorted(sorted(range(len(q)), key=lambda i: (-q[i], i))[:k])


def threshold_support(q: np.ndarray, beta: float) -> np.ndarray:
    """C-SQS support {x : q(x) >= beta} (eq. 6), ascending; the argmax alone if that set is
    empty."""
    q = np.asarray(q)
    ids = np.flatnonzero(q >= beta)  # eq. (6)
    return ids if ids.size else np.array([int(np.argmax(q))])


def threshold_support_reference(q: Sequence[float], beta: float) -> list[int]:
    """Plain twin of threshold_support."""
    ids = [i for i, x in enumerate(q) if x >= beta]
    return ids or [max(range(len(q)), key=lambda i: (q[i], -i))]


def dropped_mass(q: np.ndarray, ids: np.ndarray) -> float:
    """alpha_n(X_n) = sum_{x not in X_n} q(x) (eq. 4) = TV(q, q~) (Lemma 1)."""
    q = np.asarray(q, dtype=np.float64)
    return max(0.0, 1.0 - float(q[ids].sum()) / float(q.sum()))


def quantize_on_support(q: np.ndarray, ids: np.ndarray, ell: int) -> np.ndarray:
    """Counts on the support: SLQ of q~ = q restricted to ids, renormalized (Alg. 1 line 7)."""
    q = np.asarray(q, dtype=np.float64)[ids]
    if not q.sum() > 0:  # a support of zero-probability tokens (only if q itself was all zero)
        raise ValueError("the retained probabilities have no mass")
    return lattice_quantize(q, ell)


def dense_qhat(ids: np.ndarray, counts: np.ndarray, ell: int, v: int) -> np.ndarray:
    """q^ over the whole vocabulary: counts / ell on the support, 0 elsewhere (float32, (V,))."""
    out = np.zeros(v, np.float64)
    out[ids] = np.asarray(counts, np.float64) / ell  # q^[i] = b[i] / ell (Alg. 2 line 17)
    return out.astype(np.float32)


def ksqs_bits(v: int, k: int, ell: int) -> int:
    """b(K, ell) for K-SQS: ceil(log2 C(V, K)) (eq. 5) + ceil(log2 C(ell+K-1, K-1)) (eq. 2),
    eq. (1)."""
    return subset_bits(v, k) + composition_bits(ell, k)  # eq. (1)


def csqs_bits(v: int, k: int, ell: int) -> int:
    """b(K, ell) for C-SQS: K-SQS's cost plus ceil(log2 V) bits for K itself (§3)."""
    return subset_bits(v, k) + bits_for(v) + composition_bits(ell, k)  # eq. (1) with §3's b~


def batch_length(row_bits: Sequence[int], budget: int) -> int:
    """L^t = max{L : sum_{n<=L} b_n <= B} (SQS §4), taken sequentially; may be 0."""
    total = 0
    for n, b in enumerate(row_bits):
        total += b
        if total > budget:  # §4: stop generating when the bit budget is exhausted
            return n
    return len(row_bits)


def theorem2_bound(alpha: float, eta: float, beta1: float, t: int) -> float:
    """Right side of eq. (9): alpha + (|beta_1| + 1 + eta alpha) / (eta T)."""
    return alpha + (abs(beta1) + 1 + eta * alpha) / (eta * t)  # eq. (9)


@dataclass
class ConformalThreshold:
    """C-SQS's online threshold beta (eq. 8) with Alg. 1's checkpoint and backtrack.

    Per batch: `support(q)` for each drafted token (uses beta, then updates it);
    after the cloud's verdict, `verdict(accepted)` rewinds beta to its value
    after the kept tokens: the accepted ones plus, on a rejection, the rejected
    position (the correction's draft distribution is the one drafted there, so
    its line-12 update is the one already made). On full acceptance the bonus
    position's draft distribution may be passed to apply line 12 to it.
    `dropped_sum` and `kept` accumulate eq. (7)'s left side over kept tokens.
    """

    alpha: float
    eta: float
    beta: float
    beta1: float = field(init=False)
    dropped_sum: float = 0.0
    kept: int = 0
    _batch: list[tuple[float, float]] = field(default_factory=list)  # (beta before, dropped mass)

    def __post_init__(self) -> None:
        if not (0 < self.alpha < 1 and self.eta >= 0):
            raise ValueError(
                f"need 0 < alpha < 1 and eta >= 0 (alpha={self.alpha}, eta={self.eta})"
            )
        self.beta1 = self.beta

    def _update(self, q: np.ndarray) -> tuple[np.ndarray, float]:
        ids = threshold_support(q, self.beta)  # Alg. 1 line 6, eq. (6)
        a = dropped_mass(q, ids)
        self.beta = self.beta - self.eta * (a - self.alpha)  # eq. (8)
        return ids, a

    def support(self, q: np.ndarray) -> np.ndarray:
        """The support for the next drafted token (Alg. 1 lines 6-8); beta moves on."""
        before = self.beta
        ids, a = self._update(q)
        self._batch.append((before, a))
        return ids

    def undo(self) -> None:
        """Forget the last `support` call: its row was not drafted (SQS §4's budget stopped the
        batch before it), so Alg. 1 never applied its update (8) and beta goes back."""
        self.beta = self._batch.pop()[0]

    def verdict(self, accepted: int, q_bonus: np.ndarray | None = None) -> None:
        """Backtrack after the cloud accepted `accepted` of this batch's drafts (Alg. 1 lines
        11-13)."""
        n = len(self._batch)
        if not 0 <= accepted <= n:
            raise ValueError(f"accepted = {accepted} outside [0, {n}]")
        keep = accepted + 1 if accepted < n else n  # the rejected position's update is line 12's
        if keep < n:
            self.beta = self._batch[keep][0]  # beta after the kept tokens (checkpoint)
        self.dropped_sum += math.fsum(a for _, a in self._batch[:keep])
        self.kept += keep
        self._batch = []
        if accepted == n and q_bonus is not None:
            _, a = self._update(q_bonus)  # Alg. 1 line 12 on the bonus position
            self.dropped_sum += a
            self.kept += 1
