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
DEFAULTS = {"k": 256}  # 256 × (12 + 8) bits < 5 % of raw at V = 4096


def encoder(vocab: int, **params) -> Encoder:
    """A session's coder with these parameters (DEFAULTS for the rest)."""
    return Encoder(NAME, vocab, **{**DEFAULTS, **params})


def decode(body: bytes, vocab: int) -> Draft:
    """Tokens and q̂; ProtocolError(E_MALFORMED) on anything the kernel decoder refuses."""
    return decode_payload(body, vocab, payload_cuhlm.CU_HLM, NAME)
