"""`cu-hlm` codec: CU-HLM's compressed vocabulary: top-k ids with 8-bit probabilities, the rest spread uniformly (eq. 15).

The body is kernels/payload_cuhlm.py's payload as is; the edge draws each draft token from the
decoded q̂ (`encoder(...).draft_law`), and the server verifies with that same q̂, so the
target's law is kept exactly (SQS §2). See runtime/edge/codecs/lossy.py for the wrapper.
"""

from __future__ import annotations

from kernels import payload_cuhlm
from runtime.edge.codecs import Draft
from runtime.edge.codecs.lossy import Encoder, decode_payload

NAME = "cu-hlm"
NUMBER = 5
CARRIES_Q = True
# k = 128: the best expected acceptance at T = 1 on the embedded pair (0.652 vs 0.646 at 256,
# 0.634 at 48, 0.582 at 16; raw 0.736) in 2.0 % of raw bits: 8-bit probabilities cap it, not k
# (`python -m apps.bench.codecs --limit 6 --temps 1.0 --cu-k K`)
DEFAULTS = {"k": 128}


def encoder(vocab: int, **params) -> Encoder:
    """A session's coder with these parameters (DEFAULTS for the rest)."""
    return Encoder(NAME, vocab, **{**DEFAULTS, **params})


def decode(body: bytes, vocab: int) -> Draft:
    """Tokens and q̂; ProtocolError(E_MALFORMED) on anything the kernel decoder refuses."""
    return decode_payload(body, vocab, payload_cuhlm.CU_HLM, NAME)
