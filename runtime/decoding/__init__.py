"""Decoding strategies: generators of StepEvents over a target (and a draft).

`run` drives any of them: it stops at EOS or max tokens, closes the strategy
(which rewinds its caches in `finally`) and collects RunStats.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from runtime.decoding.events import Sampling, StepEvent
from runtime.stats import RunStats

METHODS = ("ar", "sd", "mirror")


@dataclass
class Generated:
    tokens: list[int]
    stats: RunStats
    finish: str  # "eos", "length" or "context"


def make_steps(
    method: str,
    target,
    draft,
    seq: list[int],
    *,
    max_new: int,
    sampling: Sampling,
    seed: int,
    gamma: int = 4,
    target_cache=None,
    draft_cache=None,
    kappa: int = 8,
    exit_layer: int | None = None,
    timeline=None,
    branches: int | None = None,
) -> Iterator[StepEvent]:
    """The step generator for `method`, with its own seeded RNG.

    kappa, exit_layer, branches (rows per branch-rollout batch) and timeline are Mirror-SD's
    (ignored by the other methods).
    """
    from runtime.decoding.ar import ar_steps
    from runtime.decoding.sd import sd_steps
    from runtime.errors import DuetError

    rng = np.random.default_rng(seed)
    if method == "ar":
        return ar_steps(
            target, seq, max_new=max_new, sampling=sampling, rng=rng, target_cache=target_cache
        )
    if draft is None:
        raise DuetError(f"--method {method} needs a draft model")
    if method == "sd":
        return sd_steps(
            target,
            draft,
            seq,
            max_new=max_new,
            gamma=gamma,
            sampling=sampling,
            rng=rng,
            target_cache=target_cache,
            draft_cache=draft_cache,
        )
    if method == "mirror":
        from runtime.decoding.mirror import mirror_steps

        return mirror_steps(target, draft, seq, max_new=max_new, gamma=gamma, kappa=kappa,
                            exit_layer=exit_layer, sampling=sampling, seed=seed, timeline=timeline,
                            target_cache=target_cache, draft_cache=draft_cache,
                            **({} if branches is None else {"branch_batch": branches}))  # fmt: skip
    raise DuetError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")


def stream(
    steps: Iterator[StepEvent], *, max_new: int, eos_ids=(), stats: RunStats | None = None
) -> Iterator[tuple[list[int], StepEvent]]:
    """Yield (tokens to emit, event) per step, cut at the first EOS (kept) or `max_new`.

    Closes `steps` when done so the strategy rewinds its caches.
    """
    eos = set(eos_ids)
    n = 0
    t0 = time.perf_counter()
    try:
        for ev in steps:
            toks = ev.tokens[: max_new - n]
            cut = next((i for i, t in enumerate(toks) if t in eos), None)
            if cut is not None:
                toks = toks[: cut + 1]
            n += len(toks)
            if stats is not None:
                stats.add(ev, len(toks))
                stats.wall_s = time.perf_counter() - t0
            yield toks, ev
            if cut is not None or n >= max_new:
                return
    finally:
        steps.close()


def run(steps: Iterator[StepEvent], *, max_new: int, eos_ids=(), prompt_len: int = 0) -> Generated:
    """Drive a strategy to completion and return its tokens and stats."""
    stats = RunStats(prefill_tokens=prompt_len)
    out: list[int] = []
    t0 = time.perf_counter()
    for toks, _ in stream(steps, max_new=max_new, eos_ids=eos_ids, stats=stats):
        out += toks
    stats.wall_s = time.perf_counter() - t0
    finish = "eos" if out and out[-1] in set(eos_ids) else "length"
    return Generated(out, stats, finish)
