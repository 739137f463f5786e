"""Byte payloads of SQS-SD's uplink: K-SQS and C-SQS rows as exact integer codes.

One payload carries a batch of L drafted tokens and the quantized distribution
q^ each was sampled from (SQS §2: the draft samples from q^, so the cloud's
rejection sampling with that same q^ keeps the target's law). Layout, big-endian:

    header  u8 codec (1 = k-sqs, 2 = c-sqs), u8 version (2), u16 L, u32 V,
            u32 body bit length, then k-sqs: u32 K, u16 ell | c-sqs: u16 ell
    body    per row, packed MSB first (kernels/bitio.py), zero-padded to a byte:
            [c-sqs only] K - 1            ceil(log2 V) bits          (§3)
            subset rank of the support    ceil(log2 C(V, K)) bits    (eq. 5)
            lattice rank of the counts    ceil(log2 C(ell+K-1, K-1)) (eq. 2)
            the token's id                ceil(log2 V) bits
            its count b - 1 (b in 1..ell) ceil(log2 ell) bits

So the body is exactly sum_n [eq. (1) + ceil(log2 V) + ceil(log2 ell)] bits (`body_bits`).
Version 2 sends the token and its count in the clear (version 1 sent the token's index in the
support, ceil(log2 K) bits): rejection sampling reads q^_i(d_i) of every row but the whole q^_i
of at most one (the first rejected, for the residual max(p - q^, 0)), so the verifier can leave
the other rows as ranks (`decode_lazy`, `CodedRows`): unranking is what costs (milliseconds per
row at V = 4096, K = 512), and the extra ~15 bits per row are < 0.5 % of one. `decode` unranks
every row and refuses anything inconsistent (wrong codec or V, a bit length that does not match
the bytes, a rank out of range, a token with zero mass or a count that is not its lattice
count) with `MalformedPayload`, and bounds its work by the bits actually present;
`decode_lazy` makes every check that needs no unranking at once and the rest when a row is
unranked.

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

VERSION = 2
K_SQS, C_SQS = 1, 2
_HEAD = struct.Struct(">BBHII")  # codec, version, L, V, body bits
_KSQS = struct.Struct(">IH")  # K, ell
_CSQS = struct.Struct(">H")  # ell


@dataclass(frozen=True)
class SqsRow:
    """One quantized draft distribution: support ids (ascending) and lattice counts summing to
    ell."""

    ids: np.ndarray
    counts: np.ndarray


def row_bits(v: int, k: int, ell: int, variable_k: bool) -> int:
    """Bits of one row: eq. (1) (with §3's K field under C-SQS) plus the token's id and count."""
    return (
        (bits_for(v) if variable_k else 0)
        + subset_bits(v, k)
        + composition_bits(ell, k)
        + bits_for(v)
        + bits_for(ell)
    )


def body_bits(rows: list[SqsRow], v: int, ell: int, variable_k: bool) -> int:
    """The payload body's exact bit length: the sum of row_bits (before byte padding)."""
    return sum(row_bits(v, len(r.ids), ell, variable_k) for r in rows)


def header_bytes(variable_k: bool) -> int:
    """Bytes before the body."""
    return _HEAD.size + (_CSQS.size if variable_k else _KSQS.size)


def qhat_rows(rows: list[SqsRow], ell: int, v: int) -> np.ndarray:
    """(L, V) float32: each row's q^ = counts / ell on its support (the draft samples from
    these)."""
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
        w.write(int(tok), bits_for(v))
        w.write(int(counts[pos]) - 1, bits_for(ell))
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


@dataclass(frozen=True)
class _Coded:
    """One row as read, not unranked: its support size, both ranks, the token and its count."""

    k: int
    subset_rank: int
    lattice_rank: int
    token: int
    count: int


def _parse(data: bytes, v: int, max_rows: int) -> tuple[int, list[_Coded]]:
    """(ell, rows) of a payload, with every check that needs no unranking."""
    if len(data) < _HEAD.size:
        raise MalformedPayload(f"payload of {len(data)} bytes is shorter than its header")
    codec, version, n_rows, v_sent, nbits = _HEAD.unpack_from(data)
    if codec not in (K_SQS, C_SQS) or version != VERSION:
        raise MalformedPayload(
            f"not an SQS payload of version {VERSION} (codec {codec}, version {version})"
        )
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
    rows = []
    for n in range(n_rows):
        k = r.read(bits_for(v)) + 1 if variable_k else k_fixed
        if k > v:
            raise MalformedPayload(f"row {n}: K = {k} exceeds V = {v}")
        srank, count = _read_rank(r, v, k, "subset rank")
        if srank >= count:
            raise MalformedPayload(f"row {n}: subset rank out of range for C({v}, {k})")
        lrank, count = _read_rank(r, ell + k - 1, k - 1, "lattice rank")
        if lrank >= count:
            raise MalformedPayload(
                f"row {n}: lattice rank out of range: counts would not sum to {ell}"
            )
        tok, b = r.read(bits_for(v)), r.read(bits_for(ell)) + 1
        if tok >= v or b > ell:
            raise MalformedPayload(f"row {n}: token {tok} or its count {b} out of range")
        rows.append(_Coded(k, srank, lrank, tok, b))
    r.expect_end()
    return ell, rows


def _unrank(c: _Coded, ell: int, v: int, n: int) -> SqsRow:
    """The row's support and counts; MalformedPayload if its token is not where it says."""
    ids = unrank_subset(c.subset_rank, v, c.k)
    counts = unrank_composition(c.lattice_rank, ell, c.k)
    pos = int(np.searchsorted(ids, c.token))
    if pos >= c.k or ids[pos] != c.token or counts[pos] == 0:
        raise MalformedPayload(f"row {n}: the draft token has no mass in q^")
    if counts[pos] != c.count:
        raise MalformedPayload(
            f"row {n}: the token's count {c.count} is not its lattice count {int(counts[pos])}"
        )
    return SqsRow(ids, counts)


class CodedRows:
    """The q^ rows of a payload, unranked only when asked (`decode_lazy`).

    `token_probs` (L,) float32 is q^_i(d_i) from the counts sent in the clear (the same float as
    the dense row's entry); `row(i)` unranks row i (checking that its token and count agree
    with the lattice) and returns its dense q^ (V,). `unranked` counts the rows unranked.
    """

    def __init__(self, rows: list[_Coded], ell: int, v: int):
        self._rows, self.ell, self.v = rows, ell, v
        self.token_probs = (np.array([c.count for c in rows], np.float64) / ell).astype(
            np.float32
        )  # as kernels/sqs.dense_qhat computes b / ell
        self.unranked = 0

    def __len__(self) -> int:
        return len(self._rows)

    def row(self, i: int) -> np.ndarray:
        """Dense q^ of row i (V,) float32."""
        self.unranked += 1
        r = _unrank(self._rows[i], self.ell, self.v, i)
        return dense_qhat(r.ids, r.counts, self.ell, self.v)


def decode_lazy(data: bytes, v: int, max_rows: int = 128) -> tuple[np.ndarray, CodedRows]:
    """Tokens (L,) and the rows left coded (`CodedRows`): every check but the unranked ones."""
    ell, rows = _parse(bytes(data), v, max_rows)
    return np.array([c.token for c in rows], np.int64), CodedRows(rows, ell, v)


def decode(data: bytes, v: int, max_rows: int = 128) -> tuple[np.ndarray, np.ndarray, list[SqsRow]]:
    """Tokens (L,), q^ rows (L, V) float32 and the coded rows, from a K-SQS or C-SQS payload,
    every row unranked and checked."""
    ell, coded = _parse(bytes(data), v, max_rows)
    rows = [_unrank(c, ell, v, n) for n, c in enumerate(coded)]
    tokens = np.array([c.token for c in coded], np.int64)
    return tokens, qhat_rows(rows, ell, v), rows
