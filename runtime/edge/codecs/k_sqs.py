"""`k-sqs` codec: K-SQS: top-K support (SQS §2) at lattice resolution ell (App. A.1).

Its body is kernels/payload_sqs.py's payload, wrapped by runtime/edge/codecs/lossy.py (which
says why the target's law is kept exactly).
"""

from __future__ import annotations

from kernels import payload_sqs
from runtime.edge.codecs.lossy import lossy_codec

NAME = "k-sqs"
NUMBER = 3
CARRIES_Q = True
DEFAULTS = {"k": 512, "ell": 4000}  # apps.bench.studies.uplink_codecs: <= 5 % of raw at T = 1
encoder, decode = lossy_codec(NAME, payload_sqs.K_SQS, DEFAULTS)
