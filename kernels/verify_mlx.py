"""MLX twin of kernels/verify.py, for verifying on the target's device.

The rules, inputs and outputs are those of kernels.verify; only the array
library differs. One host sync at the end returns plain ints.
"""

from __future__ import annotations

import mlx.core as mx

from kernels.sampling_mlx import sample


def verify_greedy(target_logits: mx.array, draft_tokens: mx.array) -> tuple[int, int]:
    """Accept d_i while d_i == argmax p_i; c = argmax p_A (see kernels.verify.verify_greedy)."""
    best = mx.argmax(target_logits, -1)
    g = draft_tokens.shape[0]
    match = (best[:g] == draft_tokens).astype(mx.int32)
    a = int(mx.cumprod(match).sum().item())  # length of the all-match prefix
    return a, int(best[a].item())


def verify_sampling(
    p: mx.array, q: mx.array, draft_tokens: mx.array, u_accept, u_resample: float
) -> tuple[int, int]:
    """Accept iff u_i < p_i(d_i)/q_i(d_i); residual or bonus resampling (see kernels.verify)."""
    p, q = p.astype(mx.float32), q.astype(mx.float32)
    g = draft_tokens.shape[0]
    rows = mx.arange(g)
    pd, qd = p[rows, draft_tokens], q[rows, draft_tokens]
    ok = (mx.array(u_accept, dtype=mx.float32) * qd < pd).astype(mx.int32)
    a = int(mx.cumprod(ok).sum().item())
    if a == g:
        return g, int(sample(p[g], u_resample).item())
    residual = mx.maximum(p[a] - q[a], 0.0)
    if residual.sum().item() <= 0:
        residual = p[a]
    return a, int(sample(residual, u_resample).item())
