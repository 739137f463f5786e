"""Decoding strategies: generators of StepEvents over a target (and a draft).

`run` drives any of them: it stops at EOS or max tokens, closes the strategy
(which rewinds its caches in `finally`) and collects RunStats.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields

from runtime.decoding.events import Sampling, StepCall, StepEvent
from runtime.stats import RunStats

# One module per method (STYLE 12); each exposes `Options` (a dataclass of its own options;
# the fields made with runtime/decoding/flags.py's `flag` are its command-line flags),
# `check(options)` (its argument checks, one line each), `summarize(events, timeline, **run)`
# (what it adds to a run's stats), `NEEDS_DRAFT` and `steps(call)` (call: events.StepCall, the
# pair, prompt, budget, sampling, seed, options, caches and timeline); one whose steps fill a
# Timeline says so in `RECORDS_TIMELINE`. Adding a method is one module and one line here.
# A module that runs hybrid (linear-attention) models names the roles in `RUNS_HYBRID`; one
# with refusals of its own adds `why_not(target, draft) -> str | None`; one that drafts from a
# model-free draft (runtime/drafts/: prompt lookup, suffix tries) says so in `RUNS_MODEL_FREE`,
# one that drafts from a mixed one (runtime/drafts/mixed.py) in `RUNS_MIXED`.
METHOD_MODULES: dict[str, str] = {
    "ar": "runtime.decoding.ar",
    "sd": "runtime.decoding.sd",
    "mirror": "runtime.decoding.mirror",
    "tree": "runtime.decoding.tree",
    "heterospec": "runtime.decoding.heterospec",
    "flexspec": "runtime.decoding.flexspec",
}
METHODS = tuple(METHOD_MODULES)


@dataclass
class Generated:
    tokens: list[int]
    stats: RunStats
    finish: str  # "eos", "length" or "context"


def method_module(method: str):
    """The module implementing `method` (imported on first use)."""
    from runtime.errors import DuetError

    if method not in METHOD_MODULES:
        raise DuetError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    return importlib.import_module(METHOD_MODULES[method])


def option_names() -> set[str]:
    """Every option some method takes (what CLIs may pass through to make_steps)."""
    return {f.name for m in METHODS for f in fields(method_module(m).Options)}


def method_options(method: str, **options):
    """`method`'s Options from keyword options: those it names and that are not None (None
    means the method's default); the rest are ignored, so one caller can pass them all."""
    mod = method_module(method)
    known = {f.name for f in fields(mod.Options)}
    return mod.Options(**{k: v for k, v in options.items() if k in known and v is not None})


def cannot_run(method: str, target, draft) -> str | None:
    """Why `method` cannot run this pair (one line), or None when it can."""
    mod = method_module(method)
    if mod.NEEDS_DRAFT and draft is None:
        return f"--method {method} needs a draft model"
    if getattr(draft, "model_free", False) and not getattr(mod, "RUNS_MODEL_FREE", False):
        return (
            f"--method {method} needs a draft model; --draft {draft.name} runs none "
            "(use --method sd or tree)"
        )
    if getattr(draft, "mixed", False) and not getattr(mod, "RUNS_MIXED", False):
        return f"--draft {draft.name} drafts `sd` chains only: use --method sd"
    hybrid_ok = getattr(mod, "RUNS_HYBRID", ())
    for role, m in (("target", target), ("draft", draft)):
        if role not in hybrid_ok and getattr(getattr(m, "config", None), "is_hybrid", False):
            return (
                f"--method {method} cannot run a hybrid linear-attention {role} "
                f"({m.config.model_type}): its tree/branch masks need one state per branch, "
                "which Gated DeltaNet layers do not keep; use --method sd or ar"
            )
    why_not = getattr(mod, "why_not", None)
    return why_not(target, draft) if why_not is not None else None


def make_steps(
    method: str,
    target,
    draft,
    seq: list[int],
    *,
    max_new: int,
    sampling: Sampling,
    seed: int,
    target_cache=None,
    draft_cache=None,
    timeline=None,
    **options,
) -> Iterator[StepEvent]:
    """The step generator for `method`, with its own seeded RNG.

    `options` are method flags (gamma, kappa, exit_layer, branches, ...): each method takes
    those its `Options` names and ignores the rest, so one CLI can pass them all; None means
    the method's default.
    """
    from runtime.errors import DuetError

    mod = method_module(method)
    why = cannot_run(method, target, draft)
    if why:
        raise DuetError(why)
    opts = method_options(method, **options)
    call = StepCall(
        target, draft, list(seq), max_new, sampling, seed, opts, target_cache, draft_cache, timeline
    )
    return mod.steps(call)


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
