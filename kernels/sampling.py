"""Sampling as pure functions (NumPy reference).

Randomness is explicit: callers draw uniforms from their own
`np.random.Generator` and pass them in, so the NumPy and MLX twins
(kernels/sampling_mlx.py) give identical tokens for identical uniforms.
Temperature 0 means greedy: the distribution is one-hot on the argmax.
"""

from __future__ import annotations

import numpy as np


def probs_from_logits(
    logits: np.ndarray, temp: float = 1.0, top_p: float = 1.0, top_k: int = 0
) -> np.ndarray:
    """The distribution a token is sampled from: softmax(logits / temp), top-k then top-p filtered.

    logits (..., V) -> float32 probabilities (..., V) summing to 1 on the last axis.
    top_p keeps the smallest most-likely set whose mass reaches top_p (ties by index).
    temp == 0 gives the one-hot argmax (greedy).
    """
    x = np.asarray(logits, dtype=np.float32)
    if temp == 0:
        one_hot = np.zeros(x.shape, np.float32)
        np.put_along_axis(one_hot, x.argmax(-1)[..., None], 1.0, -1)
        return one_hot
    z = x / np.float32(temp)
    if top_k and top_k < x.shape[-1]:
        kth = np.sort(z, axis=-1)[..., -top_k][..., None]
        z = np.where(z >= kth, z, -np.inf)
    z = z - z.max(-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(-1, keepdims=True)
    if top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sp = np.take_along_axis(p, order, -1)
        before = np.cumsum(sp, -1) - sp  # mass strictly before each sorted token
        keep_sorted = before < np.float32(top_p)
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, -1)
        p = np.where(keep, p, 0.0).astype(np.float32)
        p /= p.sum(-1, keepdims=True)
    return p.astype(np.float32)


def log_probs_from_logits(
    logits: np.ndarray, temp: float = 1.0, top_p: float = 1.0, top_k: int = 0
) -> np.ndarray:
    """log probs_from_logits(...) (-inf where filtered), for temp > 0. Without top-k or top-p,
    the log-softmax of logits / temp: one exp pass, where a softmax then a log costs three
    (8.0 against 2.8 ms for six rows at V = 151,936 on this CPU)."""
    if temp == 0:
        raise ValueError("log_probs_from_logits is for sampling (temp > 0)")
    x = np.asarray(logits, dtype=np.float32)
    if top_p < 1.0 or (top_k and top_k < x.shape[-1]):
        with np.errstate(divide="ignore"):
            return np.log(probs_from_logits(x, temp, top_p, top_k))
    z = x / np.float32(temp)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def sample_gumbel(probs: np.ndarray, gumbel: np.ndarray) -> int:
    """Gumbel-max sample: argmax over the tokens of nonzero mass of log p(x) + g(x).

    probs (V,), gumbel (V,) i.i.d. standard Gumbel noise. With fresh noise the result is an
    exact draw from norm(probs) (the Gumbel-max trick); a caller that knows the noise in
    advance can predict the draw from a close proxy of probs (runtime/mirror/coupled.py).
    """
    p = np.asarray(probs, dtype=np.float64)
    with np.errstate(divide="ignore"):
        score = np.where(p > 0, np.log(p) + np.asarray(gumbel, np.float64), -np.inf)
    return int(np.argmax(score))


def sample(probs: np.ndarray, u: np.ndarray | float) -> np.ndarray:
    """Inverse-CDF sample: the first index whose cumulative mass exceeds u * total.

    probs (..., V), u uniform in [0, 1) with shape (...). Returns int64 (...).
    Zero-probability tokens are never chosen.
    """
    p = np.asarray(probs, dtype=np.float32)
    c = np.cumsum(p, -1)
    t = np.asarray(u, dtype=np.float32)[..., None] * c[..., -1:]
    idx = (c <= t).sum(-1)
    return np.minimum(idx, p.shape[-1] - 1).astype(np.int64)
