"""Byte payloads of SQS-SD's uplink: K-SQS and C-SQS rows as exact integer codes.

One payload carries a batch of L drafted tokens and the quantized distribution
q^ each was sampled from (SQS §2: the draft samples from q^, so the cloud's
rejection sampling with that same q^ keeps the target's law). Layout, big-endian:

    header  u8 codec (1 = k-sqs, 2 = c-sqs), u8 version (1), u16 L, u32 V,
            u32 body bit length, then k-sqs: u32 K, u16 ell | c-sqs: u16 ell
    body    per row, packed MSB first (kernels/bitio.py), zero-padded to a byte:
            [c-sqs only] K - 1            ceil(log2 V) bits          (§3)
            subset rank of the support    ceil(log2 C(V, K)) bits    (eq. 5)
            lattice rank of the counts    ceil(log2 C(ell+K-1, K-1)) (eq. 2)
            the token's index in support  ceil(log2 K) bits

So the body is exactly sum_n [eq. (1) + ceil(log2 K_n)] bits (`body_bits`).
`decode` refuses anything inconsistent (wrong codec or V, a bit length that does
not match the bytes, a rank out of range, a token with zero mass, leftover bits)
with `MalformedPayload`, and bounds its work by the bits actually present.

What it is not: the frame around the payload, nor the choice of supports
(kernels/sqs.py); it codes whatever rows it is given.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from kernels.bitio import BitReader, BitWriter, MalformedPayload
from kernels.enumerative import (
    bits_for,
    composition_bits,
    rank_composition,
    rank_subset,
    subset_bits,
    unrank_composition,
    unrank_subset,
)
from kernels.sqs import dense_qhat

VERSION = 1
K_SQS, C_SQS = 1, 2
_HEAD = struct.Struct(">BBHII")  # codec, version, L, V, body bits
_KSQS = struct.Struct(">IH")  # K, ell
_CSQS = struct.Struct(">H")  # ell


@dataclass(frozen=True)
class SqsRow:
    """One quantized draft distribution: support ids (ascending) and lattice counts summing to ell."""

    ids: np.ndarray
    counts: np.ndarray


def row_bits(v: int, k: int, ell: int, variable_k: bool) -> int:
    """Bits of one row: eq. (1) (with §3's K field under C-SQS) plus the token's index in the support."""
    return (
        (bits_for(v) if variable_k else 0)
        + subset_bits(v, k)
        + composition_bits(ell, k)
        + bits_for(k)
    )


def body_bits(rows: list[SqsRow], v: int, ell: int, variable_k: bool) -> int:
    """The payload body's exact bit length: the sum of row_bits (before byte padding)."""
    return sum(row_bits(v, len(r.ids), ell, variable_k) for r in rows)


def header_bytes(variable_k: bool) -> int:
    """Bytes before the body."""
    return _HEAD.size + (_CSQS.size if variable_k else _KSQS.size)


def qhat_rows(rows: list[SqsRow], ell: int, v: int) -> np.ndarray:
    """(L, V) float32: each row's q^ = counts / ell on its support (the draft samples from these)."""
    return (
        np.stack([dense_qhat(r.ids, r.counts, ell, v) for r in rows])
        if rows
        else np.zeros((0, v), np.float32)
    )


def encode(rows: list[SqsRow], tokens: np.ndarray, v: int, ell: int, variable_k: bool) -> bytes:
    """Bytes for a batch: K-SQS if not variable_k (all rows share K), else C-SQS.

    ValueError on rows that are not valid lattice points (ids not distinct and
    in range, counts not summing to ell) or a token outside its row's q^ support.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    if len(tokens) != len(rows) or len(rows) > 0xFFFF:
        raise ValueError(
            f"need one token per row and at most 65535 rows ({len(tokens)}, {len(rows)})"
        )
    if not (1 <= ell <= 0xFFFF and 2 <= v <= 0xFFFFFFFF):
        raise ValueError(f"ell must be in [1, 65535] and V >= 2 (ell={ell}, V={v})")
    ks = {len(r.ids) for r in rows}
    if not variable_k and len(ks) > 1:
        raise ValueError(f"K-SQS rows must share one K, got {sorted(ks)}")
    w = BitWriter()
    for r, tok in zip(rows, tokens, strict=True):
        k = len(r.ids)
        counts = np.asarray(r.counts, np.int64)
        if len(counts) != k or not 1 <= k <= v or (np.diff(r.ids) <= 0).any():
            raise ValueError(
                f"a row needs 1..V ascending ids and one count each ({k}, {len(counts)})"
            )
        pos = np.searchsorted(r.ids, tok)
        if pos >= k or r.ids[pos] != tok or counts[pos] <= 0:
            raise ValueError(f"token {tok} has no mass in its row's q^: sample the token from q^")
        if variable_k:
            w.write(k - 1, bits_for(v))  # §3: K itself in ceil(log2 V) bits
        w.write(rank_subset(r.ids, v), subset_bits(v, k))  # eq. (5)
        w.write(rank_composition(counts, ell), composition_bits(ell, k))  # eq. (2)
        w.write(int(pos), bits_for(k))
    k0 = ks.pop() if ks else 1
    head = _HEAD.pack(C_SQS if variable_k else K_SQS, VERSION, len(rows), v, w.nbits)
    head += _CSQS.pack(ell) if variable_k else _KSQS.pack(k0, ell)
    return head + w.getvalue()


def _log2_comb_lower(n: int, k: int) -> float:
    """A cheap lower bound on log2 C(n, k): k' log2(n / k') with k' = min(k, n - k)."""
    k = min(k, n - k)
    return k * math.log2(n / k) if k > 0 else 0.0


