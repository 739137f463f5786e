"""The binary frame of the edge-cloud protocol (runtime/edge/PROTOCOL.md): header, frame types,
and the fixed-layout bodies of the control frames.

A frame is a 16-byte header followed by `length` payload bytes. This module only packs and
unpacks bytes; it does no I/O and holds no session state (the client is runtime/edge/client.py,
the server apps/cloud/). Every malformed input raises `ProtocolError` with an error code and a
message naming the problem, never another exception.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

MAGIC = b"DU"
VERSION = 1
HEADER = struct.Struct("<2sBBIII")  # magic, version, type, session, seq, length
HEADER_SIZE = HEADER.size  # 16
MAX_FRAME = 1 << 24  # default payload limit (16 MiB): a raw window of 8 rows of 262k-vocab f32 fits

# frame types (u8)
HELLO, WELCOME, OPEN, OPENED, VERIFY, VERDICT, ROLLBACK, ROLLED, CLOSE, CLOSED = range(1, 11)
ERROR = 15
NAMES = {HELLO: "HELLO", WELCOME: "WELCOME", OPEN: "OPEN", OPENED: "OPENED", VERIFY: "VERIFY",
         VERDICT: "VERDICT", ROLLBACK: "ROLLBACK", ROLLED: "ROLLED", CLOSE: "CLOSE",
         CLOSED: "CLOSED", ERROR: "ERROR"}  # fmt: skip

# error codes (u16) carried by ERROR frames
E_MALFORMED, E_VERSION, E_AUTH, E_UNKNOWN_TYPE, E_SESSION, E_SEQUENCE = 1, 2, 3, 4, 5, 6
E_TOO_LARGE, E_LIMIT, E_CONTEXT, E_CODEC, E_VOCAB, E_IDLE, E_INTERNAL = 7, 8, 9, 10, 11, 12, 13
E_IDENTITY = 14  # HELLO claim names another base checkpoint than the verifier's target
E_ADAPTER = 15  # OPEN names an adapter the verifier does not hold
MAX_ADAPTER_NAME = 255  # bytes of OPEN's adapter name (u8 length)


class ProtocolError(Exception):
    """A frame that breaks PROTOCOL.md; `code` is the ERROR frame's code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Header:
    type: int
    session: int
    seq: int
    length: int


def pack(ftype: int, session: int, seq: int, payload: bytes = b"") -> bytes:
    """One frame: header + payload."""
    return HEADER.pack(MAGIC, VERSION, ftype, session, seq, len(payload)) + payload


def unpack_header(buf: bytes, max_frame: int = MAX_FRAME) -> Header:
    """Parse and check the 16-byte header (magic, version, known type, length within limit)."""
    if len(buf) != HEADER_SIZE:
        raise ProtocolError(E_MALFORMED, f"truncated header: {len(buf)} of {HEADER_SIZE} bytes")
    magic, version, ftype, session, seq, length = HEADER.unpack(buf)
    if magic != MAGIC:
        raise ProtocolError(E_MALFORMED, f"bad magic {magic!r} (expected {MAGIC!r})")
    if version != VERSION:
        raise ProtocolError(E_VERSION, f"protocol version {version} (this side speaks {VERSION})")
    if ftype not in NAMES:
        raise ProtocolError(E_UNKNOWN_TYPE, f"unknown frame type {ftype}")
    if length > max_frame:
        raise ProtocolError(E_TOO_LARGE, f"payload of {length} bytes exceeds the {max_frame} limit")
    return Header(ftype, session, seq, length)


class Reader:
    """Cursor over a payload; every read checks the bytes are there."""

    def __init__(self, buf: bytes, what: str):
        self.buf, self.pos, self.what = memoryview(buf), 0, what

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise ProtocolError(E_MALFORMED, f"{self.what}: payload truncated at byte {self.pos}")
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return out

    def fmt(self, f: str) -> tuple:
        s = struct.Struct("<" + f)
        return s.unpack(self.take(s.size))

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise ProtocolError(
                E_MALFORMED, f"{self.what}: {len(self.buf) - self.pos} trailing bytes"
            )


# --- control bodies ---------------------------------------------------------------------------


def hello(token: bytes, claim: dict | None = None) -> bytes:
    """HELLO: u16 token length + token bytes; with a claim, then u16 n + n bytes of UTF-8 JSON
    (the draft's identity, runtime/edge/identity.py). Without one the frame is version 1's."""
    out = struct.pack("<H", len(token)) + token
    if claim is not None:
        body = json.dumps(claim, sort_keys=True, separators=(",", ":")).encode()
        out += struct.pack("<H", len(body)) + body
    return out


