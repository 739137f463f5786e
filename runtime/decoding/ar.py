"""`ar`: the target alone, one token per step. The baseline every method must equal."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kernels.sampling import sample
from runtime.decoding.events import (
    GREEDY,
    Sampling,
    StepCall,
    StepEvent,
    last_logits,
    no_summary,
    pending,
    rewind,
)


def ar_steps(
    target,
    seq: list[int],
    *,
    max_new: int,
    sampling: Sampling = GREEDY,
    rng: np.random.Generator | None = None,
    target_cache=None,
) -> Iterator[StepEvent]:
    """Yield one StepEvent per generated token, continuing `seq` (a copy is kept).

    `target_cache` may hold a prefix of `seq` (a chat's earlier turns); on exit it
    holds only tokens of the final sequence.
    """
    rng = rng or np.random.default_rng(0)
    seq = list(seq)
    cache = target_cache if target_cache is not None else target.new_cache()
    try:
        for _ in range(max_new):
            t0 = time.perf_counter()
            logits = last_logits(target, np.array([pending(cache, seq)]), cache)
            if sampling.greedy:
                tok = int(logits.argmax())
            else:
                tok = int(sample(sampling.probs(logits), rng.random()))
            seq.append(tok)
            yield StepEvent(tokens=[tok], verify_s=time.perf_counter() - t0)
    finally:
        rewind(cache, len(seq))


RUNS_HYBRID = ("target", "draft")  # causal windows: a HybridCache lands states on the prefix
NEEDS_DRAFT = False


@dataclass
class Options:
    """`ar` takes no options of its own."""


def check(options: Options) -> None:
    """Nothing to check: `ar` has no options."""


summarize = no_summary  # `ar` adds nothing to the run's stats


def steps(c: StepCall) -> Iterator[StepEvent]:
    """The method-table entry point (runtime.decoding.METHOD_MODULES)."""
    return ar_steps(c.target, c.seq, **c.keywords("rng", "target_cache"))
