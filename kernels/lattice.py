"""Sparse lattice quantization (SQS App. A.1, Alg. 2): K retained probabilities -> counts / ell.

Given the probabilities kept by sparsification, renormalized to q~ (the
distribution Alg. 1 line 7 quantizes), Alg. 2 returns integer counts b with
sum(b) = ell; the quantized distribution is q^ = b / ell on the support. Counts
are >= 0, as Alg. 2 produces them: a kept token whose q~ is below 1/(2 ell) may
get 0 and then carries no mass in q^ (the draft never samples it). The count of
such lattice points is SQS eq. (2), C(ell+K-1, K-1) (kernels/enumerative.py).

`lattice_quantize` is vectorized; `lattice_quantize_reference` is the line-by-line
transcription of Alg. 2. Ties in zeta are broken by position (stable sort), so
both are deterministic and agree exactly.

What it is not: the support selection (kernels/sqs.py) or the integer coding.
"""

from __future__ import annotations

import math

import numpy as np


def lattice_quantize(q: np.ndarray, ell: int) -> np.ndarray:
    """Counts b (int64, same length as q) with b >= 0, sum(b) == ell, b ~ ell * q / sum(q)."""
    q = np.asarray(q, dtype=np.float64)
    if q.ndim != 1 or q.size == 0 or ell < 1 or (q < 0).any() or not q.sum() > 0:
        raise ValueError(
            f"need a nonempty nonnegative vector with positive mass and ell >= 1 (ell={ell})"
        )
    target = ell * (
        q / math.fsum(q)
    )  # ell * q~[i], q~ the renormalized retained mass (Alg. 1 line 7)
    b = np.floor(target + 0.5).astype(np.int64)  # Alg. 2 line 6: b'[i] = floor(ell q[i] + 1/2)
    excess = int(b.sum()) - ell  # Alg. 2 line 7: ell' - ell
    if excess:
        zeta = b - target  # Alg. 2 line 9: zeta[i] = b'[i] - ell q[i]
        order = np.argsort(zeta, kind="stable")  # Alg. 2 line 10: increasing zeta
        if excess > 0:
            b[order[len(order) - excess :]] -= 1  # line 12: decrease the |ell'-ell| largest zeta
        else:
            b[order[:-excess]] += 1  # line 14: increase the |ell'-ell| smallest zeta
    return b


def lattice_quantize_reference(q: list[float] | np.ndarray, ell: int) -> list[int]:
    """Plain loop transcription of Alg. 2 (same tie-breaking as lattice_quantize)."""
    s = math.fsum(float(x) for x in q)
    qs = [float(x) / s for x in q]
    b = [int(np.floor(ell * x + 0.5)) for x in qs]
    ell_prime = sum(b)
    if ell_prime != ell:
        zeta = [b[i] - ell * qs[i] for i in range(len(b))]
        order = sorted(range(len(b)), key=lambda i: (zeta[i], i))
        n = abs(ell_prime - ell)
        chosen = order[len(order) - n :] if ell_prime > ell else order[:n]
        for i in chosen:
            b[i] += -1 if ell_prime > ell else 1
    return b
