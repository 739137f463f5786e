"""The draft's worker thread in Mirror-SD.

Per step:
  - while the target runs its prefix, feed d_γ: the draft cache then holds
    `committed + d1..dγ`, the shared prefix of every branch;
  - with `draft_branches` m > 0, that feed re-runs the whole window in one pass, which gives
    the draft's own law at every window position, and the worker rolls out the branches
    (j, v) of the draft's own m runner-up tokens v at each position j (most likely first,
    by the draft's path log-probability) until the early-exit message comes, so the target's
    prefix is not idle time for the draft (Mirror-SD §3.1's branch candidates, widened);
  - on the early-exit message, rank every branch (j, v) of the hypothesis tree
    (most likely first) and roll them out in waves of `branch_batch` rows, one
    batched pass per token for all depths at once: row (j, v) attends to
    `committed + d1..dj` only (a per-row key mask hides d_{j+1}..dγ) and its v
    sits at position |committed| + j. Between passes the worker checks for the
    final-verification message (work-conserving: it keeps going until it comes);
  - on (A, c): a completed row (A, c) *is* the next window (reuse: its cache row
    is committed and the mask's holes closed); a row whose wave was cut short is
    continued where it stopped (resume); otherwise a fresh rollout from
    `committed + c` (fallback).
The step's rollouts (own branches, the early exit's, waves, publishing) are
runtime/mirror/rollouts.py; the waves themselves (forked rows, masks, joining, reading a row's
window back) are runtime/mirror/wave.py.

Randomness: the window that follows (A, c) at step s is drawn with the generator
seeded by (seed, s, A, c) whether it comes from a branch, a resumed branch or a
fallback, so sampled output does not depend on how far the rollouts got, and
each token is drawn from exactly the q sent with it (App. B).
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np

from runtime.decoding.events import Sampling, rewind, window_rng
from runtime.decoding.sd import draft_window
from runtime.errors import DuetError
from runtime.mirror.board import Board, LocalBoard
from runtime.mirror.branches import Branch, reuse_key
from runtime.mirror.messages import STOP, FinalVerify, Window, WorkerFailed
from runtime.mirror.rollouts import BranchRollouts
from runtime.mirror.timeline import Timeline, now_ns
from runtime.mirror.wave import Wave

DEFAULT_BRANCH_BATCH = 16  # emulated m3-max: 16 beat 8 at T = 0 and 1 (session 6 notes)


class _Stopped(Exception):
    pass


def own_branches(draft, asked: int) -> int:
    """The runner-up branches per position that the worker rolls out from the draft's own law
    before the early exit: `asked`, or 0 for a hybrid draft (its linear states do not re-run
    a window in place). An SS draft re-runs the window with its main stream."""
    return 0 if getattr(draft.config, "is_hybrid", False) else asked


class DraftWorker(BranchRollouts):
    """Owns the draft model and its cache; talks to the target only through two queues and the
    board of completed branches (board.Board).

    board: where completed branches are published (None: a LocalBoard, for a worker thread);
    inbox, outbox: the target's messages in, the windows out (None: queue.Queue; anything with
    get(timeout) / get_nowait() / put(), as draft_process.py's pipe ends)."""

    def __init__(
        self,
        draft,
        *,
        sampling: Sampling,
        seed: int,
        gamma: int,
        max_new: int,
        ctx: int,
        timeline: Timeline,
        cache=None,
        branch_batch: int = DEFAULT_BRANCH_BATCH,
        draft_branches: int = 0,
        board: Board | None = None,
        inbox=None,
        outbox=None,
    ):
        self.draft, self.sampling, self.seed = draft, sampling, seed
        self.gamma, self.max_new, self.ctx = gamma, max_new, ctx
        self.branch_batch = branch_batch
        self.draft_branches = own_branches(draft, draft_branches)
        self.tl = timeline
        self.cache = cache if cache is not None else draft.new_cache()
        self.inbox = inbox if inbox is not None else queue.Queue()
        self.outbox = outbox if outbox is not None else queue.Queue()
        self._stop = threading.Event()
        self._stash: FinalVerify | None = None
        # Completed branches, published as each wave pass finishes, so that on reuse the
        # target takes its next window at once instead of waiting out an in-flight pass.
        self.board: Board = board if board is not None else LocalBoard()
        self._noise_step, self._noise_uv = -1, None  # the step whose noise _noise drew, and it
        # this step's own runner-up branches (depth, token), ranked or not yet rolled out: a
        # window says whether its step's (A, c) was one ("own"), which auto's Ω̂_own pools
        self._own_keys: set[tuple[int, int]] = set()
        self._early: tuple[int, list[Branch]] | None = None  # the step's early exit, once read
        self.thread = threading.Thread(target=self._main, name="duet-draft", daemon=True)
        self.seq: list[int] = []

    # ---- the target's side of the channel -------------------------------------------------
    def start(self, seq: list[int]) -> None:
        """Run the worker's loop in its thread, from the committed tokens `seq`."""
        self.seq = list(seq)
        self.thread.start()

    def run(self, seq: list[int]) -> None:
        """Run the worker's loop in the calling thread (a draft process's main thread) until
        the target stops it; a failure goes to the outbox, as from the thread."""
        self.seq = list(seq)
        self._main()

    def send(self, msg) -> None:
        self.inbox.put(msg)
        time.sleep(0)  # hand the GIL over now: the waiting worker wakes in µs, not a switch

    def receive(self, step: int, poll_s: float = 0.05) -> Window:
        """The window for `step`; raises promptly if the worker failed or died."""
        while True:
            try:
                msg = self.outbox.get(timeout=poll_s)
            except queue.Empty:
                if not self.thread.is_alive():
                    raise RuntimeError("the draft worker stopped without answering") from None
                continue
            if isinstance(msg, WorkerFailed):
                if isinstance(msg.error, DuetError):  # bad input (a draft that cannot branch):
                    raise DuetError(f"--method mirror: {msg.error}") from None  # one line
                raise RuntimeError(f"Mirror-SD draft worker failed: {msg.error!r}") from msg.error
            assert msg.step == step, f"window for step {msg.step}, expected {step}"
            self.tl.add("channel", "window", msg.sent_ns, now_ns(), step=step, source=msg.source)
            return msg

    def take(self, step: int, accepted: int, token: int) -> Window | None:
        """The target's side of reuse: the completed branch (A, c) of `step`, if published.
        Once taken, the worker commits that branch without sending the window again."""
        return self.board.take(step, (accepted, token))

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        self.inbox.put(STOP)
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def finish(self, seq: list[int], draft_cache=None) -> None:
        """Stop the thread; its cache (and the caller's `draft_cache`) keep a prefix of `seq`."""
        self.stop()
        rewind(self.cache, min(len(seq), len(self.seq)))  # it may not have seen the last (A, c)
        if draft_cache is not None and self.cache is not draft_cache:
            # reuse swapped in a branch's cache: the caller's object takes over its state
            draft_cache.__dict__.update(self.cache.__dict__)

    # ---- the worker thread -------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._run()
        except _Stopped:
            pass
        except BaseException as e:  # hand any failure to the target thread, which re-raises it
            self.outbox.put(WorkerFailed(e))

    def _window_size(self, produced: int, seq_len: int) -> int:
        return max(0, min(self.gamma, self.max_new - produced - 1, self.ctx - seq_len - 1))

    def _get(self):
        """Next message, blocking; _Stopped on stop."""
        if self._stash is not None:
            msg, self._stash = self._stash, None
            return msg
        while True:
            if self._stop.is_set():
                raise _Stopped
            try:
                msg = self.inbox.get(timeout=0.1)
            except queue.Empty:
                continue
            if msg is STOP:
                raise _Stopped
            return msg

    def _final_arrived(self) -> bool:
        """Non-blocking check for the final-verification message (stashed for _get)."""
        if self._stash is not None:
            return True
        if self._stop.is_set():
            raise _Stopped
        try:
            msg = self.inbox.get_nowait()
        except queue.Empty:
            return False
        if msg is STOP:
            raise _Stopped
        self._stash = msg
        return True

    def _rng(self, step: int, a: int | None = None, c: int | None = None):
        """The generator for the window of `step`, which follows (A, c) (none for step 0)."""
        return window_rng(self.seed, step, None if a is None else (a, c))

    def _run(self) -> None:
        step, produced = 0, 0
        t0 = now_ns()
        g = self._window_size(produced, len(self.seq))
        j: dict = {}
        window, q = draft_window(
            self.draft, self.cache, self.seq, g, self.sampling, self._rng(0), info=j, gumbel=True
        )
        self.tl.add("draft", "initial rollout", t0, now_ns(), step=step, tokens=g)
        self.outbox.put(Window(step, window, q, now_ns(), "initial", {"draft_passes": j["passes"]}))
        while True:
            self.board.open(step)  # this step's board of completed branches
            ee_recv, waves = self._rollouts(step, window, q, produced)
            fv = self._get()
            assert isinstance(fv, FinalVerify) and fv.step == step
            fv_recv = now_ns()
            self.tl.add(
                "channel", "final-verify", fv.sent_ns, fv_recv, step=step, accepted=fv.accepted
            )
            claimed = self.board.close()  # did the target take a branch from it?
            a, c = fv.accepted, fv.token
            base = len(self.seq)  # |committed| before this step
            self.seq += window[:a] + [c]
            produced += a + 1
            step += 1
            key = reuse_key(a, c)
            info = {"ee_recv_ns": ee_recv, "fv_recv_ns": fv_recv, "waves": len(waves),
                    "branches_done": sum(w.completed() for w in waves),
                    "own": key in self._own_keys}  # fmt: skip
            g = self._window_size(produced, len(self.seq))
            window, q = self._next_window(step, waves, key, base + a, g, info)
            if not claimed:
                self.outbox.put(Window(step, window, q, now_ns(), info["source"], info))
                time.sleep(0)  # let the waiting target thread take the GIL at once

    def _next_window(
        self, step: int, waves: list[Wave], key, accepted_end: int, g: int, info: dict
    ) -> tuple[list[int], np.ndarray]:
        """The window of `step`, which follows (A, c) = `key`: the completed branch (reuse),
        a branch cut short continued (resume), or a fresh rollout (fallback). `info` gets its
        source and timings; `accepted_end`: |committed| before (A, c) plus A."""
        found = next(((w, w.index[key]) for w in waves if key in w.index), None)
        f0 = now_ns()
        if found is None or found[0].k == 0:
            rewind(self.cache, len(self.seq) - 1)
            j = {}
            window, q = draft_window(
                self.draft,
                self.cache,
                self.seq,
                g,
                self.sampling,
                self._rng(step, *key),
                info=j,
                gumbel=True,
            )
            f1 = now_ns()
            self.tl.add("draft", "fallback rollout", f0, f1, step=step, tokens=g)
            info.update(
                source="fallback", ready_ns=f1, fallback_ns=f1 - f0, draft_passes=j["passes"]
            )
            return window, q
        wave, row = found
        window, q = wave.commit(row, accepted_end, g)
        self.cache = wave.cache
        done = len(window)
        if done == g:
            info.update(
                source="reuse",
                ready_ns=wave.row_ready_ns(row),
                fallback_ns=0,
                draft_passes=wave.row_passes(row),
            )
            return window, q
        j = {}  # its wave was cut short: continue this row where it stopped
        more, q2 = draft_window(
            self.draft,
            self.cache,
            self.seq + window,
            g - done,
            self.sampling,
            wave.rngs[row],
            info=j,
            gumbel=True,
        )
        f1 = now_ns()
        self.tl.add("draft", "resume rollout", f0, f1, step=step, tokens=g - done)
        info.update(
            source="resume",
            ready_ns=f1,
            fallback_ns=f1 - f0,
            draft_passes=wave.row_passes(row) + j["passes"],
        )
        return window + more, np.concatenate([q, q2])
