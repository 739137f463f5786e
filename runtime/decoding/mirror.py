"""`mirror`: Mirror speculative decoding, the target's side (Mirror-SD §3.1, eq. 10).

One step, with window `[last committed, d1..dγ]`:
  1. target layers 1..ℓe, final norm + LM head at ℓe, top-κ per position ->
     early-exit message to the draft worker;
  2. target layers ℓe+1..N and verification (greedy or rejection sampling)
     while the draft runs branch-complete rollouts;
  3. final-verification message (A, c) -> the draft answers with the next
     window: a completed branch (reuse) or a fresh rollout (fallback).
The committed tokens are those vanilla SD would commit for the same window
(App. B): only the schedule differs.

This module checks the arguments, places the draft worker (a thread, or its own process) and
holds the method's options; the steps themselves are runtime/decoding/mirror_pass.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from runtime.arg_rules import at_least, check_gamma
from runtime.decoding.events import (
    GREEDY,
    Sampling,
    StepCall,
    StepEvent,
    option_keywords,
    pending,
    rewind,
)
from runtime.decoding.flags import flag
from runtime.decoding.mirror_pass import MirrorRun, target_steps
from runtime.decoding.ss_draft import is_ss_draft
from runtime.errors import DuetError
from runtime.mirror.draft_worker import DEFAULT_BRANCH_BATCH, DraftWorker
from runtime.mirror.exit_head import resolve_exit_head
from runtime.mirror.timeline import Timeline

DEFAULT_KAPPA = 8
# the draft's own runner-ups per position rolled out while the target runs its prefix: on
# emulated m3-max reuse went 0.51 -> 0.89 and mirror 1.00x -> 1.10x sd (T = 0); off (0) where
# draft and target share cores, which auto then steers away from mirror anyway
DEFAULT_DRAFT_BRANCHES = 2
MAX_DRAFT_BRANCHES = 32
# An SS draft's wave pass carries up to (1 + n)^2 tokens a row (its guesses, each with n
# streams), so 16 rows leave the draft's cheap regime: 8 rows and one own runner-up let its
# own wave end within the target's prefix (EMULATED m3-max, γ 6, T = 0, GPU-distilled SS
# draft: 62.5 tok/s with 16 rows and no own branches, 75.6 with these: `apps.bench --emulate
# m3-max:qwen3-8b+qwen3-0.6b --methods sd,mirror --drafts SS_DIR --gammas 6 --temps 0`)
SS_BRANCH_BATCH, SS_DRAFT_BRANCHES = 8, 1
# Both workers need the GIL between their native calls; with CPython's default 5 ms switch
# interval a thread that wants it back can wait that long per op. Mirror-SD's steps are a few
# ms, so the interval is shortened while it runs (restored on exit).
SWITCH_INTERVAL_S = 5e-5  # App. E.5: κ = 8 with a mid-depth exit is the paper's default


def check_mirror_args(target, gamma: int, kappa: int, exit_layer: int | None) -> int:
    """Validate (γ, κ, ℓe) for `target`; returns ℓe (default N/2)."""
    n = target.config.num_layers
    check_gamma(gamma, "mirror")
    at_least("--kappa", kappa)
    le = n // 2 if exit_layer is None else exit_layer
    if not 1 <= le <= n - 1:
        raise DuetError(f"--exit-layer must be in 1..{n - 1} for a {n}-layer target (got {le})")
    if not target.supports_layer_range:
        raise DuetError(
            f"the {target.backend} target cannot stop at an exit layer; "
            "use --target-backend mlx or torch"
        )
    return le


def wave_shape(draft, branches: int | None = None, draft_branches: int | None = None):
    """(rows per branch-wave pass, own runner-ups per window position) for `draft`: the values
    given, else its kind's defaults (an SS draft's are SS_BRANCH_BATCH, SS_DRAFT_BRANCHES)."""
    ss = is_ss_draft(draft)
    b = branches if branches is not None else SS_BRANCH_BATCH if ss else DEFAULT_BRANCH_BATCH
    m = (
        draft_branches
        if draft_branches is not None
        else (SS_DRAFT_BRANCHES if ss else DEFAULT_DRAFT_BRANCHES)
    )
    return b, m


def check_draft_branches(draft_branches: int | None) -> None:
    """--draft-branches in 0..MAX_DRAFT_BRANCHES (None: the draft kind's default)."""
    if draft_branches is not None and not 0 <= draft_branches <= MAX_DRAFT_BRANCHES:
        raise DuetError(
            f"--draft-branches must be in 0..{MAX_DRAFT_BRANCHES} (got {draft_branches}): each "
            "adds γ + 1 branches a step, and their slots on the shared board"
        )


def check_branch_draft(draft, branch_batch: int) -> None:
    """Branch rollouts run as masked batches: the draft must take a batch and a key mask."""
    at_least("--branches", branch_batch)
    if str(getattr(draft, "backend", "")).startswith("coreml"):
        raise DuetError(
            "--method mirror batches branch rollouts; a Core ML draft is batch 1 "
            "(use the ONNX, MLX or PyTorch draft for mirror, Core ML for sd)"
        )


def mirror_steps(
    target,
    draft,
    seq: list[int],
    *,
    max_new: int,
    gamma: int = 4,
    kappa: int = DEFAULT_KAPPA,
    exit_layer: int | None = None,
    sampling: Sampling = GREEDY,
    seed: int = 0,
    timeline: Timeline | None = None,
    target_cache=None,
    draft_cache=None,
    branch_batch: int | None = None,
    draft_process: bool | None = None,
    exit_head: str | None = None,
    draft_branches: int | None = None,
) -> Iterator[StepEvent]:
    """Yield one StepEvent per Mirror-SD step; `extra` carries the step's timings and reuse.

    draft_process: run the draft worker in its own process (runtime/mirror/draft_process.py)
    instead of a thread of this one; None: `draft_in_process` decides. exit_head: "raw",
    "tuned" (runtime/mirror/exit_head.py), or None for the tuned head when one is stored beside
    the target. draft_branches: the draft's own runner-up tokens per window position rolled out
    as branches before the early exit (runtime/mirror/draft_worker.py); 0: only the early-exit
    top-κ branches. branch_batch, draft_branches: None for the draft kind's defaults
    (wave_shape)."""
    branch_batch, draft_branches = wave_shape(draft, branch_batch, draft_branches)
    check_draft_branches(draft_branches)
    le = check_mirror_args(target, gamma, kappa, exit_layer)
    check_branch_draft(draft, branch_batch)
    run = MirrorRun(
        target,
        le,
        target.config.num_layers,
        resolve_exit_head(target, le, exit_head),
        kappa,
        sampling,
        seed,
        timeline if timeline is not None else Timeline(),
        draft_in_process(target, draft, draft_process),
    )
    seq = list(seq)
    tc = target_cache if target_cache is not None else target.new_cache()
    worker = _worker(
        run,
        draft,
        gamma=gamma,
        max_new=max_new,
        draft_cache=draft_cache,
        branch_batch=branch_batch,
        draft_branches=draft_branches,
    )
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    worker.start(seq)
    try:
        head = pending(tc, seq)[:-1]  # prefill while the draft rolls out its first window
        if head:
            with run.tl.span("target", "prefill", tokens=len(head)):
                target.forward(np.array([head]), tc)
        yield from target_steps(run, worker, tc, seq, max_new)
    finally:
        sys.setswitchinterval(switch)
        worker.finish(seq, draft_cache)
        rewind(tc, len(seq))


def _worker(run: MirrorRun, draft, *, gamma, max_new, draft_cache, branch_batch, draft_branches):
    """The draft worker: in its own process over the shared-memory channel, or a thread."""
    ctx = min(run.target.config.max_context, draft.config.max_context)
    if run.in_process:  # over the shared-memory channel
        from runtime.mirror.draft_process import ProcessDraftWorker, draft_host

        return ProcessDraftWorker(
            draft_host(draft),
            sampling=run.sampling,
            seed=run.seed,
            gamma=gamma,
            kappa=run.kappa,
            vocab=draft.config.vocab_size,
            max_new=max_new,
            ctx=ctx,
            timeline=run.tl,
            branch_batch=branch_batch,
            draft_branches=draft_branches,
        )
    return DraftWorker(
        draft,
        sampling=run.sampling,
        seed=run.seed,
        gamma=gamma,
        max_new=max_new,
        ctx=ctx,
        timeline=run.tl,
        cache=draft_cache,
        branch_batch=branch_batch,
        draft_branches=draft_branches,
    )


def draft_in_process(target, draft, asked: bool | None) -> bool:
    """The draft worker's home when `--draft-process`/`--draft-thread` is not given: its own
    process when the target runs on a CUDA GPU, or on an emulated device (`--emulate`), and
    the draft can be sent there (a load spec).

    Such a target's pass is bound by Python dispatching its kernels, which a draft *thread*
    slows through the GIL: on an H100 target with the CPU draft beside it the pass ran 1.93x
    slower with the thread and 1.2-1.3x with the process, and mirror ran 230 vs 340 tok/s
    (`apps.profile --target-backend torch --target-device cuda [--draft-process]`). An
    emulated pair stands for such an accelerator pair, and there too the thread's GIL is the
    one cost the device would not have: EMULATED m3-max (qwen3-8b + qwen3-0.6b), mirror ran
    2-5 % faster at T = 1 and 2-4 % at T = 0 with the process (`apps.bench --emulate ...
    --gammas 4,5,6 --temps 0,1 --samples 2`, with and without --draft-thread)."""
    if asked is not None:
        return asked
    on_gpu = getattr(getattr(target, "device", None), "type", None) == "cuda"
    emulated = str(getattr(target, "backend", "")).endswith("+emulated")
    sendable = getattr(draft, "process_spec", None) or getattr(draft, "load_spec", None)
    return bool((on_gpu or emulated) and sendable)


# the target runs causal windows split at the exit layer (a HybridCache keeps per-layer
# offsets); a hybrid draft's branch rows fork both kinds of state (fork_at: the KV whole, the
# linear states at each row's branch point), so `why_not` refuses drafts whose cache cannot
RUNS_HYBRID = ("target", "draft")


def why_not(target, draft) -> str | None:
    """Why this pair cannot run mirror beyond the shared checks (one line), or None."""
    if not getattr(getattr(draft, "config", None), "is_hybrid", False):
        return None
    if getattr(draft, "hybrid_rollback", "replay") != "replay":
        return (
            "--method mirror forks a hybrid torch draft's branch rows by replay; drop "
            "--hybrid-rollback redecode for it (or use the ONNX draft)"
        )
    if getattr(draft.new_cache(), "fork_at", None) is None:
        return (
            f"--method mirror rolls out branch rows; this hybrid {draft.backend} draft "
            "cannot fork its states per row (use the ONNX or torch hybrid draft)"
        )
    return None


NEEDS_DRAFT = True


@dataclass
class Options:
    gamma: int = 4  # window length γ (--gamma: every command's, runtime/cli_args.py)
    kappa: int = flag(
        DEFAULT_KAPPA, f"top-κ width of the early-exit message (default {DEFAULT_KAPPA})"
    )
    exit_layer: int | None = flag(
        None, "target layer ℓe whose hidden state gives the early exit (default N/2)"
    )
    # rows per batched branch-rollout pass (None: wave_shape)
    branches: int | None = flag(
        None,
        "branches rolled out per batched draft pass, most likely "
        f"first (default {DEFAULT_BRANCH_BATCH}; {SS_BRANCH_BATCH} for a "
        "speculative-streaming draft)",
    )
    # the draft worker's process (None: draft_in_process); --draft-process / --draft-thread
    # are placement flags of runtime/cli_args.py's add_pair_args
    draft_process: bool | None = None
    exit_head: str | None = flag(
        None,
        "the early exit's head: raw, or tuned (python -m "
        "apps.train exit-head); default tuned when one is stored "
        "beside the target",
        type=str,
        choices=("raw", "tuned"),
    )
    # own runner-ups rolled out before the early exit
    draft_branches: int | None = flag(
        None,
        "the draft's own runner-up tokens per window "
        "position whose branches it rolls out before the early "
        "exit, while the target runs its prefix (default "
        f"{DEFAULT_DRAFT_BRANCHES}; {SS_DRAFT_BRANCHES} for a "
        "speculative-streaming draft; 0: off)",
    )


RENAMED = {"branches": "branch_batch"}  # the flag's name -> mirror_steps' keyword
RECORDS_TIMELINE = True  # steps() fills a runtime.mirror.timeline.Timeline (--trace)


def check(options: Options) -> None:
    """What can be checked before a target loads (the exit layer's range needs the target)."""
    check_gamma(options.gamma, "mirror")
    at_least("--kappa", options.kappa)
    at_least("--branches", options.branches)
    check_draft_branches(options.draft_branches)


def summarize(events, timeline, **run) -> dict:
    """Mirror's stats: where its draft worker ran, κ, the exit head and layer, and
    runtime/mirror/summary.py's figures of the steps (reuse, FF, eq. 10's step time)."""
    from runtime.mirror.summary import mirror_summary

    first = events[0].extra if events else {}
    return {
        "draft_worker": first.get("draft_worker"),
        "kappa": first.get("kappa"),
        "exit_head": first.get("exit_head"),
        "exit_layer": first.get("exit_layer"),
        "mirror": mirror_summary(events, timeline),
    }


def steps(c: StepCall) -> Iterator[StepEvent]:
    """The method-table entry point (runtime.decoding.METHOD_MODULES)."""
    kw = c.keywords("seed", "timeline", "target_cache", "draft_cache")
    return mirror_steps(c.target, c.draft, c.seq, **kw, **option_keywords(c.options, **RENAMED))
