"""A frame fuzzer for the cloud verifier: malformed, truncated, oversized, out-of-order,
unknown and misaddressed frames, wrong tokens, bad ids and frames after close, compressed-q
payloads (k-sqs, c-sqs, cu-hlm) valid or lying (flipped bits, truncated, wrong bit length,
extra bytes), OPENs naming adapters (unknown, not UTF-8, lying about their length), mixed with
valid traffic (on the server's `adapters` too, when given), each on its own connection to a
running server.

    python -m apps.cloud.fuzz HOST:PORT [--frames 10000] [--seed 0] [--token-file F]
        [--time-limit S]
    python -m apps.cloud.fuzz local [--frames 10000]   # its own verifier (embedded target), then
                                                       # checks a good client still equals ar

prints one JSON object with the counts (frames sent, connections, ERROR replies per code,
connections that got no reply). The default test suite runs `fuzz` with a few hundred frames
(tests/test_edge_server.py); the full 10,000-frame run is this command. It never checks model
output itself: the caller verifies afterwards that a good client still gets the target's tokens.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import time
from collections import Counter

import numpy as np

from runtime.cli_parser import doc_parser
from runtime.edge import wire
from runtime.edge.codecs import codec


class _Conn:
    def __init__(self, host, port, stats):
        self.s = socket.create_connection((host, port), timeout=10)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.stats = stats
        self.seq = 0
        self.sid = 0

    def send(self, data: bytes, frames: int = 1) -> None:
        try:
            self.s.sendall(data)
        except OSError:
            pass
        self.stats["frames"] += frames

    def frame(self, ftype, payload=b"", *, sid=None, seq=None) -> None:
        self.send(
            wire.pack(
                ftype, self.sid if sid is None else sid, self.seq if seq is None else seq, payload
            )
        )
        self.seq += 1

    def reply(self) -> tuple[int, bytes] | None:
        """One reply frame, or None when the server closed without one."""
        try:
            head = self._recv(wire.HEADER_SIZE)
            h = wire.unpack_header(head, 1 << 30)
            body = self._recv(h.length)
        except (OSError, wire.ProtocolError, EOFError):
            return None
        if h.type == wire.ERROR:
            self.stats[f"error_{wire.read_error(body)[0]}"] += 1
        if h.type == wire.OPENED:
            self.sid = h.session
        return h.type, body

    def _recv(self, n):
        buf = b""
        while len(buf) < n:
            c = self.s.recv(n - len(buf))
            if not c:
                raise EOFError
            buf += c
        return buf

    def close(self):
        self.s.close()


def _hello_open(c: _Conn, token: bytes, rng, V: int, adapters: tuple = ()) -> bool:
    c.frame(wire.HELLO, wire.hello(token))
    r = c.reply()
    if not r or r[0] != wire.WELCOME:
        return False
    prompt = tuple(int(x) for x in rng.integers(0, V, int(rng.integers(1, 6))))
    name = str(rng.choice(("",) + tuple(adapters)))  # the base or one the server holds
    c.frame(wire.OPEN, wire.open_(wire.Open(0.0, 1.0, 0, 0, prompt, name)))
    r = c.reply()
    c.base = len(prompt)
    return bool(r and r[0] == wire.OPENED)


def _compressed_payload(rng, V: int) -> tuple[int, bytes]:
    """(codec number, body): a valid k-sqs / c-sqs / cu-hlm payload for random q rows, then
    maybe made to lie: a flipped bit, a truncation, a wrong body bit length, extra bytes."""
    from kernels.payloads import make_codec

    name = str(rng.choice(["k-sqs", "c-sqs", "cu-hlm"]))
    levels = str(rng.choice(["log", "linear"]))  # cu-hlm payload versions 3 and 1
    params = {
        "k-sqs": {"k": 4, "ell": 50},
        "c-sqs": {"ell": 50},
        "cu-hlm": {"k": 4, "levels": levels},
    }[name]
    cod = make_codec(name, **params)
    q = rng.dirichlet(np.full(V, 0.05), int(rng.integers(0, 4))).astype(np.float32)
    rows = cod.quantize(q) if len(q) else []
    qh = cod.qhat(rows, V)
    toks = [int(rng.choice(V, p=r / r.sum())) for r in qh.astype(np.float64)]
    data = bytearray(cod.encode(rows, np.array(toks, np.int64), V))
    how = rng.integers(5)
    if how == 1 and len(data) > 12:  # a flipped bit anywhere past the codec byte
        i = int(rng.integers(1, len(data)))
        data[i] ^= 1 << int(rng.integers(8))
    elif how == 2:
        data = data[: int(rng.integers(0, len(data)))]
    elif how == 3 and len(data) >= 12:  # the header's u32 body bit length (big-endian, offset 8)
        nbits = int.from_bytes(data[8:12], "big") + int(rng.choice([-9, -1, 1, 8, 1 << 30]))
        data[8:12] = (nbits % 2**32).to_bytes(4, "big")
    elif how == 4:
        data += rng.bytes(int(rng.integers(1, 4)))
    return codec(name).NUMBER, bytes(data)


def _adapter_open(rng) -> bytes:
    """An OPEN body whose adapter field is an unknown name (often not UTF-8), lies about its
    length, or is followed by extra bytes."""
    body = wire.open_(wire.Open(0.0, 1.0, 0, 0, (1, 2)))
    n = int(rng.integers(1, 12))
    name = bytes(rng.integers(97, 123, n).astype(np.uint8)) if rng.random() < 0.7 else rng.bytes(n)
    how = rng.integers(4)
    if how < 2:  # well framed: an unknown name (E_ADAPTER) or one that is not UTF-8
        return body + bytes([len(name)]) + name
    if how == 2:
        return body + bytes([len(name) + int(rng.integers(1, 9))]) + name
    return body + bytes([len(name)]) + name + rng.bytes(int(rng.integers(1, 4)))


def _case(kind: str, c: _Conn, token: bytes, rng, V: int, adapters: tuple = ()) -> None:
    ids = codec("ids")
    if kind == "random":  # random bytes, maybe with a valid magic
        blob = rng.bytes(int(rng.integers(1, 64)))
        c.send((wire.MAGIC + blob) if rng.random() < 0.5 else blob)
    elif kind == "truncated":  # part of a header, then the connection ends
        c.send(wire.pack(wire.HELLO, 0, 0, wire.hello(token))[: int(rng.integers(1, 16))])
    elif kind == "lying":  # a length that is not what follows
        body = wire.hello(token)
        fake = int(rng.choice([len(body) + 7, 1 << 31, len(body) - 1]))
        c.send(struct.pack("<2sBBIII", wire.MAGIC, 1, wire.HELLO, 0, 0, max(fake, 0)) + body)
    elif kind == "version":
        c.send(struct.pack("<2sBBIII", wire.MAGIC, 9, wire.HELLO, 0, 0, 0))
    elif kind == "unknown":
        c.send(
            struct.pack("<2sBBIII", wire.MAGIC, 1, int(rng.choice([0, 11, 12, 99, 255])), 0, 0, 0)
        )
    elif kind == "token":
        c.frame(wire.HELLO, wire.hello(rng.bytes(8)))
    elif kind == "no_hello":
        c.frame(wire.VERIFY, wire.verify(1, 0, ids.encode([1], None, V)))
    elif kind == "adapter":
        c.frame(wire.HELLO, wire.hello(token))
        r = c.reply()
        if r and r[0] == wire.WELCOME:
            c.frame(wire.OPEN, _adapter_open(rng))
    elif _hello_open(c, token, rng, V, adapters):
        base = None
        if kind == "session":  # someone else's session id
            c.frame(
                wire.VERIFY,
                wire.verify(1, 0, b""),
                sid=(c.sid + 1 + int(rng.integers(1000))) % 2**32,
            )
        elif kind == "seq":
            c.frame(wire.CLOSE, b"", seq=c.seq + int(rng.integers(1, 9)))
        elif kind == "vocab":  # ids packed at more bits than the vocabulary needs, or a bad b
            b = ids.bits_for(V)
            if V < 2**b and rng.random() < 0.5:  # an id in [V, 2^b): right width, out of range
                c.frame(
                    wire.VERIFY,
                    wire.verify(1, 0, ids.pack_ids([V + int(rng.integers(2**b - V))], V)),
                )
            else:
                c.frame(
                    wire.VERIFY, wire.verify(1, 0, struct.pack("<HB", 1, b + 1) + b"\xff\xff\xff")
                )
        elif kind == "codec":
            c.frame(wire.VERIFY, wire.verify(int(rng.integers(6, 256)), 0, rng.bytes(8)))
        elif kind == "compressed":  # k-sqs / c-sqs / cu-hlm bodies, valid or lying
            num, body = _compressed_payload(rng, V)
            c.frame(wire.VERIFY, wire.verify(num, c.base, body))
        elif kind == "garbage_body":
            c.frame(
                wire.VERIFY,
                wire.verify(
                    int(rng.integers(1, 6)),
                    int(rng.integers(0, 9)),
                    rng.bytes(int(rng.integers(0, 40))),
                ),
            )
        elif kind == "after_close":
            c.frame(wire.CLOSE)
            c.reply()
            c.frame(wire.VERIFY, wire.verify(1, 0, ids.encode([1], None, V)))
        elif kind == "valid":  # a few good rounds, then a clean close
            for _ in range(int(rng.integers(1, 4))):
                c.frame(
                    wire.VERIFY,
                    wire.verify(
                        1,
                        base or 0,
                        ids.encode(
                            [int(x) for x in rng.integers(0, V, int(rng.integers(0, 4)))], None, V
                        ),
                    ),
                )
                r = c.reply()
                if not r or r[0] != wire.VERDICT:
                    return
                base = wire.read_verdict(r[1]).committed
                if rng.random() < 0.3:
                    c.frame(wire.ROLLBACK, wire.u32(base))
                    c.reply()
            c.frame(wire.CLOSE)
        elif kind == "midframe":  # half a VERIFY, then gone
            f = wire.pack(wire.VERIFY, c.sid, c.seq, wire.verify(1, 0, ids.encode([1, 2], None, V)))
            c.send(f[: int(rng.integers(1, len(f)))])
            return
    try:
        c.s.shutdown(socket.SHUT_WR)  # nothing more comes: a short frame ends here, no stall
    except OSError:
        pass
    c.reply()


KINDS = ("random", "truncated", "lying", "version", "unknown", "token", "no_hello", "session",
         "seq", "vocab", "codec", "garbage_body", "after_close", "valid", "midframe", "compressed",
         "adapter")  # fmt: skip


def fuzz(
    host: str,
    port: int,
    *,
    frames: int = 10_000,
    seed: int = 0,
    token: bytes = b"",
    vocab: int,
    time_limit_s: float = 600.0,
    adapters: tuple = (),
) -> dict:
    """Send at least `frames` frames (or stop at the time limit); return the counts.
    `adapters`: names the server holds, which valid sessions then pick at random."""
    rng = np.random.default_rng(seed)
    stats: Counter = Counter()
    t0 = time.perf_counter()
    while stats["frames"] < frames and time.perf_counter() - t0 < time_limit_s:
        kind = KINDS[int(rng.integers(len(KINDS)))]
        c = _Conn(host, port, stats)
        try:
            _case(kind, c, token, rng, vocab, tuple(adapters))
        finally:
            c.close()
        stats["connections"] += 1
        stats[f"kind_{kind}"] += 1
    out = dict(stats)
    out["seconds"] = time.perf_counter() - t0
    return out


def main(argv=None) -> int:
    ap = doc_parser("python -m apps.cloud.fuzz", __doc__)
    ap.add_argument("server", help="HOST:PORT of a running verifier, or local")
    ap.add_argument("--frames", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--token-file")
    ap.add_argument("--time-limit", type=float, default=600.0)
    a = ap.parse_args(argv)
    from runtime.edge.client import Connection

    if a.server == "local":
        from runtime.edge.local import LocalVerifier

        local = LocalVerifier()
        host, port, token = local.host, local.port, local.token
    else:
        local = None
        host, _, port = a.server.rpartition(":")
        token = open(a.token_file, "rb").read().strip() if a.token_file else b""
    try:
        probe = Connection(host, int(port), token)
        V = probe.welcome.vocab_size
        probe.close()
        out = fuzz(
            host,
            int(port),
            frames=a.frames,
            seed=a.seed,
            token=token,
            vocab=V,
            time_limit_s=a.time_limit,
        )
        if local is not None:
            out["good_client_equals_ar"] = _good_client(host, int(port), token)
            out["server_alive"] = local.proc.poll() is None
    finally:
        if local is not None:
            local.stop()
    print(json.dumps(out))
    return 0


def _good_client(host, port, token) -> bool:
    """After the fuzz: the embedded pair through the server gives the target's greedy tokens."""
    from types import SimpleNamespace

    from runtime.edge.client import Connection
    from runtime.loading import load_pair
    from runtime.session import GenerationSession

    pair = load_pair(None, None, need_draft=True)
    prompt = pair.tokenizer.encode("def fib(n):")

    def tokens(of, method, **options) -> list[int]:  # 32 greedy tokens, no EOS cut
        s = GenerationSession(of, method=method, options=options, eos=(), summarize=False)
        return [t for r in s.stream(prompt, 32, seed=0) for t in r.tokens]

    ref = tokens(pair, "ar")
    conn = Connection(host, port, token)
    # the draft stands in for the target (the verifier holds it), as the companion client runs
    remote = SimpleNamespace(target=pair.draft, draft=pair.draft, tokenizer=None)
    got = tokens(remote, "flexspec", conn=conn, k=4)
    conn.close()
    return got == ref


if __name__ == "__main__":
    sys.exit(main())
