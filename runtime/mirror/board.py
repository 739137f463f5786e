"""The board of completed branches between Mirror-SD's draft worker and its target.

Each step the draft worker rolls out branches (A, c) of the window being verified; the moment
a branch's rollout completes, its next window is *published* on the board. The target, once
it holds the verdict (A, c), *takes* that window at once (reuse without a rendezvous) and so
*claims* the board: the worker, closing the step, sees the claim and does not send the window
again. The worker talks to the board only through `Board` below; the target through `take`.

  LocalBoard  the worker in a thread of the target's process: a dict under a threading.Lock
  SharedBoard the worker in its own process (--draft-process): runtime/mirror/shm_board.py

Keys are (accepted length A, correction token c); a window published for step s is the
window of step s + 1.
"""

from __future__ import annotations

import threading
from typing import Protocol

from runtime.mirror.messages import Window

Key = tuple[int, int]  # (A, c)


class Board(Protocol):
    """What Mirror-SD's draft worker and the target share about completed branches.

    One step's board is open at a time. Every method is safe to call from either side at any
    moment (each implementation holds its own lock); the worker alone opens, publishes and
    closes, the target alone takes."""

    # whether `publish` needs each window's q as one (γ, V) array (True), or takes a list of
    # the wave's rows (False: the board copies every row anyway, so stacking would copy twice)
    stacked: bool

    def open(self, step: int) -> None:
        """The worker: open `step`'s board, empty and unclaimed (any earlier step's board goes)."""

    def publish(self, step: int, windows: dict[Key, Window]) -> None:
        """The worker: post completed branches of `step`, keyed by (A, c). Ignored unless
        `step`'s board is open (the worker may finish a pass after closing it)."""

    def take(self, step: int, key: Key) -> Window | None:
        """The target: the window published under `key` on `step`'s board, marking the board
        claimed; None when `step`'s board is not open or holds no such window (a miss never
        undoes a claim: the target may be a whole step ahead of the worker)."""

    def claimed(self) -> bool:
        """Whether the target took a window from the open board (False when none is open)."""

    def close(self) -> bool:
        """The worker: close the open board; returns whether the target claimed it. Takes
        after this return None until the next `open`."""


class LocalBoard:
    """The board for a worker thread: a dict of windows, a step and a claim under one lock.
    Windows are kept as published (their q already one array: `stacked`)."""

    stacked = True

    def __init__(self):
        self._lock = threading.Lock()
        self._ready: dict[Key, Window] = {}
        self._step = -1  # the open step (-1: closed)
        self._claimed = False

    def open(self, step: int) -> None:
        with self._lock:
            self._ready, self._step, self._claimed = {}, step, False

    def publish(self, step: int, windows: dict[Key, Window]) -> None:
        with self._lock:
            if self._step == step:
                self._ready.update(windows)

    def take(self, step: int, key: Key) -> Window | None:
        with self._lock:
            win = self._ready.get(key) if self._step == step else None
            if win is not None:
                self._claimed = True
        return win

    def claimed(self) -> bool:
        with self._lock:
            return self._step >= 0 and self._claimed

    def close(self) -> bool:
        with self._lock:
            claimed, self._step, self._ready, self._claimed = self._claimed, -1, {}, False
        return claimed
