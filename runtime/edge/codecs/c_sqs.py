"""`c-sqs` codec: C-SQS: support {q >= beta} (eq. 6) with beta moved by the conformal rule
(eq. 8, Alg. 1).

Its body is kernels/payload_sqs.py's payload, wrapped by runtime/edge/codecs/lossy.py (which
says why the target's law is kept exactly).
"""

from __future__ import annotations

from kernels import payload_sqs
from runtime.edge.codecs.lossy import lossy_codec

NAME = "c-sqs"
NUMBER = 4
CARRIES_Q = True
DEFAULTS = {"ell": 4000, "alpha": 0.05, "eta": 0.01, "beta": 0.01}  # bench-tuned
encoder, decode = lossy_codec(NAME, payload_sqs.C_SQS, DEFAULTS)
