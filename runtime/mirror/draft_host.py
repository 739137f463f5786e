"""The draft process's handle on the target's side: spawning it, its pipe, its end.

The draft process is spawned once per draft model (multiprocessing's 'spawn' context: no fork
of the target's threads or accelerator state) and kept on the draft object (`draft_host`), so
it serves one generation after another. A process that dies is noticed at once (the target
waits on the pipe *and* the process's sentinel) and raised as one clear RuntimeError, the
process reaped; a child that does not answer a quit within QUIT_TIMEOUT_S is killed. What the
child runs is runtime/mirror/draft_child.py.
"""

from __future__ import annotations

import atexit
import time
from contextlib import contextmanager
from multiprocessing import connection, get_context

from runtime.errors import DuetError
from runtime.mirror import shm_channel as wire
from runtime.mirror.draft_child import child_main

LOAD_TIMEOUT_S = 300.0  # spawning + importing + loading (an on-the-fly ONNX export included)
STOP_TIMEOUT_S = 1.0  # a child that does not acknowledge a stop by then is killed
# a child asked to quit exits its interpreter (torch and ONNX Runtime torn down): on a loaded
# 2-core machine that took over 1 s (a fresh-clone test run at load 8 saw it killed)
QUIT_TIMEOUT_S = 10.0
POLL_S = 0.05


class DraftHost:
    """The draft process and the target's end of its pipe."""

    def __init__(self, spec: tuple):
        ctx = get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.lock = ctx.Lock()  # guards the completed-branch board (shm_board.SharedBoard)
        self.proc = ctx.Process(
            target=child_main, args=(child, spec, self.lock), name="duet-draft-process", daemon=True
        )
        self.proc.start()
        child.close()
        self.cached: list[int] = []  # the tokens the child's draft cache holds
        self.alive = True
        self.import_records = None  # the draft's hook for the child's stage records, if any
        atexit.register(self.close)
        tag = self.recv(timeout=LOAD_TIMEOUT_S)
        if tag[:1] != wire.READY:
            self.close()
            raise DuetError(f"the draft process could not load {spec[0]}: {tag[1:].decode()}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, data: bytes) -> None:
        try:
            self.conn.send_bytes(data)
        except OSError:  # BrokenPipeError: the child is gone
            self._died()

    def recv(self, timeout: float | None = None) -> bytes:
        """The next message; RuntimeError at once if the process died, or after `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ready = connection.wait([self.conn, self.proc.sentinel], POLL_S)
            if self.conn in ready:  # read what it sent before dying first
                try:
                    return self.conn.recv_bytes()
                except (EOFError, OSError):
                    self._died()
            if self.proc.sentinel in ready:
                self._died()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the draft process (pid {self.pid}) did not answer")

    @contextmanager
    def busy(self, branches: int):
        """A context in which the draft process loops `branches`-row draft passes (what its
        branch waves compute), for measuring the target beside it (devices/pair_probe.py)."""
        self.send(wire.BUSY + str(branches).encode())
        tag = self.recv(timeout=LOAD_TIMEOUT_S)  # the loop's first pass has run
        if tag[:1] != wire.BUSY:
            raise RuntimeError(f"the draft process did not start its loop: {tag[:40]!r}")
        try:
            yield
        finally:
            self.send(wire.IDLE)  # any message ends the loop; it answers when it stops
            while self.recv(timeout=STOP_TIMEOUT_S)[:1] != wire.IDLE:
                pass

    def _died(self):
        self.proc.join(STOP_TIMEOUT_S)
        code = self.proc.exitcode
        self.close()
        raise RuntimeError(
            f"the Mirror-SD draft process (pid {self.pid}) died (exit code {code}); "
            "the generation stopped, the next one starts a fresh draft process"
        )

    def close(self) -> None:
        """Ask the child to quit; kill it if it does not within QUIT_TIMEOUT_S. Idempotent."""
        if not self.alive:
            return
        self.alive = False
        try:
            self.conn.send_bytes(wire.QUIT)
        except OSError:
            pass
        self.proc.join(QUIT_TIMEOUT_S)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(STOP_TIMEOUT_S)
        self.conn.close()
        atexit.unregister(self.close)


def draft_host(draft) -> DraftHost:
    """The draft process serving `draft` (spawned on first use, again after it died)."""
    spec = getattr(draft, "process_spec", None) or getattr(draft, "load_spec", None)
    if spec is None:
        raise DuetError(
            f"--draft-process needs a draft loaded from a path; this {type(draft).__name__} "
            "cannot be sent to another process (an adapter view or an in-memory model?)"
        )
    host = getattr(draft, "_duet_draft_host", None)
    if host is None or not host.alive:
        host = DraftHost(spec)
        host.import_records = getattr(draft, "import_records", None)
        draft._duet_draft_host = host
    return host


def close_draft_hosts(*drafts) -> None:
    """Stop the draft processes serving `drafts` (draft_host), at the end of the run that
    started them: one spawned per model object otherwise lives until the interpreter exits,
    and a process that wraps pairs again (apps.bench --emulate) would gather them."""
    for d in {id(d): d for d in drafts if d is not None}.values():
        host = getattr(d, "_duet_draft_host", None)
        if host is not None:
            host.close()
