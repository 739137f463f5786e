"""Multi-stream attention layout for a speculative-streaming (SS) pass (NumPy, pure).

Mirror-SD §3.2 / Bhendawade et al. 2024: one forward pass holds T main-stream tokens and,
for each of P of them (the "owners", increasing indices), n lookahead streams. Stream j at
main position p predicts the token j steps beyond p's next token. The new columns are laid
out main first, then streams owner-major: column T + k * n + (j - 1) for the k-th owner.
Putting every main column first means dropping the stream columns after the pass is a plain
trim of the cache.

Stream (p, j) stands at position pos[p] + j (the place of the token before the one it
predicts) and attends to what main p attends to (the verified prefix and p itself) and to
streams (p, 1..j); main tokens never see a stream. This module knows nothing of models.
"""

from __future__ import annotations

import numpy as np


def stream_positions(positions: np.ndarray, n: int, owners) -> np.ndarray:
    """int64 (B, T + P*n): the main positions then pos[p] + j for each owner p, j = 1..n."""
    pos = np.asarray(positions, dtype=np.int64)
    at = pos[:, np.asarray(owners, dtype=np.int64)]  # (B, P)
    streams = at[:, :, None] + np.arange(1, n + 1)[None, None, :]  # (B, P, n)
    return np.concatenate([pos, streams.reshape(pos.shape[0], -1)], axis=1)


def multi_stream_mask(main_mask: np.ndarray, n: int, owners) -> np.ndarray:
    """bool (B, T + P*n, S + P*n) from the main tokens' mask (B, T, S), S = offset + T.

    Rows/columns past the main ones are the streams of the main positions `owners`."""
    m = np.asarray(main_mask, dtype=bool)
    own_idx = np.asarray(owners, dtype=np.int64)
    B, T, S = m.shape
    P = len(own_idx)
    out = np.zeros((B, T + P * n, S + P * n), dtype=bool)
    out[:, :T, :S] = m  # main stream: only the prefix (never a stream)
    own = np.tril(np.ones((n, n), dtype=bool))  # stream j sees streams 1..j of its position
    for k in range(P):
        rows = slice(T + k * n, T + (k + 1) * n)
        out[:, rows, :S] = m[:, own_idx[k]][:, None, :]  # what main p sees (prefix and p)
        out[:, rows, S + k * n : S + (k + 1) * n] = own
    return out
