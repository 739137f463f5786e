"""`ids` codec: the draft token ids, bit-packed at b = ceil(log2 V) bits each (FlexSpec §IV-B,
eq. (8)'s K·b). Carries no q, so the server can only verify it greedily (T = 0).

Body: u16 K, u8 b, then ceil(K·b / 8) bytes: the K ids, least significant bit first, packed
LSB-first into bytes (numpy.packbits with bitorder="little").
"""

from __future__ import annotations

import math
import struct

import numpy as np

from runtime.edge.codecs import Draft
from runtime.edge.wire import E_MALFORMED, E_VOCAB, ProtocolError, Reader

NAME = "ids"
NUMBER = 1
CARRIES_Q = False
FIXED_ROWS = True  # b bits an id


def bits_for(vocab: int) -> int:
    """b = ceil(log2 V): bits per token id (FlexSpec eq. (8))."""
    return max(1, math.ceil(math.log2(max(vocab, 2))))


def pack_ids(tokens, vocab: int) -> bytes:
    """u16 K, u8 b, packed ids."""
    b = bits_for(vocab)
    ids = np.asarray(tokens, dtype=np.uint64)
    bits = ((ids[:, None] >> np.arange(b, dtype=np.uint64)) & 1).astype(np.uint8)  # (K, b)
    return struct.pack("<HB", len(ids), b) + np.packbits(bits.ravel(), bitorder="little").tobytes()


def unpack_ids(r: Reader, vocab: int) -> list[int]:
    """Read what pack_ids wrote; checks b and that every id is inside the vocabulary."""
    k, b = r.fmt("HB")
    if b != bits_for(vocab):
        raise ProtocolError(
            E_MALFORMED, f"ids packed at {b} bits; this vocabulary needs {bits_for(vocab)}"
        )
    raw = np.frombuffer(r.take(math.ceil(k * b / 8)), dtype=np.uint8)
    bits = np.unpackbits(raw, bitorder="little")[: k * b].reshape(k, b).astype(np.uint64)
    ids = (bits << np.arange(b, dtype=np.uint64)).sum(1)
    if k and int(ids.max()) >= vocab:
        raise ProtocolError(
            E_VOCAB, f"token id {int(ids.max())} outside the vocabulary [0, {vocab})"
        )
    return [int(i) for i in ids]


def params(vocab: int) -> dict:
    """What a bundle records of this codec: the bits per id."""
    return {"bits_per_id": bits_for(vocab)}


def encode(tokens, q, vocab: int) -> bytes:
    """The body for `tokens` (q is not sent)."""
    return pack_ids(tokens, vocab)


def decode(body: bytes, vocab: int) -> Draft:
    """Parse a body; ProtocolError on truncation, trailing bytes or ids out of range."""
    r = Reader(body, "ids payload")
    toks = unpack_ids(r, vocab)
    r.end()
    return Draft(toks, None)