def _read_rank(r: BitReader, n: int, k: int, what: str) -> tuple[int, int]:
    """Read a ceil(log2 C(n, k))-bit field, refusing before computing C(n, k) if it cannot fit."""
    if _log2_comb_lower(n, k) > r.remaining + 1:
        raise MalformedPayload(f"{what} of C({n}, {k}) cannot fit in the {r.remaining} bits left")
    count = math.comb(n, k)
    return r.read(bits_for(count)), count


def decode(data: bytes, v: int, max_rows: int = 128) -> tuple[np.ndarray, np.ndarray, list[SqsRow]]:
    """Tokens (L,), q^ rows (L, V) float32 and the coded rows, from a K-SQS or C-SQS payload."""
    if len(data) < _HEAD.size:
        raise MalformedPayload(f"payload of {len(data)} bytes is shorter than its header")
    codec, version, n_rows, v_sent, nbits = _HEAD.unpack_from(data)
    if codec not in (K_SQS, C_SQS) or version != VERSION:
        raise MalformedPayload(f"not an SQS payload (codec {codec}, version {version})")
    if v_sent != v:
        raise MalformedPayload(f"payload is for a vocabulary of {v_sent}, this verifier has {v}")
    if n_rows > max_rows:  # the dense (L, V) output is the verifier's memory: bound it
        raise MalformedPayload(f"{n_rows} rows exceed this verifier's limit of {max_rows}")
    variable_k = codec == C_SQS
    hs = header_bytes(variable_k)
    if len(data) < hs:
        raise MalformedPayload("payload truncated inside its header")
    if variable_k:
        (ell,), k_fixed = _CSQS.unpack_from(data, _HEAD.size), None
    else:
        k_fixed, ell = _KSQS.unpack_from(data, _HEAD.size)
        if not 1 <= k_fixed <= v:
            raise MalformedPayload(f"K = {k_fixed} outside [1, {v}]")
    if ell < 1:
        raise MalformedPayload("lattice resolution ell = 0")
    r = BitReader(data[hs:], nbits)
    rows, tokens = [], np.zeros(n_rows, np.int64)
    for n in range(n_rows):
        k = r.read(bits_for(v)) + 1 if variable_k else k_fixed
        if k > v:
            raise MalformedPayload(f"row {n}: K = {k} exceeds V = {v}")
        rank, count = _read_rank(r, v, k, "subset rank")
        if rank >= count:
            raise MalformedPayload(f"row {n}: subset rank out of range for C({v}, {k})")
        ids = unrank_subset(rank, v, k)
        rank, count = _read_rank(r, ell + k - 1, k - 1, "lattice rank")
        if rank >= count:
            raise MalformedPayload(
                f"row {n}: lattice rank out of range: counts would not sum to {ell}"
            )
        counts = unrank_composition(rank, ell, k)
        pos = r.read(bits_for(k))
        if pos >= k or counts[pos] == 0:
            raise MalformedPayload(f"row {n}: the draft token has no mass in q^")
        rows.append(SqsRow(ids, counts))
        tokens[n] = ids[pos]
    r.expect_end()
    return tokens, qhat_rows(rows, ell, v), rows
