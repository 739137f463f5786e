"""The draft process's side of `--draft-process`: load the draft, then serve generations.

Per generation it runs the unchanged DraftWorker loop (draft_worker.py) in its main thread,
with the worker's two queues replaced by the shared-memory channel (shm_channel.py: the pipe's
tags in `_PipeInbox`, windows and failures out through `_PipeOutbox`) and the board of
completed branches by a shm_board.SharedBoard. Its KV cache is kept between generations (the
target side tracks which prefix it holds), as chat keeps caches. The child ignores SIGINT:
Ctrl-C is the target's, whose `finally` stops it. An emulated draft (devices.emulated_model)
comes as its `process_spec`, whose fourth item the child calls on the loaded draft; a draft
with `export_records` sends its stage records home at the end of each generation.
"""

from __future__ import annotations

import pickle
import queue
import signal

from runtime.decoding.events import rewind
from runtime.mirror import shm_channel as wire
from runtime.mirror.draft_worker import DraftWorker
from runtime.mirror.messages import STOP, Window, WorkerFailed
from runtime.mirror.shm_board import SharedBoard
from runtime.mirror.shm_channel import Slots
from runtime.mirror.timeline import Timeline


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
