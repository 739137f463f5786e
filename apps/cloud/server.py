"""The cloud verifier server: asyncio over plain TCP, frames of runtime/edge/PROTOCOL.md.

Why stdlib asyncio streams and not WebSocket (`websockets`): the protocol already frames
itself (a 16-byte header with the payload length), so WebSocket's framing, HTTP upgrade and
client-to-server masking would only add bytes the link must charge and a dependency; plain TCP
keeps the byte count the link model charges exactly our frame lengths. asyncio gives one
coroutine per connection with `wait_for` timeouts, which is all the server needs.

One connection holds at most one session; a session lives exactly as long as its connection
(a disconnect frees it) and is reachable only through it, so no client can read, advance or
close another's. Model work runs on one worker thread (the target and its caches are touched
by one thread at a time; sessions are verified in arrival order, not batched), so the event
loop keeps serving timeouts and errors while a window is verified. Any protocol error sends an
ERROR frame and closes that connection only.

Adapters (FlexSpec's evolving cloud): the server may hold LoRA-adapted views of its target by
name (runtime/adapter_views.py: one backbone, each view sharing every tensor its adapter does
not touch); a session runs the one its OPEN names, or the base target when OPEN names none.
A name it does not hold gets E_ADAPTER on that connection only.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import secrets
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from apps.cloud.session import Session
from runtime.edge import wire
from runtime.edge.codecs import CODEC_MODULES, codec_for_number
from runtime.edge.identity import check_claim
from runtime.edge.wire import ProtocolError
from runtime.errors import DuetError


@dataclass
class Limits:
    max_sessions: int = 64
    max_context: int | None = None  # None: the target's context
    idle_timeout_s: float = 60.0
    max_frame: int = wire.MAX_FRAME


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and 'localhost'."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class VerifierServer:
    """Holds the target and the open sessions; `serve_forever` runs it on an event loop."""

    def __init__(
        self,
        target,
        *,
        token: bytes | None,
        limits: Limits | None = None,
        identity: dict | None = None,
        adapters: dict | None = None,
    ):
        self.target = target
        self.adapters = dict(adapters or {})  # name -> a view of `target` with that adapter
        self.identity = identity  # runtime.edge.identity.target_identity, for HELLO claims
        self.token = token
        self.limits = limits or Limits()
        ctx = target.config.max_context
        self.max_context = min(ctx, self.limits.max_context or ctx)
        self.sessions: dict[int, Session] = {}
        self.frames_in = self.errors_sent = 0
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify")
        self.server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Bind and start accepting; returns the bound (host, port)."""
        if self.token is None and not is_loopback(host):
            raise DuetError(
                f"refusing to serve on {host} without --token-file (only loopback "
                "addresses may run without a token)"
            )
        self.server = await asyncio.start_server(self._handle, host, port)
        return self.server.sockets[0].getsockname()[:2]

    async def _read(self, reader: asyncio.StreamReader) -> tuple[wire.Header, bytes]:
        try:
            head = await asyncio.wait_for(
                reader.readexactly(wire.HEADER_SIZE), self.limits.idle_timeout_s
            )
        except TimeoutError:
            raise ProtocolError(wire.E_IDLE, f"idle for {self.limits.idle_timeout_s:g} s") from None
        h = wire.unpack_header(head, self.limits.max_frame)
        try:
            body = await asyncio.wait_for(reader.readexactly(h.length), self.limits.idle_timeout_s)
        except TimeoutError:
            raise ProtocolError(
                wire.E_MALFORMED,
                f"{wire.NAMES[h.type]}: payload of {h.length} bytes did not arrive",
            ) from None
        self.frames_in += 1
        return h, body

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.worker, fn, *args)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sid, seq, state = 0, 0, "hello"  # hello -> ready -> open -> (closed -> ready)
        try:
            while True:
                h, body = await self._read(reader)
                if h.seq != seq:
                    raise ProtocolError(
                        wire.E_SEQUENCE,
                        f"{wire.NAMES[h.type]} has sequence number {h.seq}; expected {seq}",
                    )
                if h.session != sid:
                    raise ProtocolError(
                        wire.E_SESSION,
                        f"{wire.NAMES[h.type]} names session "
                        f"{h.session}; this connection holds {sid or 'none'}",
                    )
                reply = await self._dispatch(state, h, body, sid)
                ftype, payload, state, new_sid = reply
                writer.write(wire.pack(ftype, new_sid or sid, seq, payload))
                sid = new_sid
                await writer.drain()
                seq += 1
        except ProtocolError as e:
            self.errors_sent += 1
            try:
                writer.write(wire.pack(wire.ERROR, sid, seq, wire.error(e.code, str(e))))
                await writer.drain()
            except (ConnectionError, OSError):
                pass
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass  # the client left (mid-frame or not): free its session below
        except Exception as e:  # a bug must not take the server down: report, close this one
            print(f"apps.cloud: internal error: {type(e).__name__}: {e}", file=sys.stderr)
            try:
                writer.write(
                    wire.pack(wire.ERROR, sid, seq, wire.error(wire.E_INTERNAL, "internal error"))
                )
            except (ConnectionError, OSError):
                pass
        finally:
            self.sessions.pop(sid, None)
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass

    async def _dispatch(self, state: str, h: wire.Header, body: bytes, sid: int):
        """(reply type, reply payload, next state, session id) for one well-framed request."""
        t = h.type
        if state == "hello":
            if t != wire.HELLO:
                raise ProtocolError(wire.E_AUTH, f"expected HELLO first, got {wire.NAMES[t]}")
            token, claim = wire.read_hello(body)
            if self.token is not None and not hmac.compare_digest(token, self.token):
                raise ProtocolError(wire.E_AUTH, "wrong token")  # constant-time comparison
            if claim is not None:  # a bundle's draft: can this target verify it?
                check_claim(
                    claim, self.identity, self.target.config.vocab_size, tuple(CODEC_MODULES)
                )
            w = wire.Welcome(
                self.target.config.vocab_size,
                self.max_context,
                self.limits.max_frame,
                tuple(CODEC_MODULES),
            )
            return wire.WELCOME, wire.welcome(w), "ready", 0
        if t == wire.OPEN and state == "ready":
            o = wire.read_open(body)
            model = self._model_for(o.adapter)
            if len(self.sessions) >= self.limits.max_sessions:
                raise ProtocolError(
                    wire.E_LIMIT,
                    f"{self.limits.max_sessions} sessions are open "
                    "(the server's limit); try again later",
                )
            new = secrets.randbits(32) or 1
            while new in self.sessions:
                new = secrets.randbits(32) or 1
            self.sessions[new] = None  # reserve the slot while prefilling
            try:
                sess = await self._run(Session, model, o, self.max_context)
            except BaseException:
                self.sessions.pop(new, None)
                raise
            self.sessions[new] = sess
            return wire.OPENED, wire.u32(len(sess.seq)), "open", new
        if t == wire.VERIFY and state == "open":
            num, base, payload = wire.read_verify(body)
            v = await self._run(self._verify, self.sessions[sid], num, payload, base)
            return wire.VERDICT, wire.verdict(v), "open", sid
        if t == wire.ROLLBACK and state == "open":
            n = await self._run(self.sessions[sid].rollback, wire.read_u32(body, "ROLLBACK"))
            return wire.ROLLED, wire.u32(n), "open", sid
        if t == wire.CLOSE and state == "open":
            wire.read_u32(body, "CLOSE") if body else None
            sess = self.sessions.pop(sid)
            return wire.CLOSED, wire.u32(len(sess.seq)), "ready", 0
        raise ProtocolError(wire.E_SEQUENCE, f"{wire.NAMES[t]} is not valid now (state {state})")

    def _verify(self, sess: Session, num: int, payload: bytes, base: int) -> wire.Verdict:
        """Decode a VERIFY payload and verify it, on the worker. The verdict's server seconds
        count the decode too: unranking a compressed q is cloud work, not link time (and off
        the event loop, it no longer stalls the other connections)."""
        t0 = time.perf_counter()
        draft = codec_for_number(num).decode(payload, self.target.config.vocab_size)
        v = sess.verify(draft, base)
        return replace(v, server_s=time.perf_counter() - t0)

    def _model_for(self, adapter: str):
        """The base target (no name) or the named adapter's view; E_ADAPTER for another name."""
        if not adapter:
            return self.target
        if adapter not in self.adapters:
            held = ", ".join(sorted(self.adapters)) or "none"
            raise ProtocolError(
                wire.E_ADAPTER,
                f"OPEN names adapter {adapter[:64]!r}, which "
                f"this verifier does not hold (it holds: {held})",
            )
        return self.adapters[adapter]

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self.worker.shutdown(wait=False, cancel_futures=True)


class ServerThread:
    """A VerifierServer on its own event loop in a daemon thread (tests, benchmarks):
    `host`, `port`, `server`; `stop()` closes it."""

    def __init__(
        self,
        target,
        *,
        token: bytes | None = None,
        limits: Limits | None = None,
        host: str = "127.0.0.1",
        identity: dict | None = None,
        adapters: dict | None = None,
    ):
        import threading

        self.server = VerifierServer(
            target, token=token, limits=limits, identity=identity, adapters=adapters
        )
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            self.host, self.port = self.loop.run_until_complete(self.server.start(host, 0))
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True, name="verifier")
        self.thread.start()
        ready.wait(30)

    def open_sessions(self) -> int:
        """Sessions open right now (read on the server's loop)."""
        fut = asyncio.run_coroutine_threadsafe(self._count(), self.loop)
        return fut.result(10)

    async def _count(self) -> int:
        return len(self.server.sessions)

    def stop(self) -> None:
        """Close the listener, cancel every connection's task, stop the loop and the thread."""
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _shutdown(self) -> None:
        self.server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
