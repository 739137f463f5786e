"""MLX twin of kernels/sampling.py: same functions, same uniforms, same tokens."""

from __future__ import annotations

import mlx.core as mx


def probs_from_logits(
    logits: mx.array, temp: float = 1.0, top_p: float = 1.0, top_k: int = 0
) -> mx.array:
    """See kernels.sampling.probs_from_logits (the rule is identical)."""
    x = logits.astype(mx.float32)
    V = x.shape[-1]
    if temp == 0:
        return (mx.arange(V) == mx.argmax(x, -1, keepdims=True)).astype(mx.float32)
    z = x / temp
    if top_k and top_k < V:
        kth = mx.sort(z, axis=-1)[..., -top_k][..., None]
        z = mx.where(z >= kth, z, -mx.inf)
    p = mx.softmax(z, axis=-1)
    if top_p < 1.0:
        order = mx.argsort(-p, axis=-1)
        sp = mx.take_along_axis(p, order, -1)
        before = mx.cumsum(sp, -1) - sp
        keep_sorted = before < top_p
        inv = mx.argsort(order, axis=-1)
        keep = mx.take_along_axis(keep_sorted, inv, -1)
        p = mx.where(keep, p, 0.0)
        p = p / p.sum(-1, keepdims=True)
    return p


def sample(probs: mx.array, u) -> mx.array:
    """See kernels.sampling.sample."""
    c = mx.cumsum(probs.astype(mx.float32), -1)
    t = mx.array(u, dtype=mx.float32)[..., None] * c[..., -1:]
    idx = (c <= t).astype(mx.int32).sum(-1)
    return mx.minimum(idx, probs.shape[-1] - 1)
