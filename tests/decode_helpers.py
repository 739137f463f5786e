"""Shared pieces of the decoding tests: greedy, seed-0 steps and runs (the set-up of every
lossless check), and a fresh prefill to compare a cache's states against."""

import numpy as np

from runtime.decoding import make_steps, run
from runtime.decoding.events import GREEDY


def greedy_steps(method, target, draft, prompt, n, **opts):
    """make_steps(method, ...) for `n` new tokens, greedy and seed 0; `opts` go to the method
    (gamma=, target_cache=, draft_cache=, exit_layer=, tree_k=, ...)."""
    return make_steps(method, target, draft, prompt, max_new=n, sampling=GREEDY, seed=0, **opts)


def greedy_run(method, target, draft, prompt, n, **opts):
    """The run of greedy_steps: its tokens and stats."""
    return run(greedy_steps(method, target, draft, prompt, n, **opts), max_new=n)


def ar_greedy(target, prompt, n) -> list[int]:
    """The target's own greedy tokens (ar), the reference a lossless method must equal."""
    return greedy_run("ar", target, None, prompt, n).tokens


def prefill(model, seq):
    """A new cache of `model` holding `seq` (empty if `seq` is)."""
    c = model.new_cache()
    if seq:
        model.forward(np.array([seq]), c)
    return c
