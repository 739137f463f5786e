"""Mirror-SD's steps on the target's side, once the worker runs (Mirror-SD §3.1, eq. 10).

Per step: the target's pass over the window (layers 1..ℓe, the early exit sent to the draft
worker, layers ℓe+1..N and the verdict (A, c)), then the commit and the next window: the
branch taken from the board (reuse), else the worker's answer. The checks, the worker's
placement and the method's options are runtime/decoding/mirror.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kernels.topk_channel import encode, topk_message
from kernels.verify import verify_greedy, verify_sampling
from runtime.decoding.events import Sampling, StepEvent, pending, rewind, step_noise
from runtime.mirror.coupled import coupled_message
from runtime.mirror.messages import EarlyExit, FinalVerify
from runtime.mirror.timeline import Timeline, now_ns
from runtime.mirror.verdict import Verdict, step_figures


@dataclass
class MirrorRun:
    """What every step of one Mirror-SD run reads: the target and its split, the channel."""

    target: object
    le: int  # the exit layer ℓe
    n: int  # the target's layers
    tuned: object  # the tuned exit head (runtime/mirror/exit_head.py), or None: the raw one
    kappa: int  # the early exit's width κ
    sampling: Sampling
    seed: int
    tl: Timeline
    in_process: bool  # the draft worker runs in its own process


def target_steps(run: MirrorRun, worker, tc, seq: list[int], max_new: int) -> Iterator[StepEvent]:
    """The steps: verify the window, send (A, c), commit, take or receive the next window.
    `seq` (the committed tokens) grows in place."""
    labels = {
        "exit_layer": run.le,
        "exit_head": "raw" if run.tuned is None else "tuned",
        "kappa": run.kappa,
        "draft_worker": "process" if run.in_process else "thread",
    }
    produced, step = 0, 0
    win = worker.receive(step)
    while produced < max_new:
        v = verify(run, worker, tc, seq, win, step)
        a, c, g = v.a, v.c, len(win.tokens)
        more = produced + a + 1 < max_new
        # reuse: a completed branch (A, c) is taken from the worker's board at once, before
        # the verdict is even sent; otherwise the worker answers (resume, fallback, or a
        # branch that finished late)
        ready = worker.take(step, a, c) if more else None
        t3 = now_ns()
        worker.send(FinalVerify(step, a, c, v.t2))
        run.tl.add("target", "prefix 1..ℓe + early exit", v.t0, v.t1, step=step, window=g + 1)
        run.tl.add("target", "suffix ℓe+1..N + verify", v.t1, v.t2, step=step, accepted=a)
        committed = win.tokens[:a] + [c]
        seq.extend(committed)
        produced += len(committed)
        rewind(tc, len(seq) - 1)
        extra = step_figures(v, win, labels)
        step += 1
        if more:
            win = next_window(run, worker, step, ready, v, t3, extra)
        else:
            extra.update(
                step_s=(v.t2 - v.t0) / 1e9, draft=None, reuse=None, resume=None, fallback=None
            )
            extra["per_step"]["branch_hit"] = None  # no next window: unknown
        yield StepEvent(
            tokens=committed,
            accepted=a,
            drafted=g,
            draft_s=0.0,
            verify_s=(v.t2 - v.t0) / 1e9,
            extra=extra,
        )


def verify(run: MirrorRun, worker, tc, seq: list[int], win, step: int) -> Verdict:
    """The target's pass over `win`: layers 1..ℓe, the early exit sent to the worker, then
    layers ℓe+1..N and the verdict (A, c)."""
    target, sampling = run.target, run.sampling
    t0 = now_ns()
    g = len(win.tokens)
    window = pending(tc, seq) + win.tokens
    h = target.forward_layers(np.array([window]), tc, 0, run.le)
    h_exit = h if run.tuned is None else run.tuned.apply(h)  # only the proposal: the suffix uses h
    exit_logits = target.head(h_exit)[0, -(g + 1) :]
    if sampling.greedy:
        ids, logp = topk_message(exit_logits, run.kappa)  # eq. 7, bf16
    else:  # eq. 7's channel, its top-κ coupled to this step's noise (mirror/coupled.py)
        u, noise = step_noise(run.seed, step, g, exit_logits.shape[-1])
        ids, logp = coupled_message(sampling.log_probs(exit_logits), win.tokens, noise, run.kappa)
    payload = encode(ids, logp)
    t1 = now_ns()
    worker.send(EarlyExit(step, payload, t1))
    h = target.forward_layers(h, tc, run.le, run.n)
    logits = target.head(h)[0, -(g + 1) :]  # (γ+1, V)
    d = np.array(win.tokens, dtype=np.int64)
    p = None
    if sampling.greedy:
        a, c = verify_greedy(logits, d)
    else:  # the correction by Gumbel-max with the noise the early exit was coupled to
        p = sampling.probs(logits)
        a, c = verify_sampling(p, win.laws(sampling), d, u, noise)
    return Verdict(ids, payload, logits, p, a, c, t0, t1, now_ns())


def next_window(run: MirrorRun, worker, step: int, ready, v: Verdict, t3: int, extra: dict):
    """The window of `step`: the branch taken from the board (`ready`), else the worker's
    answer to (A, c); `extra` gets the step's time, T_rv(fv) and the window's source."""
    taken = ready is not None
    if taken:
        win = ready
        run.tl.add("channel", "window (taken)", v.t2, t3, step=step, source=win.source)
        rv_fv = t3 - v.t2
    else:
        win = worker.receive(step)
        t3 = now_ns()
        rv_fv = win.info["fv_recv_ns"] - v.t2 + t3 - win.sent_ns
    extra.update(
        step_s=(t3 - v.t0) / 1e9,
        draft=win.info,
        rv_fv_ns=rv_fv,
        taken=taken,
        reuse=win.source == "reuse",
        resume=win.source == "resume",
        fallback=win.source == "fallback",
    )
    # whose branch (A, c) was: the draft's own runner-ups, else the early exit's top-κ, else
    # neither (auto pools these into Ω̂_own and Ω̂: pair_probe)
    extra["per_step"]["branch_hit"] = (
        "own" if win.info.get("own") else "exit" if extra["in_tree"] else "miss"
    )
    return win
