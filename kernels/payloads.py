"""The compressed-uplink codecs behind one table: name -> codec, and decode by the payload's
first byte.

Every codec has the same shape, so wiring one into a wire format is one entry:

    codec = make_codec("c-sqs", ell=100, alpha=5e-4, eta=1e-3, beta=0.01)
    rows = codec.quantize(q)                 # (L, V) draft distributions -> coded rows
    q_hat = codec.qhat(rows, V)              # what the draft samples its tokens from
    data = codec.encode(rows, tokens, V)     # bytes; len(data) == header + ceil(body_bits / 8)
    tokens, q_hat = decode(data, V)          # the server side; MalformedPayload on bad input

`quantize` is where a codec's state lives (C-SQS's threshold moves with every
row; call `codec.threshold.verdict(...)` after the cloud answers). Lossless
when tokens are drawn from `qhat` and the verifier uses the decoded q^.

What it is not: the frame, the session or the link; those wrap these bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from kernels import cuhlm, payload_cuhlm, payload_sqs, sqs
from kernels.bitio import MalformedPayload


class _Sqs:
    """What K-SQS and C-SQS share: each row's probabilities on the lattice of resolution
    `ell` (App. A.1) over its support; a codec names the support (`support(row)`) and whether
    its rows' sizes vary (VARIABLE_K: the payload then carries each row's K)."""

    VARIABLE_K: ClassVar[bool] = False
    ell: int

    def support(self, row: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def quantize(self, q: np.ndarray) -> list[payload_sqs.SqsRow]:
        """One row per draft distribution, in drafting order: its support's ids and their
        Alg. 2 counts."""
        out = []
        for row in np.atleast_2d(q):
            ids = self.support(row)
            out.append(payload_sqs.SqsRow(ids, sqs.quantize_on_support(row, ids, self.ell)))
        return out

    def qhat(self, rows, v: int) -> np.ndarray:
        """(L, V) float32 q^ of the rows: what the draft samples from and the verifier uses."""
        return payload_sqs.qhat_rows(rows, self.ell, v)

    def encode(self, rows, tokens, v: int) -> bytes:
        """The payload bytes (kernels/payload_sqs.py) of rows and the tokens drawn from their q^."""
        return payload_sqs.encode(rows, tokens, v, self.ell, variable_k=self.VARIABLE_K)

    def body_bits(self, rows, v: int) -> int:
        """The bit model: sum over rows of eq. (1) + the token's id and count (before padding)."""
        return payload_sqs.body_bits(rows, v, self.ell, variable_k=self.VARIABLE_K)

    def header_bytes(self) -> int:
        """Bytes before the body."""
        return payload_sqs.header_bytes(variable_k=self.VARIABLE_K)


@dataclass
class KSqs(_Sqs):
    """K-SQS: top-K support (SQS §2), lattice resolution ell (App. A.1)."""

    k: int = 8
    ell: int = 100
    name: str = "k-sqs"

    def support(self, row: np.ndarray) -> np.ndarray:
        return sqs.topk_support(row, min(self.k, row.size))


@dataclass
class CSqs(_Sqs):
    """C-SQS: support {q >= beta} (eq. 6) with beta moved online (eq. 8, Alg. 1); each row
    moves beta, so rows are quantized in drafting order."""

    VARIABLE_K: ClassVar[bool] = True
    ell: int = 100
    alpha: float = 5e-4  # SQS §4's values
    eta: float = 1e-3
    beta: float = 0.01
    name: str = "c-sqs"
    threshold: sqs.ConformalThreshold = field(init=False)

    def __post_init__(self) -> None:
        self.threshold = sqs.ConformalThreshold(self.alpha, self.eta, self.beta)

    def support(self, row: np.ndarray) -> np.ndarray:
        return self.threshold.support(row)


@dataclass
class CuHlm:
    """CU-HLM's compressed transmission: top-k with 8-bit probabilities, eq. (15) at the receiver.

    `levels` is what the 8 bits mean (kernels/cuhlm.py): "log" (default; 2^(-16 v / 255), payload
    version 3) or "linear" (v / 255, version 1, what older clients send). k is fixed (the
    offline k*, eq. 21) unless `ks` is given per call (the online k(t)*, eq. 24).
    The online rule needs a draft token and its uncertainty before x^ exists: use a
    provisional d0 ~ x for them, then draw the sent token afresh from `qhat` (not with
    d0's uniform), so the token's law given x^ is x^ and verification stays exact.
    """

    k: int = 32
    levels: str = "log"
    name: str = "cu-hlm"

    def __post_init__(self) -> None:
        if self.levels not in cuhlm.LEVELS:
            raise ValueError(
                f"cu-hlm levels must be one of {', '.join(cuhlm.LEVELS)}, got {self.levels!r}"
            )

    def quantize(self, q: np.ndarray, ks: list[int] | None = None) -> list[payload_cuhlm.CuRow]:
        """One row per draft distribution: top-k ids, most likely first, and their 8-bit levels."""
        q = np.atleast_2d(q)
        ks = ks or [self.k] * len(q)
        out = []
        for row, k in zip(q, ks, strict=True):
            ids = cuhlm.topk_ids(row, min(k, row.size - 1))
            lv = cuhlm.quantize_levels(row[ids], self.levels)  # b_prob = 8 (CU-HLM §V-A)
            out.append(payload_cuhlm.CuRow(ids, lv, self.levels))
        return out

    def qhat(self, rows, v: int) -> np.ndarray:
        return payload_cuhlm.qhat_rows(rows, v)

    def encode(self, rows, tokens, v: int) -> bytes:
        return payload_cuhlm.encode(rows, tokens, v)

    def body_bits(self, rows, v: int) -> int:
        return payload_cuhlm.body_bits(rows, v)

    def header_bytes(self) -> int:
        return payload_cuhlm.HEADER_BYTES


CODECS = {"k-sqs": KSqs, "c-sqs": CSqs, "cu-hlm": CuHlm}
_DECODERS = {payload_sqs.K_SQS: payload_sqs.decode, payload_sqs.C_SQS: payload_sqs.decode}
_DECODERS[payload_cuhlm.CU_HLM] = payload_cuhlm.decode


def make_codec(name: str, **params):
    """A codec by name with its parameters; ValueError naming the choices for an unknown name."""
    if name not in CODECS:
        raise ValueError(f"unknown codec {name!r}; choose from {', '.join(CODECS)}")
    return CODECS[name](**params)


def decode(data: bytes, v: int, max_rows: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """Tokens (L,) and q^ rows (L, V) float32 from any codec's payload (dispatch on its first byte).

    More than `max_rows` rows is refused: q^ is dense, so L x V x 4 bytes is what a
    payload of a few bytes per row could otherwise make the verifier allocate.
    """
    tokens, q_hat, _ = decode_rows(data, v, max_rows)
    return tokens, q_hat


def decode_rows(data: bytes, v: int, max_rows: int = 128) -> tuple[np.ndarray, np.ndarray, list]:
    """As `decode`, plus the coded rows; a CU-HLM row that is None was skipped (eq. 10) and
    must be committed without verification."""
    if not data or data[0] not in _DECODERS:
        raise MalformedPayload(f"unknown payload codec byte {data[0] if data else None}")
    return _DECODERS[data[0]](bytes(data), v, max_rows)
