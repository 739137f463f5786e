"""`cu-hlm` codec: CU-HLM's compressed vocabulary: top-k ids with 8-bit probabilities, the rest spread uniformly (eq. 15).

Parameters: `k` (top-k sent) and `levels`, what the 8 bits mean: "log" (2^(-16 v / 255), payload
version 3; the default) or "linear" (v / 255, version 1, as older clients send).

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
# log levels, k = 256: on the embedded pair at T = 1 (876 positions, raw acceptance 0.736) linear
# levels cap expected acceptance at 0.652 (k = 128; most top-k p are below 1/255), log levels
# reach 0.705 (0.958x raw) at k = 256 in 20 bits per id (3.9 % of raw's 32 V bits)
# (`python -m apps.bench.studies.uplink_codecs --limit 6 --temps 1.0 --cu-k K [--cu-levels linear]`)
DEFAULTS = {"k": 256, "levels": "log"}


def encoder(vocab: int, **params) -> Encoder:
    """A session's coder with these parameters (DEFAULTS for the rest)."""
    return Encoder(NAME, vocab, **{**DEFAULTS, **params})


def decode(body: bytes, vocab: int) -> Draft:
    """Tokens and q̂; ProtocolError(E_MALFORMED) on anything the kernel decoder refuses."""
    return decode_payload(body, vocab, payload_cuhlm.CU_HLM, NAME)
