"""The Mirror-SD draft worker in its own process (`--draft-process`).

The draft process is spawned once per draft model (multiprocessing's 'spawn' context: no
fork of the target's threads or accelerator state), loads the draft from its `load_spec`,
and then serves one generation after another: per generation it runs the unchanged
DraftWorker loop (draft_worker.py) in its main thread, with the worker's two queues
replaced by the shared-memory channel (shm_channel.py). Its KV cache is kept between
generations (the target side tracks which prefix it holds), as chat keeps caches.

Failure behaviour is the thread worker's: a worker exception comes back as an error; a
process that dies is noticed at once (the target waits on the pipe *and* the process's
sentinel) and raised as one clear RuntimeError, the process reaped; closing the generator
early or Ctrl-C (the child ignores SIGINT; the target's `finally` stops it) ends the
generation, and a child that does not answer the stop within 1 s is killed.

The board of completed branches (board.Board) is shared too: both sides hold a
shm_board.SharedBoard (under a multiprocessing Lock), which the child injects into the
unchanged DraftWorker; on reuse the target takes its next window at once, as with the thread
worker. An emulated draft (devices.emulated_model) goes as its `process_spec`, whose
fourth item the child calls on the loaded draft to pad its stages to the same profile; a
draft with `export_records` sends its stage records home at the end of each generation, to
the parent's `import_records` (the emulator's summary then counts the draft's stages too).
"""

from __future__ import annotations

import atexit
import pickle
import queue
import signal
import time
from contextlib import contextmanager
from multiprocessing import connection, get_context

from runtime.decoding.events import Sampling, rewind
from runtime.errors import DuetError
from runtime.mirror import shm_channel as wire
from runtime.mirror.draft_worker import DEFAULT_BRANCH_BATCH, DraftWorker
from runtime.mirror.messages import STOP, EarlyExit, FinalVerify, Window, WorkerFailed
from runtime.mirror.shm_board import SharedBoard
from runtime.mirror.shm_channel import Layout, Slots
from runtime.mirror.timeline import Timeline, now_ns

LOAD_TIMEOUT_S = 300.0  # spawning + importing + loading (an on-the-fly ONNX export included)
STOP_TIMEOUT_S = 1.0  # a child that does not acknowledge a stop by then is killed
# a child asked to quit exits its interpreter (torch and ONNX Runtime torn down): on a loaded
# 2-core machine that took over 1 s (a fresh-clone test run at load 8 saw it killed)
QUIT_TIMEOUT_S = 10.0
POLL_S = 0.05


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


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


