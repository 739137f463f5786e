"""`cu-hlm` codec: CU-HLM's compressed vocabulary: top-k ids with 8-bit probabilities, the
rest spread uniformly (eq. 15).

Parameters: `k` (top-k sent) and `levels`, what the 8 bits mean: "log" (2^(-16 v / 255), payload
version 3; the default) or "linear" (v / 255, version 1, as older clients send). Its body is
kernels/payload_cuhlm.py's payload, wrapped by runtime/edge/codecs/lossy.py.
"""

from __future__ import annotations

from kernels import payload_cuhlm
from runtime.edge.codecs.lossy import lossy_codec

NAME = "cu-hlm"
NUMBER = 5
CARRIES_Q = True
# log levels, k = 256: on the embedded pair at T = 1 (876 positions, raw acceptance 0.736) linear
# levels cap expected acceptance at 0.652 (k = 128; most top-k p are below 1/255), log levels
# reach 0.705 (0.958x raw) at k = 256 in 20 bits per id (3.9 % of raw's 32 V bits)
# (`python -m apps.bench.studies.uplink_codecs --limit 6 --temps 1.0 --cu-k K [--cu-levels linear]`)
DEFAULTS = {"k": 256, "levels": "log"}
encoder, decode = lossy_codec(NAME, payload_cuhlm.CU_HLM, DEFAULTS)
