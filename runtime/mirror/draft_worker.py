"""The draft's worker thread in Mirror-SD.

Per step: wait for the early-exit message; run branch-complete rollouts
(batched per depth, most-likely group first), checking for the
final-verification message between draft passes (work-conserving: it keeps
going until (A, c) arrives); then commit, and send the next window — the
completed branch (A, c) if there is one (reuse), else a fresh rollout from
`committed + c` (fallback).

Randomness: every branch, and every fallback, draws from its own generator
seeded by (seed, step, branch), so sampled output does not depend on how far
the rollouts got before the final message arrived — and each branch's tokens
are drawn from exactly the q sent with them (App. B).
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np

from kernels.sampling import sample
from kernels.topk_channel import decode
from runtime.decoding.events import Sampling, rewind
from runtime.decoding.sd import draft_window
from runtime.mirror.branches import Group, plan_branches, reuse_key
from runtime.mirror.messages import STOP, EarlyExit, FinalVerify, Window, WorkerFailed
from runtime.mirror.timeline import Timeline, now_ns

INITIAL, BRANCH, FALLBACK = 0, 1, 2  # RNG stream tags


class _Stopped(Exception):
    pass


class DraftWorker:
    """Owns the draft model and its cache; talks to the target only through two queues."""

    def __init__(self, draft, *, sampling: Sampling, seed: int, gamma: int, max_new: int, ctx: int,
                 timeline: Timeline, cache=None):  # fmt: skip
        self.draft, self.sampling, self.seed = draft, sampling, seed
        self.gamma, self.max_new, self.ctx = gamma, max_new, ctx
        self.tl = timeline
        self.cache = cache if cache is not None else draft.new_cache()
        self.inbox: queue.Queue = queue.Queue()
        self.outbox: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._stash: FinalVerify | None = None
        self.thread = threading.Thread(target=self._main, name="duet-draft", daemon=True)
        self.seq: list[int] = []

    # ---- the target's side of the channel -------------------------------------------------
    def start(self, seq: list[int]) -> None:
        self.seq = list(seq)
        self.thread.start()

    def send(self, msg) -> None:
        self.inbox.put(msg)
        time.sleep(
            0
        )  # hand the GIL over now, so the waiting worker wakes in µs, not a switch interval

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
                raise RuntimeError(f"Mirror-SD draft worker failed: {msg.error!r}") from msg.error
            assert msg.step == step, f"window for step {msg.step}, expected {step}"
            self.tl.add("channel", "window", msg.sent_ns, now_ns(), step=step, source=msg.source)
            return msg

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        self.inbox.put(STOP)
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)

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

    def _run(self) -> None:
        step, produced = 0, 0
        t0 = now_ns()
        g = self._window_size(produced, len(self.seq))
        window, q = self._rollout(
            self.cache, self.seq, g, np.random.default_rng([self.seed, step, INITIAL])
        )
        self.tl.add("draft", "initial rollout", t0, now_ns(), step=step, tokens=g)
        self.outbox.put(Window(step, window, q, now_ns(), "initial"))
        while True:
            ee = self._get()
            assert isinstance(ee, EarlyExit) and ee.step == step
            ee_recv = now_ns()
            self.tl.add(
                "channel", "early-exit", ee.sent_ns, ee_recv, step=step, bytes=len(ee.payload)
            )
            ids, logp = decode(ee.payload)
            done, group_end = self._branch_rollouts(step, ids, logp, window, produced)
            fv = self._get()
            assert isinstance(fv, FinalVerify) and fv.step == step
            fv_recv = now_ns()
            self.tl.add(
                "channel", "final-verify", fv.sent_ns, fv_recv, step=step, accepted=fv.accepted
            )
            a, c = fv.accepted, fv.token
            self.seq += window[:a] + [c]
            produced += a + 1
            step += 1
            depth, token = reuse_key(a, c)
            info = {"ee_recv_ns": ee_recv, "fv_recv_ns": fv_recv, "groups_done": len(done),
                    "branches_done": sum(len(rows) for _, rows in done.values())}  # fmt: skip
            if depth in done and token in done[depth][1]:
                cache, rows = done[depth]
                row, window, q = rows[token]
                cache.select([row])  # commit the branch's cache row
                self.cache = cache
                info.update(source="reuse", ready_ns=group_end[depth], fallback_ns=0)
            else:
                f0 = now_ns()
                rewind(self.cache, len(self.seq) - 1)
                g = self._window_size(produced, len(self.seq))
                rng = np.random.default_rng([self.seed, step, FALLBACK])
                window, q = self._rollout(self.cache, self.seq, g, rng)
                f1 = now_ns()
                self.tl.add("draft", "fallback rollout", f0, f1, step=step, tokens=g)
                info.update(source="fallback", ready_ns=f1, fallback_ns=f1 - f0)
            self.outbox.put(Window(step, window, q, now_ns(), info["source"], info))
            time.sleep(0)  # let the waiting target thread take the GIL at once

    def _rollout(self, cache, seq: list[int], g: int, rng) -> tuple[list[int], np.ndarray]:
        """A plain autoregressive window of g tokens after seq: vanilla SD's draft step."""
        return draft_window(self.draft, cache, seq, g, self.sampling, rng)

    def _branch_rollouts(self, step, ids, logp, window, produced):
        """Run branch groups most-likely first until (A, c) arrives.

        Returns ({depth: (cache, {v: (row, tokens, q)})}, {depth: completion time ns}).
        """
        done, ends = {}, {}
        for group in plan_branches(ids, logp, window):
            if self._final_arrived():
                break
            res = self._group_rollout(step, group, window, produced)
            if res is None:  # (A, c) arrived mid-group: abandon it
                break
            done[group.depth] = res
            ends[group.depth] = now_ns()
        return done, ends

    def _group_rollout(self, step, group: Group, window, produced):
        j, vs = group.depth, list(group.tokens)
        prefix = self.seq + window[:j]
        g2 = self._window_size(produced + j + 1, len(prefix) + 1)
        cache = self.cache.fork([0] * len(vs))
        keep = min(cache.offset, len(prefix))
        cache.trim(cache.offset - keep)
        feed = np.array([prefix[keep:] + [v] for v in vs])
        rngs = [np.random.default_rng([self.seed, step + 1, BRANCH, j, v]) for v in vs]
        toks = np.zeros((len(vs), g2), np.int64)
        greedy = self.sampling.greedy  # greedy verification needs no q: keep none
        qs = np.zeros((len(vs), g2, 0 if greedy else self.draft.config.vocab_size), np.float32)
        t0 = now_ns()
        for k in range(g2):
            if k and self._final_arrived():
                return None
            logits = self.draft.forward(feed, cache)[:, -1]  # (n, V), one batched pass
            if greedy:
                toks[:, k] = logits.argmax(-1)
            else:
                qs[:, k] = self.sampling.probs(logits)
                toks[:, k] = sample(qs[:, k], np.array([r.random() for r in rngs]))
            feed = toks[:, k : k + 1]
        self.tl.add(
            "draft", f"rollout j={j}", t0, now_ns(), step=step, depth=j, branches=len(vs), tokens=g2
        )
        rows = {v: (r, toks[r].tolist(), qs[r]) for r, v in enumerate(vs)}
        return cache, rows
