"""`raw` codec: the ids (as in `ids`) followed by the draft's full q rows, float32, so the server
can run lossless rejection sampling at T > 0 with exactly the law each token was drawn from
(the residual max(p − q, 0) needs all of q). float32, not float16: the draft samples from the
float32 rows, and a rounded q would make the acceptance test use a different law.

Body: the `ids` body, then K × V float32 little-endian (row i is q_i, the law of d_i).
"""

from __future__ import annotations

import numpy as np

from runtime.edge.codecs import Draft
from runtime.edge.codecs.ids import bits_for, pack_ids, unpack_ids
from runtime.edge.wire import E_MALFORMED, ProtocolError, Reader

NAME = "raw"
NUMBER = 2
CARRIES_Q = True
FIXED_ROWS = True  # K x V float32 whatever q is


def params(vocab: int) -> dict:
    """What a bundle records of this codec: bits per id and the q rows' element type."""
    return {"bits_per_id": bits_for(vocab), "q_dtype": "float32", "q_row_bytes": 4 * vocab}


def encode(tokens, q, vocab: int) -> bytes:
    """ids + q (K, V) as float32."""
    q = np.asarray(q, dtype="<f4")
    assert q.shape == (len(tokens), vocab), (q.shape, len(tokens), vocab)
    return pack_ids(tokens, vocab) + q.tobytes()


def decode(body: bytes, vocab: int) -> Draft:
    """Parse a body; the q rows must be finite, non-negative, and each sum to 1 (±1e-3)."""
    r = Reader(body, "raw payload")
    toks = unpack_ids(r, vocab)
    k = len(toks)
    q = np.frombuffer(r.take(4 * k * vocab), dtype="<f4").reshape(k, vocab).astype(np.float32)
    r.end()
    if k and (not np.isfinite(q).all() or (q < 0).any() or np.abs(q.sum(1) - 1).max() > 1e-3):
        raise ProtocolError(E_MALFORMED, "raw payload: q rows must be probability vectors")
    return Draft(toks, q)