class ProcessDraftWorker:
    """DraftWorker's target-side interface over a DraftHost and the shared-memory slots."""

    def __init__(
        self,
        host: DraftHost,
        *,
        sampling: Sampling,
        seed: int,
        gamma: int,
        kappa: int,
        vocab: int,
        max_new: int,
        ctx: int,
        timeline: Timeline,
        branch_batch: int = DEFAULT_BRANCH_BATCH,
        draft_branches: int = 0,
    ):
        self.host, self.tl = host, timeline
        # the board holds every branch key: κ early-exit and m draft candidates per position
        layout = Layout(gamma, kappa + draft_branches, vocab, not sampling.greedy)
        self.slots = Slots(layout)
        self.board = SharedBoard(layout, host.lock)
        self.args = dict(
            sampling=sampling,
            seed=seed,
            gamma=gamma,
            max_new=max_new,
            ctx=ctx,
            branch_batch=branch_batch,
            draft_branches=draft_branches,
        )

    def start(self, seq: list[int]) -> None:
        keep = _common_prefix(self.host.cached, seq)
        args = dict(
            self.args,
            seq=list(seq),
            keep=keep,
            names=self.slots.names,
            board=self.board.name,
            layout=self.slots.layout,
        )
        self.host.send(wire.BEGIN + pickle.dumps(args))

    def send(self, msg) -> None:
        if isinstance(msg, EarlyExit):
            slot = self.slots.put_early_exit(msg)
            self.host.send(wire.EE + bytes([slot]))
        else:
            assert isinstance(msg, FinalVerify)
            slot = self.slots.put_final(msg)
            self.host.send(wire.FV + bytes([slot]))

    def receive(self, step: int) -> Window:
        """The window for `step`; raises promptly if the worker failed or its process died."""
        tag = self.host.recv()
        if tag[:1] == wire.FAIL:
            raise RuntimeError(f"Mirror-SD draft process failed: {tag[1:].decode()}")
        assert tag[:1] == wire.WIN, f"unexpected message {tag[:1]!r} from the draft process"
        win = self.slots.get_window()
        self._add_intervals(win.info.pop("intervals", []))
        assert win.step == step, f"window for step {win.step}, expected {step}"
        self.tl.add("channel", "window", win.sent_ns, now_ns(), step=step, source=win.source)
        return win

    def take(self, step: int, accepted: int, token: int) -> Window | None:
        """The target's side of reuse: the completed branch (A, c) of `step` from the shared
        board, if the draft published it; the draft then does not send that window again."""
        return self.board.take(step, (accepted, token))

    def finish(self, seq: list[int], draft_cache=None) -> None:
        """Stop this generation; the child keeps the committed prefix of `seq` cached.

        `draft_cache` (the caller's in-process cache) is left as it was: it never ran here."""
        try:
            if self.host.alive:
                self.host.send(wire.STOP_TAG + str(len(seq)).encode())
                deadline = time.monotonic() + STOP_TIMEOUT_S
                while (tag := self.host.recv(max(0.0, deadline - time.monotonic())))[
                    :1
                ] != wire.IDLE:
                    pass  # a window or failure sent before the stop arrived
                kept, ivs, recs = pickle.loads(tag[1:])
                self.host.cached = list(seq[:kept])
                self._add_intervals(ivs)
                if recs and self.host.import_records is not None:
                    self.host.import_records(recs)
        except TimeoutError:
            self.host.close()
        except RuntimeError:  # it died: already reaped, and reported by receive if it mattered
            pass
        finally:
            self.slots.close()
            self.board.release()

    def _add_intervals(self, ivs) -> None:
        for lane, name, s, e, args in ivs:
            self.tl.add(lane, name, s, e, **args)


# ---- the draft process ------------------------------------------------------------------------


class _PipeInbox:
    """DraftWorker's inbox in the child: the pipe's tags, read from the slots."""

    def __init__(self, conn, slots: Slots):
        self.conn, self.slots = conn, slots
        self.stop_tag: bytes | None = None  # b"S<committed length>" once the target stopped

    def get(self, timeout: float | None = None):
        if not self.conn.poll(timeout):
            raise queue.Empty
        try:
            tag = self.conn.recv_bytes()
        except EOFError:  # the target's process is gone
            return STOP
        if tag[:1] == wire.EE:
            return self.slots.get_early_exit(tag[1])
        if tag[:1] == wire.FV:
            return self.slots.get_final(tag[1])
        self.stop_tag = tag
        return STOP

    def get_nowait(self):
        return self.get(0)

    def put(self, msg) -> None:  # DraftWorker.stop's STOP: unused in the child
        pass


class _PipeOutbox:
    """DraftWorker's outbox in the child: windows into the slot, failures as text."""

    def __init__(self, conn, slots: Slots, tl: Timeline):
        self.conn, self.slots, self.tl = conn, slots, tl
        self.sent = 0  # intervals already shipped
        self.failed = False

    def intervals(self) -> list[tuple]:
        new = self.tl.intervals[self.sent :]
        self.sent += len(new)
        return [(i.lane, i.name, i.start_ns, i.end_ns, i.args) for i in new]

    def put(self, msg) -> None:
        if isinstance(msg, WorkerFailed):
            self.failed = True
            self.conn.send_bytes(wire.FAIL + f"{type(msg.error).__name__}: {msg.error}".encode())
            return
        info = dict(msg.info, intervals=self.intervals())
        self.slots.put_window(Window(msg.step, msg.tokens, msg.q, msg.sent_ns, msg.source, info))
        self.conn.send_bytes(wire.WIN)