def read_hello(p: bytes) -> tuple[bytes, dict | None]:
    """(token, claim or None)."""
    r = Reader(p, "HELLO")
    (n,) = r.fmt("H")
    tok = r.take(n)
    claim = None
    if r.pos < len(r.buf):
        (m,) = r.fmt("H")
        try:
            claim = json.loads(r.take(m).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ProtocolError(E_MALFORMED, "HELLO: the claim is not UTF-8 JSON") from None
    r.end()
    return tok, claim


@dataclass(frozen=True)
class Welcome:
    vocab_size: int
    max_context: int
    max_frame: int
    codecs: tuple[str, ...]


def welcome(w: Welcome) -> bytes:
    """WELCOME: u32 vocab, u32 max context, u32 max frame, u8 n codecs, n × (u8 len + name)."""
    out = struct.pack("<IIIB", w.vocab_size, w.max_context, w.max_frame, len(w.codecs))
    for c in w.codecs:
        out += struct.pack("<B", len(c)) + c.encode()
    return out


def read_welcome(p: bytes) -> Welcome:
    r = Reader(p, "WELCOME")
    v, ctx, mf, n = r.fmt("IIIB")
    names = tuple(r.take(r.fmt("B")[0]).decode("ascii", "replace") for _ in range(n))
    r.end()
    return Welcome(v, ctx, mf, names)


@dataclass(frozen=True)
class Open:
    temp: float
    top_p: float
    top_k: int
    seed: int
    prompt: tuple[int, ...]
    adapter: str = ""  # the verifier's adapter this session runs ("": the base target)


def open_(o: Open) -> bytes:
    """OPEN: f32 temp, f32 top_p, u32 top_k, u64 seed, u32 n, n × u32 prompt ids; with an
    adapter, then u8 m + m bytes of its UTF-8 name. Without one the frame is version 1's."""
    out = struct.pack(
        f"<ffIQI{len(o.prompt)}I", o.temp, o.top_p, o.top_k, o.seed, len(o.prompt), *o.prompt
    )
    if o.adapter:
        name = o.adapter.encode()
        if len(name) > MAX_ADAPTER_NAME:
            raise ValueError(f"adapter name of {len(name)} bytes (at most {MAX_ADAPTER_NAME})")
        out += struct.pack("<B", len(name)) + name
    return out


def read_open(p: bytes) -> Open:
    r = Reader(p, "OPEN")
    temp, top_p, top_k, seed, n = r.fmt("ffIQI")
    if 4 * n > len(p) - r.pos:
        raise ProtocolError(
            E_MALFORMED, f"OPEN: says {n} prompt ids, carries {len(p) - r.pos} bytes"
        )
    ids = r.fmt(f"{n}I")
    adapter = ""
    if r.pos < len(r.buf):  # the optional adapter name
        (m,) = r.fmt("B")
        try:
            adapter = r.take(m).decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(E_MALFORMED, "OPEN: the adapter name is not UTF-8") from None
    r.end()
    return Open(temp, top_p, top_k, seed, tuple(ids), adapter)


def verify(codec: int, base: int, body: bytes) -> bytes:
    """VERIFY: u8 codec number, u32 base (committed length the draft continues), codec body."""
    return struct.pack("<BI", codec, base) + body


def read_verify(p: bytes) -> tuple[int, int, bytes]:
    r = Reader(p, "VERIFY")
    codec, base = r.fmt("BI")
    return codec, base, bytes(r.buf[r.pos :])


@dataclass(frozen=True)
class Verdict:
    accepted: int  # A
    token: int  # c: correction or bonus
    committed: int  # committed length after this verdict
    server_s: float  # cloud verification time (payload decode + forward + acceptance)


def verdict(v: Verdict) -> bytes:
    """VERDICT: u32 A, u32 c, u32 committed length, f32 server seconds."""
    return struct.pack("<IIIf", v.accepted, v.token, v.committed, v.server_s)


def read_verdict(p: bytes) -> Verdict:
    r = Reader(p, "VERDICT")
    out = Verdict(*r.fmt("IIIf"))
    r.end()
    return out


def u32(n: int) -> bytes:
    """OPENED / ROLLBACK / ROLLED / CLOSED: one u32 (a committed length)."""
    return struct.pack("<I", n)


def read_u32(p: bytes, what: str) -> int:
    r = Reader(p, what)
    (n,) = r.fmt("I")
    r.end()
    return n


def error(code: int, message: str) -> bytes:
    """ERROR: u16 code + UTF-8 message (at most 1 KiB)."""
    return struct.pack("<H", code) + message.encode()[:1024]


def read_error(p: bytes) -> tuple[int, str]:
    if len(p) < 2:
        return E_MALFORMED, "(empty error frame)"
    return struct.unpack("<H", p[:2])[0], p[2:].decode("utf-8", "replace")
