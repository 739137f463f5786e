"""The board of completed branches in shared memory (board.Board across two processes).

The Mirror-SD draft process (draft_process.py) publishes each branch (A, c) the moment its
rollout completes; the target, in its own process, holding the verdict, takes the branch at
once and marks the board claimed, so the draft does not send that window again. Both sides
map one `multiprocessing.shared_memory` buffer (the target creates it, the draft attaches by
name) and hold one multiprocessing Lock around every access, with a bound: a process killed
while holding the lock must not leave the other blocked forever.

Layout: a header (step, -1 when closed; entries; claimed), then one row per branch key (κ
early-exit and m own candidates per window position): _META fields, the tokens, the q rows.
"""

from __future__ import annotations

from multiprocessing import shared_memory

import numpy as np

from runtime.mirror.board import Key
from runtime.mirror.messages import Window
from runtime.mirror.shm_channel import Layout

# a board entry's fields before its tokens: a, c, n, sent, ee_recv, ready, whether its q rows
# are logits (Window.logits), and whether (a, c) was one of the draft's own branches ("own")
_META = 8
LOCK_TIMEOUT_S = 1.0  # the board's lock is held for microseconds; longer means a dead holder


class SharedBoard:
    """board.Board in shared memory: `name` None creates the buffer (the target's side, which
    unlinks it on `release`), else attaches to it (the draft process's side)."""

    stacked = False  # publish copies each q row into shared memory itself

    def __init__(self, layout: Layout, lock, name: str | None = None):
        L = self.layout = layout
        self.cap = (L.gamma + 1) * L.kappa
        self.lock = lock
        qb = 4 * L.q_rows * L.vocab
        row = 8 * (_META + L.gamma) + qb + (-qb) % 8  # _META's fields; toks; q
        size = 8 * 3 + self.cap * row
        self.owner = name is None
        self.shm = (
            shared_memory.SharedMemory(create=True, size=size)
            if name is None
            else shared_memory.SharedMemory(name=name)
        )
        buf = self.shm.buf
        self.head = np.ndarray((3,), np.int64, buf, 0)
        self.meta = np.ndarray((self.cap, _META + L.gamma), np.int64, buf, 24, (row, 8))
        self.q = np.ndarray(
            (self.cap, L.q_rows, L.vocab),
            np.float32,
            buf,
            24 + 8 * (_META + L.gamma),
            (row, 4 * L.vocab, 4),
        )
        if self.owner:
            self.head[:] = (-1, 0, 0)

    @property
    def name(self) -> str:
        return self.shm.name

    # ---- the draft's side: a lock not released within 10 s is an error -----------------------
    def _held(self):
        if not self.lock.acquire(timeout=10 * LOCK_TIMEOUT_S):
            raise RuntimeError("the completed-branch board's lock was never released")
        return _Release(self.lock)

    def open(self, step: int) -> None:
        with self._held():
            self.head[:] = (step, 0, 0)

    def close(self) -> bool:
        with self._held():
            claimed = bool(self.head[2])
            self.head[:] = (-1, 0, 0)
        return claimed

    def claimed(self) -> bool:
        with self._held():
            return int(self.head[0]) >= 0 and bool(self.head[2])

    def publish(self, step: int, windows: dict[Key, Window]) -> None:
        with self._held():
            if int(self.head[0]) == step:
                for key, w in windows.items():
                    self._put(key, w)

    def _put(self, key: Key, w: Window) -> None:
        n = int(self.head[1])
        if n >= self.cap or any(tuple(self.meta[i, :2]) == key for i in range(n)):
            return
        g = len(w.tokens)
        self.meta[n, :_META] = (key[0], key[1], g, w.sent_ns, w.info["ee_recv_ns"],
                                w.info["ready_ns"], int(w.logits),
                                int(w.info.get("own", False)))  # fmt: skip
        self.meta[n, _META : _META + g] = w.tokens
        if self.layout.q_rows and g:
            for i, row in enumerate(w.q):  # an array, or a wave's rows (not `stacked`)
                self.q[n, i] = row
        self.head[1] = n + 1

    # ---- the target's side: a lock not released within 1 s is a miss ------------------------
    def take(self, step: int, key: Key) -> Window | None:
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_S):  # a child killed holding it:
            return None  # the target's receive() then reports the death
        try:
            return self._find(step, key)
        finally:
            self.lock.release()

    def _find(self, step: int, key: Key) -> Window | None:
        if int(self.head[0]) != step:
            return None
        for i in range(int(self.head[1])):
            a, c, g, sent, ee_recv, ready, logits, own = (int(x) for x in self.meta[i, :_META])
            if (a, c) == key:
                self.head[2] = 1
                q = (
                    self.q[i, :g].copy()
                    if self.layout.q_rows
                    else np.zeros((0, self.layout.vocab), np.float32)
                )
                info = {"ee_recv_ns": ee_recv, "ready_ns": ready, "source": "reuse",
                        "fallback_ns": 0, "shared": True, "own": bool(own)}  # fmt: skip
                toks = self.meta[i, _META : _META + g].tolist()
                return Window(step + 1, toks, q, sent, "reuse", info, bool(logits))
        return None

    def release(self) -> None:
        """Drop the mapping; the creating side also unlinks the name. Idempotent."""
        if self.head is None:
            return
        self.head = self.meta = self.q = None
        try:
            self.shm.close()
        except BufferError:  # a view still alive elsewhere: the mapping goes with the process
            pass
        if self.owner:
            try:
                self.shm.unlink()
            except FileNotFoundError:
                pass


class _Release:
    """A held lock as a context: released on exit."""

    def __init__(self, lock):
        self.lock = lock

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.lock.release()
        return False
