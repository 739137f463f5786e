"""Exact bit-level writing and reading of unsigned integers of any size.

Fields are written most-significant bit first and packed back to back; the
stream is padded with zero bits to a whole byte. Python ints are exact, so a
field may be thousands of bits wide (a subset rank over a 152k vocabulary).
`BitWriterReference` / `BitReaderReference` are the plain twins over a string
of '0'/'1' characters.

What it is not: a frame format. It knows nothing of headers or codecs; a
reader that runs out of bits or meets nonzero padding raises `MalformedPayload`.
"""

from __future__ import annotations

import numpy as np


class MalformedPayload(ValueError):
    """A payload that does not decode: truncated, over-long, out of range, or inconsistent."""


class BitWriter:
    """Append unsigned integers of a given bit width; `getvalue()` returns the padded bytes."""

    def __init__(self) -> None:
        self._acc = 0  # all bits so far, the first written in the most significant place
        self.nbits = 0

    def write(self, value: int, nbits: int) -> None:
        """Append `value` in exactly `nbits` bits (0 bits: value must be 0)."""
        if nbits < 0 or value < 0 or value >> nbits:
            raise ValueError(f"value {value} does not fit in {nbits} bits")
        self._acc = (self._acc << nbits) | value
        self.nbits += nbits

    def write_array(self, values: np.ndarray, nbits: int) -> None:
        """Append each of `values` (unsigned, < 2**nbits <= 2**32) in nbits bits, in order."""
        self.write(_pack(np.asarray(values, np.int64), nbits), len(values) * nbits)

    def getvalue(self) -> bytes:
        """The bits so far, zero-padded at the end to a whole byte."""
        pad = -self.nbits % 8
        return (self._acc << pad).to_bytes((self.nbits + pad) // 8, "big")


class BitReader:
    """Read back what a BitWriter wrote, from `nbits` declared bits of `data`."""

    def __init__(self, data: bytes, nbits: int | None = None) -> None:
        total = 8 * len(data)
        nbits = total if nbits is None else nbits
        if not (total - 8 < nbits <= total) and not (nbits == 0 == total):
            raise MalformedPayload(
                f"declared bit length {nbits} does not match {len(data)} bytes "
                f"(expected {max(0, total - 7)}..{total})"
            )
        acc = int.from_bytes(data, "big")
        if acc & ((1 << (total - nbits)) - 1):
            raise MalformedPayload("nonzero padding bits after the declared bit length")
        self._acc = acc >> (total - nbits)
        self.remaining = nbits

    def read(self, nbits: int) -> int:
        """The next `nbits` bits as an unsigned integer."""
        if nbits > self.remaining:
            raise MalformedPayload(f"payload truncated: wanted {nbits} bits, {self.remaining} left")
        self.remaining -= nbits
        return (self._acc >> self.remaining) & ((1 << nbits) - 1)

    def read_array(self, count: int, nbits: int) -> np.ndarray:
        """The next `count` fields of `nbits` bits each, as int64."""
        return _unpack(self.read(count * nbits), count, nbits)

    def expect_end(self) -> None:
        """Raise unless every declared bit was consumed."""
        if self.remaining:
            raise MalformedPayload(f"{self.remaining} declared bits left over after the last field")


def _pack(values: np.ndarray, nbits: int) -> int:
    """Fixed-width fields -> one integer, first field most significant (vectorized)."""
    if values.size == 0 or nbits == 0:
        if values.size and values.any():
            raise ValueError("nonzero value in a 0-bit field")
        return 0
    if values.min() < 0 or values.max() >> nbits:
        raise ValueError(f"a value does not fit in {nbits} bits")
    shifts = np.arange(nbits - 1, -1, -1, dtype=np.int64)
    bits = ((values[:, None] >> shifts) & 1).astype(np.uint8).ravel()  # MSB first
    pad = -bits.size % 8
    return int.from_bytes(np.packbits(bits).tobytes(), "big") >> pad


def _unpack(x: int, count: int, nbits: int) -> np.ndarray:
    """Inverse of _pack."""
    total = count * nbits
    if total == 0:
        return np.zeros(count, np.int64)
    pad = -total % 8
    raw = np.frombuffer((x << pad).to_bytes((total + pad) // 8, "big"), np.uint8)
    bits = np.unpackbits(raw)[:total].reshape(count, nbits).astype(np.int64)
    return bits @ (np.int64(1) << np.arange(nbits - 1, -1, -1, dtype=np.int64))


class BitWriterReference:
    """Plain twin of BitWriter over a '0'/'1' string."""

    def __init__(self) -> None:
        self.bits = ""

    def write(self, value: int, nbits: int) -> None:
        if nbits < 0 or value < 0 or value >= 2**nbits:
            raise ValueError(f"value {value} does not fit in {nbits} bits")
        self.bits += format(value, "b").zfill(nbits) if nbits else ""

    def getvalue(self) -> bytes:
        s = self.bits + "0" * (-len(self.bits) % 8)
        return bytes(int(s[i : i + 8], 2) for i in range(0, len(s), 8))


class BitReaderReference:
    """Plain twin of BitReader over a '0'/'1' string (no validation of padding)."""

    def __init__(self, data: bytes, nbits: int) -> None:
        self.bits = "".join(format(b, "08b") for b in data)[:nbits]

    def read(self, nbits: int) -> int:
        head, self.bits = self.bits[:nbits], self.bits[nbits:]
        if len(head) < nbits:
            raise MalformedPayload("payload truncated")
        return int(head, 2) if head else 0
