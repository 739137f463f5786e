"""Byte payload of CU-HLM's compressed uplink: top-k ids and 8-bit probabilities per token.

Layout, big-endian:

    header  u8 codec (3), u8 version (1-4), u16 L, u32 V, u32 body bit length, u8 b_prob (8)
    body    per row, packed MSB first (kernels/bitio.py), zero-padded to a byte:
            [skip flag             1 bit, versions 2 and 4 only]
            k - 1                  ceil(log2 (V-1)) bits
            k ids                  ceil(log2 V) bits each   (b_index, CU-HLM eq. 4)
            k levels               8 bits each              (b_prob = 8, §V-A)
            the draft token's id   ceil(log2 V) bits

The version byte names what the 8-bit levels mean and whether rows carry a skip flag:

    version  levels                                              skip flag
    1        linear: p = v / 255, the levels sum to <= 255        no
    2        linear                                              yes
    3        log: p = 2^(-v * 16 / 255) for v < 255, v = 255 no mass; the p sum to <= 1
             (up to LOG_SUM_TOL for float rounding)               no
    4        log                                                 yes

The skip flag (only when some row is skipped) comes before each row: 0 = the row above,
1 = a skipped row (CU-HLM eq. 10, delta(t) = 0), which is the token's id alone: the edge
accepted it without verification, and the verifier must commit it as is (lossy; the "index
exchange" that keeps both sides' sequences aligned, CU-HLM §III-B). A payload with no
skipped row has no flags. Versions 1 and 2 are byte for byte those of older clients, which
still decode.

The receiver rebuilds x^ by eq. (15) (kernels/cuhlm.py `reconstruct`); the draft
token was sampled from that same x^, so verification is exact. The k(b_prob +
b_index) part is eq. (4) with |V| replaced by k. `decode` refuses inconsistent
input (wrong codec, version or V, lying bit length, k out of range, repeated ids, levels
summing past 1, a token with no mass) with `MalformedPayload`.

What it is not: the choice of k or of skipping (kernels/cuhlm.py).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from kernels.bitio import BitReader, BitWriter, MalformedPayload
from kernels.cuhlm import LEVELS, PROB_BITS, PROB_LEVELS, dequantize, reconstruct
from kernels.enumerative import bits_for

VERSION = 1  # linear levels v / 255
VERSION_SKIP = 2  # linear levels; a flag bit per row, skipped rows carry only the token id
VERSION_LOG = 3  # log levels 2^(-16 v / 255)
VERSION_LOG_SKIP = 4  # log levels with the flag bit per row
# version -> (levels, flag bit per row)
VERSIONS = {VERSION: ("linear", False), VERSION_SKIP: ("linear", True),
            VERSION_LOG: ("log", False), VERSION_LOG_SKIP: ("log", True)}  # fmt: skip
LOG_SUM_TOL = 1e-9  # log levels: the sent p may sum past 1 by float rounding, never by more
CU_HLM = 3
_HEAD = struct.Struct(">BBHIIB")  # codec, version, L, V, body bits, b_prob


@dataclass(frozen=True)
class CuRow:
    """One compressed row: top-k ids (most likely first) and their 8-bit levels, whose meaning
    `scale` names ("linear": v / 255; "log": 2^(-16 v / 255), 255 no mass)."""

    ids: np.ndarray
    levels: np.ndarray
    scale: str = "linear"


def row_bits(v: int, k: int) -> int:
    """Bits of one row: the k field, eq. (4)'s k (b_prob + b_index), and the token id."""
    return bits_for(v - 1) + k * (PROB_BITS + bits_for(v)) + bits_for(v)  # eq. (4) with k for |V|


def body_bits(rows: list[CuRow | None], v: int) -> int:
    """The payload body's exact bit length (before byte padding); None rows are skipped ones."""
    if all(r is not None for r in rows):
        return sum(row_bits(v, len(r.ids)) for r in rows)
    return sum(1 + (bits_for(v) if r is None else row_bits(v, len(r.ids))) for r in rows)


HEADER_BYTES = _HEAD.size


def qhat_rows(rows: list[CuRow | None], v: int, tokens=None) -> np.ndarray:
    """(L, V) float32: each row's x^ of eq. (15); a skipped (None) row, which carries no q, gets
    the one-hot of its token (a placeholder the verifier never tests: it commits that row)."""
    if not rows:
        return np.zeros((0, v), np.float32)
    out = []
    for n, r in enumerate(rows):
        if r is None:
            row = np.zeros(v, np.float32)
            row[int(tokens[n])] = 1.0
            out.append(row)
        else:
            out.append(reconstruct(r.ids, r.levels, v, r.scale))
    return np.stack(out)


