"""The edge side's connection to a cloud verifier: blocking TCP, one request → one reply.

It frames requests (runtime/edge/wire.py), passes them through an optional link emulator (an
object with `start_round() -> rate_bps`, `uplink_s(nbytes)`, `downlink_s(nbytes)`, e.g.
devices.links.LinkEmulator, built by the command layer) whose delays are slept for real (or
kept on the emulator's virtual clock, whose seconds are added to each Exchange's times), and
returns each reply with the bytes that really crossed and where the time went. It does no
drafting (runtime/edge/loop.py) and knows nothing of the server's internals.

A lost server, a refused token or an ERROR frame raise `CloudError`: one line naming the
server and the problem.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

from runtime.edge import wire
from runtime.errors import DuetError


class CloudError(DuetError):
    """The cloud verifier is unreachable, went away, or refused a request."""


@dataclass
class Exchange:
    """One request/reply round: the reply and its cost."""

    header: wire.Header
    body: bytes
    bytes_up: int  # the request frame's length
    bytes_down: int  # the reply frame's length
    rate_bps: float  # the link's rate this round (inf without an emulator)
    uplink_s: float  # emulated uplink wait + time to hand the bytes to the socket
    downlink_s: float  # wall time from sending to the reply (minus server time) + emulated downlink
    wall_s: float


class Connection:
    """A connection to `host:port` that has said HELLO; `welcome` is the server's answer.
    `claim` (runtime/edge/identity.py) asks the verifier to check the draft's identity first;
    `adapter` names the verifier's LoRA adapter every session it opens runs ("" the base)."""

    def __init__(
        self,
        host: str,
        port: int,
        token: bytes = b"",
        *,
        link=None,
        timeout_s: float = 300.0,
        claim: dict | None = None,
        adapter: str = "",
    ):
        self.where = f"{host}:{port}"
        self.link = link
        self.adapter = adapter
        self.seq = 0
        self.session = 0
        try:
            self.sock = socket.create_connection((host, port), timeout=10.0)
        except OSError as e:
            raise CloudError(
                f"cannot reach the cloud verifier at {self.where}: {e.strerror or e}"
            ) from None
        self.sock.settimeout(timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.welcome = wire.read_welcome(self.request(wire.HELLO, wire.hello(token, claim)).body)

    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except TimeoutError:
                raise CloudError(f"the cloud verifier at {self.where} did not answer") from None
            except OSError as e:
                raise CloudError(
                    f"lost the cloud verifier at {self.where}: {e.strerror or e}"
                ) from None
            if not chunk:
                raise CloudError(f"the cloud verifier at {self.where} closed the connection")
            buf += chunk
        return bytes(buf)

    def request(self, ftype: int, payload: bytes) -> Exchange:
        """Send one frame and read its reply; CloudError on an ERROR reply or a lost server."""
        t0 = time.perf_counter()
        v0 = self._virtual()
        frame = wire.pack(ftype, self.session, self.seq, payload)
        rate = float("inf")
        if self.link is not None:
            rate = self.link.start_round()
            self._wait(self.link.uplink_s(len(frame)))  # propagation + serialization
        try:
            self.sock.sendall(frame)
        except OSError as e:
            raise CloudError(
                f"lost the cloud verifier at {self.where}: {e.strerror or e}"
            ) from None
        t1 = time.perf_counter()
        v1 = self._virtual()
        h = wire.unpack_header(self._recv(wire.HEADER_SIZE), 1 << 30)
        body = self._recv(h.length)
        t2 = time.perf_counter()
        if self.link is not None:
            self._wait(self.link.downlink_s(wire.HEADER_SIZE + len(body)))
        t3 = time.perf_counter()
        up_v, down_v = v1 - v0, self._virtual() - v1  # link time on a virtual clock (else 0)
        if h.type == wire.ERROR:
            code, msg = wire.read_error(body)
            raise CloudError(
                f"the cloud verifier at {self.where} refused "
                f"{wire.NAMES[ftype]}: {msg} (error {code})"
            )
        if h.seq != self.seq:
            raise CloudError(f"the cloud verifier at {self.where} answered out of order")
        self.seq += 1
        self.last = Exchange(
            h,
            body,
            len(frame),
            wire.HEADER_SIZE + len(body),
            rate,
            t1 - t0 + up_v,
            (t2 - t1) + (t3 - t2) + down_v,
            t3 - t0 + up_v + down_v,
        )
        return self.last

    def _wait(self, seconds: float) -> None:
        wait = getattr(self.link, "wait", None)  # LinkEmulator: a sleep or its virtual clock
        if wait is None:
            time.sleep(seconds)
        else:
            wait(seconds)

    def _virtual(self) -> float:
        return getattr(self.link, "virtual_s", 0.0) if self.link is not None else 0.0

    def open(self, prompt: list[int], temp: float, top_p: float, top_k: int, seed: int) -> int:
        """Open a session prefilled with `prompt` on this connection's adapter (or the base);
        returns its committed length."""
        x = self.request(
            wire.OPEN,
            wire.open_(
                wire.Open(temp, top_p, top_k, seed & (2**64 - 1), tuple(prompt), self.adapter)
            ),
        )
        self.session = x.header.session
        return wire.read_u32(x.body, "OPENED")

    def verify(self, codec_number: int, base: int, body: bytes) -> tuple[wire.Verdict, Exchange]:
        """Send one encoded window continuing position `base`; returns the verdict."""
        x = self.request(wire.VERIFY, wire.verify(codec_number, base, body))
        return wire.read_verdict(x.body), x

    def rollback(self, keep: int) -> int:
        """Ask the server to drop committed tokens beyond `keep`."""
        return wire.read_u32(self.request(wire.ROLLBACK, wire.u32(keep)).body, "ROLLED")

    def close_session(self) -> None:
        """Close the open session (the connection stays usable for another OPEN)."""
        if self.session:
            self.request(wire.CLOSE, b"")
            self.session = 0

    def close(self) -> None:
        """Close the session (best effort) and the socket."""
        try:
            self.close_session()
        except CloudError:
            pass
        finally:
            self.sock.close()
