"""The host side of the ONNX target's row attention (converters/onnx_target_rows.py): from a
pass's boolean mask, the indices, key counts and mask GroupQueryAttention reads.

A window of up to ROW_MAX tokens over a past runs as rows (one batch row a token, each over the
keys its mask allows, gathered in column order), so that every token goes through the same
one-token kernel path whether a pass verifies one token or a tree of them: at int8 activations
(MatMulNBits accuracy level 4) that is what keeps sd, tree and mirror equal to ar token for
token. A prefill (no past) or a longer window runs as one window (GQA's multi-token path): ar
and the speculative methods make those same calls, so they stay equal too.
"""

from __future__ import annotations

import numpy as np

from runtime.errors import DuetError

ROW_MAX = 64  # a pass of up to this many tokens over a past runs as rows (a tree fits)


def use_rows(past: int, window: int) -> bool:
    return past > 0 and window <= ROW_MAX


def row_feed(mask: np.ndarray, kv_heads: int, rows: bool) -> tuple:
    """(kv_index (R, KV, L) int64, seqlens_k (R,) int32, gqa_mask (R, T', total) bool) for a
    (B, T, S) mask whose last T columns are the window's (causal with holes: a token never sees
    a later column, always its own)."""
    B, T, S = mask.shape
    P = S - T
    base = (np.arange(B)[:, None] * kv_heads + np.arange(kv_heads)[None, :]) * S  # (B, KV)
    if not rows:
        idx = base[:, :, None] + np.arange(P)[None, None, :]
        return idx.astype(np.int64), np.full(B, S - 1, np.int32), mask
    own = P + np.arange(T)
    cols = np.arange(S)
    if (
        not mask[:, np.arange(T), own].all()
        or (mask & (cols[None, None, :] > own[None, :, None])).any()
    ):
        raise DuetError("ONNX target: a mask row must see its own token and no later one")
    before = mask & (cols[None, None, :] < own[None, :, None])  # (B, T, S)
    counts = before.sum(-1).reshape(-1)  # (R,)
    L = int(counts.max()) + 1  # + its own key: the buffer is the row's present (shared in place)
    # each row's allowed columns first, in order, then padding (never read: seqlens_k stops it)
    order = np.argsort(~before, axis=-1, kind="stable")[..., :L].reshape(B * T, L)
    idx = base.repeat(T, axis=0)[:, :, None] + order[:, None, :]
    return (idx.astype(np.int64), counts.astype(np.int32),
            np.ones((B * T, 1, L), bool))  # fmt: skip
