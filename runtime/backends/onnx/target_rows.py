"""The host side of the ONNX target's row attention (converters/onnx_target_rows.py; the recipe's
attention "rows", runtime/backends/onnx/target.py): from a pass's boolean mask, the indices,
key counts and mask GroupQueryAttention reads.

Every pass runs as rows (one batch row a token, each over the keys its mask allows, gathered in
column order), so that every token goes through the same one-query kernel path whether a pass
prefills a prompt, verifies one token or a tree of them: at int8 activations (MatMulNBits
accuracy level 4) that is what keeps sd, tree and mirror equal to ar token for token. A prefill
too: sd's first pass is the prompt and the first drafts in one window, whose drafts ar runs one
by one. GroupQueryAttention's window path (several queries in one batch row) is never taken: it
sums in another order than the one-query path, and it cannot take a batch of rows over a past.
The cost is the gather: a row copies the keys it sees, so a pass of T tokens over P copies about
T (P + T / 2) keys a layer (a long prefill runs in chunks of rows, ROW_KEYS cells a run).
"""

from __future__ import annotations

import numpy as np

from runtime.errors import DuetError

ROW_KEYS = 1 << 16  # rows x keys gathered in one run: a long prefill runs in chunks of rows
ROW_CHUNK = 64  # at most this many rows a run


def chunk_rows(past: int, window: int) -> int:
    """How many of a pass's tokens one graph run takes (the rest follow, run by run)."""
    return max(1, min(ROW_CHUNK, ROW_KEYS // (past + window)))


def row_feed(mask: np.ndarray, kv_heads: int) -> tuple:
    """(kv_index (R, KV, L) int64, seqlens_k (R,) int32, gqa_mask (R, 1, L) bool) for a (B, T, S)
    mask whose last T columns are the window's (causal with holes: a token never sees a later
    column, always its own); R = B T rows of one token."""
    B, T, S = mask.shape
    P = S - T
    base = (np.arange(B)[:, None] * kv_heads + np.arange(kv_heads)[None, :]) * S  # (B, KV)
    own = P + np.arange(T)
    cols = np.arange(S)
    if not mask[:, np.arange(T), own].all() or (mask & (cols > own[:, None])).any():
        raise DuetError("ONNX target: a mask row must see its own token and no later one")
    before = mask & (cols < own[:, None])  # (B, T, S)
    counts = before.sum(-1).reshape(-1)  # (R,)
    L = int(counts.max()) + 1  # + its own key: the buffer is as long as the row's present
    # each row's allowed columns first, in order, then padding (never read: seqlens_k stops it)
    order = np.argsort(~before, axis=-1, kind="stable")[..., :L].reshape(B * T, L)
    idx = base.repeat(T, axis=0)[:, :, None] + order[:, None, :]
    return idx.astype(np.int64), counts.astype(np.int32), np.ones((B * T, 1, L), bool)