def _check_row(
    ids: np.ndarray, levels: np.ndarray, v: int, err: type[ValueError], n: int, scale: str
) -> None:
    k = len(ids)
    if not 1 <= k <= v - 1 or len(levels) != k:
        raise err(f"row {n}: k = {k} outside [1, V-1] or {len(levels)} levels")
    if ids.min() < 0 or ids.max() >= v or len(np.unique(ids)) != k:
        raise err(f"row {n}: ids must be {k} distinct values in [0, {v})")
    if levels.min() < 0 or levels.max() > PROB_LEVELS:
        raise err(f"row {n}: levels must be in [0, {PROB_LEVELS}] (b_prob = {PROB_BITS})")
    if scale == "linear" and int(np.sum(levels, dtype=np.int64)) > PROB_LEVELS:
        raise err(f"row {n}: probabilities sum past 1")
    if scale == "log" and math.fsum(dequantize(levels, "log").tolist()) > 1.0 + LOG_SUM_TOL:
        raise err(f"row {n}: probabilities sum past 1 (log levels, tolerance {LOG_SUM_TOL})")


def encode(rows: list[CuRow | None], tokens: np.ndarray, v: int) -> bytes:
    """Bytes for a batch of compressed rows, all in one scale (None: a skipped row, which adds
    the flag bits, version 2 or 4); ValueError on invalid rows or a token without mass."""
    tokens = np.asarray(tokens, np.int64)
    if len(tokens) != len(rows) or len(rows) > 0xFFFF or not 2 <= v <= 0xFFFFFFFF:
        raise ValueError(f"need one token per row, at most 65535 rows and V >= 2 (V = {v})")
    scales = {r.scale for r in rows if r is not None}
    if len(scales) > 1 or not scales <= set(LEVELS):
        raise ValueError(f"rows must share one scale of {', '.join(LEVELS)} (got {scales})")
    scale = scales.pop() if scales else "linear"
    flags = any(r is None for r in rows)
    w = BitWriter()
    for n, (r, tok) in enumerate(zip(rows, tokens, strict=True)):
        if flags:
            w.write(int(r is None), 1)  # version 2: the skip flag
        if r is None:
            if not 0 <= tok < v:
                raise ValueError(f"row {n}: token {tok} outside [0, {v})")
            w.write(int(tok), bits_for(v))
            continue
        ids, lv = np.asarray(r.ids, np.int64), np.asarray(r.levels, np.int64)
        _check_row(ids, lv, v, ValueError, n, scale)
        if not 0 <= tok < v or reconstruct(ids, lv, v, scale)[tok] <= 0:
            raise ValueError(f"row {n}: token {tok} has no mass in x^: sample the token from x^")
        w.write(len(ids) - 1, bits_for(v - 1))
        w.write_array(ids, bits_for(v))  # b_index = ceil(log2 V) (eq. 4)
        w.write_array(lv, PROB_BITS)  # b_prob = 8 (CU-HLM §V-A)
        w.write(int(tok), bits_for(v))
    version = next(n for n, vs in VERSIONS.items() if vs == (scale, flags))
    return _HEAD.pack(CU_HLM, version, len(rows), v, w.nbits, PROB_BITS) + w.getvalue()


def decode(
    data: bytes, v: int, max_rows: int = 128
) -> tuple[np.ndarray, np.ndarray, list[CuRow | None]]:
    """Tokens (L,), x^ rows (L, V) float32 and the coded rows (None: skipped, to be committed
    unverified), from a CU-HLM payload."""
    if len(data) < _HEAD.size:
        raise MalformedPayload(f"payload of {len(data)} bytes is shorter than its header")
    codec, version, n_rows, v_sent, nbits, pbits = _HEAD.unpack_from(data)
    if codec != CU_HLM or version not in VERSIONS or pbits != PROB_BITS:
        raise MalformedPayload(
            f"not a CU-HLM payload (codec {codec}, version {version}, b_prob {pbits})"
        )
    if v_sent != v or v < 2:
        raise MalformedPayload(f"payload is for a vocabulary of {v_sent}, this verifier has {v}")
    if n_rows > max_rows:  # the dense (L, V) output is the verifier's memory: bound it
        raise MalformedPayload(f"{n_rows} rows exceed this verifier's limit of {max_rows}")
    r = BitReader(data[_HEAD.size :], nbits)
    rows, tokens = [], np.zeros(n_rows, np.int64)
    bi = bits_for(v)
    scale, flags = VERSIONS[version]
    for n in range(n_rows):
        if flags and r.read(1):  # a skipped row: the token id alone
            tok = r.read(bi)
            if tok >= v:
                raise MalformedPayload(f"row {n}: skipped token {tok} outside [0, {v})")
            rows.append(None)
            tokens[n] = tok
            continue
        k = r.read(bits_for(v - 1)) + 1
        if k * (bi + PROB_BITS) > r.remaining:  # refuse before reading k fields
            raise MalformedPayload(f"row {n}: k = {k} does not fit in the {r.remaining} bits left")
        ids = r.read_array(k, bi)
        lv = r.read_array(k, PROB_BITS)
        _check_row(ids, lv, v, MalformedPayload, n, scale)
        tok = r.read(bi)
        x_hat = reconstruct(ids, lv, v, scale) if tok < v else None
        if x_hat is None or x_hat[tok] <= 0:
            raise MalformedPayload(f"row {n}: the draft token has no mass in x^")
        rows.append(CuRow(ids, lv.astype(np.uint8), scale))
        tokens[n] = tok
    r.expect_end()
    return tokens, qhat_rows(rows, v, tokens), rows
