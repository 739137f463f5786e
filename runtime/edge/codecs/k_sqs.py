"""`k-sqs` codec: K-SQS: top-K support (SQS §2) at lattice resolution ell (App. A.1).

The body is kernels/payload_sqs.py's payload as is; the edge draws each draft token from the
decoded q̂ (`encoder(...).draft_law`), and the server verifies with that same q̂, so the
target's law is kept exactly (SQS §2). See runtime/edge/codecs/lossy.py for the wrapper.
"""

from __future__ import annotations

from kernels import payload_sqs
from runtime.edge.codecs import Draft
from runtime.edge.codecs.lossy import Encoder, decode_payload

NAME = "k-sqs"
NUMBER = 3
CARRIES_Q = True
DEFAULTS = {"k": 512, "ell": 4000}  # apps.bench.studies.uplink_codecs: <= 5 % of raw at T = 1


def encoder(vocab: int, **params) -> Encoder:
    """A session's coder with these parameters (DEFAULTS for the rest)."""
    return Encoder(NAME, vocab, **{**DEFAULTS, **params})


def decode(body: bytes, vocab: int) -> Draft:
    """Tokens and q̂; ProtocolError(E_MALFORMED) on anything the kernel decoder refuses."""
    return decode_payload(body, vocab, payload_sqs.K_SQS, NAME)