def child_main(conn, spec: tuple, lock) -> None:
    """The draft process: load the draft, then serve generations until QUIT or the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the target's; it stops us
    try:
        from runtime.backends import load_model

        path, backend, kw, *wrap = spec  # wrap: a picklable model -> model (an emulation)
        draft = load_model(path, backend, **kw)
        if wrap and wrap[0] is not None:
            draft = wrap[0](draft)
        if backend != "torch":
            _row_kernels(kw)
    except BaseException as e:  # noqa: BLE001 (reported to the target, which raises it)
        conn.send_bytes(wire.FAIL + f"{type(e).__name__}: {e}".encode())
        return
    conn.send_bytes(wire.READY)
    cache = draft.new_cache()
    try:
        while True:
            msg = conn.recv_bytes()
            if msg[:1] == wire.QUIT:
                return
            if msg[:1] == wire.BEGIN:
                cache = _serve(conn, draft, cache, pickle.loads(msg[1:]), lock)
            elif msg[:1] == wire.BUSY:
                _busy(conn, draft, int(msg[1:]))
            # anything else is a stop for a generation that already ended: ignore it
    except EOFError:  # the target's process is gone
        return


def _row_kernels(kw: dict) -> None:
    """The row kernels run on PyTorch (kernels.topk_channel.rows_torch), greedy too (the own
    branches' log-softmax): load it before READY, on the draft's own thread budget. Loaded at a
    sampled generation's start only, a greedy run imported it inside its first step, at
    PyTorch's default of every core, spread over cores the target uses: mirror at T = 0 went
    from 0.92-0.94x to 0.76-0.80x sd here (torch target, --draft-process), 0.51x on an H100."""
    import torch

    torch.set_num_threads(max(1, int(kw.get("intra_threads") or kw.get("threads") or 1)))


def _busy(conn, draft, branches: int) -> None:
    """DraftHost.busy's loop: batched draft passes on a scratch cache (the generation cache
    is untouched) until the target's next message, which it answers with IDLE."""
    import numpy as np

    scratch = draft.new_cache()
    draft.forward(np.arange(1, 65, dtype=np.int64)[None] % draft.config.vocab_size, scratch)
    rows, x = scratch.fork([0] * branches), np.ones((branches, 1), np.int64)
    draft.forward(x, rows)
    rows.trim(1)
    conn.send_bytes(wire.BUSY)
    while not conn.poll(0):
        draft.forward(x, rows)
        rows.trim(1)
    conn.recv_bytes()
    conn.send_bytes(wire.IDLE)


def _serve(conn, draft, cache, args: dict, lock):
    """One generation: DraftWorker's loop over the slots; returns the cache to keep."""
    rewind(cache, args["keep"])
    slots = Slots(args["layout"], args["names"])
    board = SharedBoard(args["layout"], lock, args["board"])
    tl = Timeline()
    w = DraftWorker(
        draft,
        sampling=args["sampling"],
        seed=args["seed"],
        gamma=args["gamma"],
        max_new=args["max_new"],
        ctx=args["ctx"],
        timeline=tl,
        cache=cache,
        branch_batch=args["branch_batch"],
        draft_branches=args["draft_branches"],
        board=board,
        inbox=_PipeInbox(conn, slots),
        outbox=_PipeOutbox(conn, slots, tl),
    )
    try:
        w.run(args["seq"])  # the worker's loop, in this process's main thread
        while w.inbox.stop_tag is None:  # it failed: wait for the target's stop
            if w.inbox.get() is STOP and w.inbox.stop_tag is None:
                raise EOFError
        # after a failure the cache's state is unknown: start the next generation from empty
        kept = 0 if w.outbox.failed else min(int(w.inbox.stop_tag[1:]), len(w.seq))
        rewind(w.cache, kept)
        export = getattr(draft, "export_records", None)  # an emulated draft's stage records
        recs = export() if export is not None else []
        conn.send_bytes(wire.IDLE + pickle.dumps((kept, w.outbox.intervals(), recs)))
        return draft.new_cache() if w.outbox.failed else w.cache
    finally:
        slots.close()
        board.release()
