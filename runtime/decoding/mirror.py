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
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kernels.topk_channel import encode, topk_message
from kernels.verify import verify_greedy, verify_sampling
from runtime.decoding.events import GREEDY, Sampling, StepEvent, pending, rewind, step_noise
from runtime.decoding.ss_draft import is_ss_draft
from runtime.errors import DuetError
from runtime.mirror.branches import in_tree
from runtime.mirror.coupled import coupled_message
from runtime.mirror.draft_worker import DEFAULT_BRANCH_BATCH, DraftWorker
from runtime.mirror.exit_head import resolve_exit_head
from runtime.mirror.messages import EarlyExit, FinalVerify
from runtime.mirror.timeline import Timeline, now_ns

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
    if gamma < 1:
        raise DuetError(f"--gamma must be at least 1 for --method mirror (got {gamma})")
    if kappa < 1:
        raise DuetError(f"--kappa must be at least 1 (got {kappa})")
    le = n // 2 if exit_layer is None else exit_layer
    if not 1 <= le <= n - 1:
        raise DuetError(f"--exit-layer must be in 1..{n - 1} for a {n}-layer target (got {le})")
    if not target.supports_layer_range:
        raise DuetError(
            f"the {target.backend} target cannot stop at an exit layer; use --target-backend mlx or torch"
        )
    return le


def wave_shape(draft, branches: int | None = None, draft_branches: int | None = None):
    """(rows per branch-wave pass, own runner-ups per window position) for `draft`: the values
    given, else its kind's defaults (an SS draft's are SS_BRANCH_BATCH, SS_DRAFT_BRANCHES)."""
    ss = is_ss_draft(draft)
    b = branches if branches is not None else SS_BRANCH_BATCH if ss else DEFAULT_BRANCH_BATCH
    m = draft_branches if draft_branches is not None else (
        SS_DRAFT_BRANCHES if ss else DEFAULT_DRAFT_BRANCHES)  # fmt: skip
    return b, m


def check_branch_draft(draft, branch_batch: int) -> None:
    """Branch rollouts run as masked batches: the draft must take a batch and a key mask."""
    if branch_batch < 1:
        raise DuetError(f"--branches must be at least 1 (got {branch_batch})")
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
    instead of a thread of this one; None: `draft_in_process` decides. exit_head: "raw", "tuned" (runtime/mirror/exit_head.py),
    or None for the tuned head when one is stored beside the target. draft_branches: the
    draft's own runner-up tokens per window position rolled out as branches before the early
    exit (runtime/mirror/draft_worker.py); 0: only the early-exit top-κ branches.
    branch_batch, draft_branches: None for the draft kind's defaults (wave_shape)."""
    branch_batch, draft_branches = wave_shape(draft, branch_batch, draft_branches)
    if not 0 <= draft_branches <= MAX_DRAFT_BRANCHES:
        raise DuetError(
            f"--draft-branches must be in 0..{MAX_DRAFT_BRANCHES} (got {draft_branches}): each "
            "adds γ + 1 branches a step, and their slots on the shared board"
        )
    le = check_mirror_args(target, gamma, kappa, exit_layer)
    check_branch_draft(draft, branch_batch)
    tuned = resolve_exit_head(target, le, exit_head)
    n = target.config.num_layers
    tl = timeline if timeline is not None else Timeline()
    seq = list(seq)
    tc = target_cache if target_cache is not None else target.new_cache()
    ctx = min(target.config.max_context, draft.config.max_context)
    if draft_in_process(target, draft, draft_process):  # over the shared-memory channel
        from runtime.mirror.draft_process import ProcessDraftWorker, draft_host

        worker = ProcessDraftWorker(draft_host(draft), sampling=sampling, seed=seed, gamma=gamma,
                                    kappa=kappa, vocab=draft.config.vocab_size, max_new=max_new,
                                    ctx=ctx, timeline=tl, branch_batch=branch_batch,
                                    draft_branches=draft_branches)  # fmt: skip
    else:
        worker = DraftWorker(draft, sampling=sampling, seed=seed, gamma=gamma, max_new=max_new,
                             ctx=ctx, timeline=tl, cache=draft_cache, branch_batch=branch_batch,
                             draft_branches=draft_branches)  # fmt: skip
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    worker.start(seq)
    produced, step = 0, 0
    try:
        head = pending(tc, seq)[:-1]  # prefill while the draft rolls out its first window
        if head:
            with tl.span("target", "prefill", tokens=len(head)):
                target.forward(np.array([head]), tc)
        win = worker.receive(step)
        while produced < max_new:
            t0 = now_ns()
            g = len(win.tokens)
            window = pending(tc, seq) + win.tokens
            h = target.forward_layers(np.array([window]), tc, 0, le)
            h_exit = h if tuned is None else tuned.apply(h)  # only the proposal: the suffix uses h
            exit_logits = target.head(h_exit)[0, -(g + 1) :]
            if sampling.greedy:
                ids, logp = topk_message(exit_logits, kappa)  # eq. 7, bf16
            else:  # eq. 7's channel, its top-κ coupled to this step's noise (mirror/coupled.py)
                u, noise = step_noise(seed, step, g, exit_logits.shape[-1])
                ids, logp = coupled_message(sampling.log_probs(exit_logits), win.tokens,
                                                noise, kappa)  # fmt: skip
            payload = encode(ids, logp)
            t1 = now_ns()
            worker.send(EarlyExit(step, payload, t1))
            h = target.forward_layers(h, tc, le, n)
            logits = target.head(h)[0, -(g + 1) :]  # (γ+1, V)
            d = np.array(win.tokens, dtype=np.int64)
            if sampling.greedy:
                a, c = verify_greedy(logits, d)
            else:  # the correction by Gumbel-max with the noise the early exit was coupled to
                p = sampling.probs(logits)
                a, c = verify_sampling(p, win.laws(sampling), d, u, noise)
            t2 = now_ns()
            more = produced + a + 1 < max_new
            # reuse: a completed branch (A, c) is taken from the worker's board at once, before
            # the verdict is even sent; otherwise the worker answers (resume, fallback, or a
            # branch that finished late)
            ready = worker.take(step, a, c) if more else None
            t3 = now_ns()
            worker.send(FinalVerify(step, a, c, t2))
            tl.add("target", "prefix 1..ℓe + early exit", t0, t1, step=step, window=g + 1)
            tl.add("target", "suffix ℓe+1..N + verify", t1, t2, step=step, accepted=a)
            committed = win.tokens[:a] + [c]
            seq += committed
            produced += len(committed)
            rewind(tc, len(seq) - 1)
            q_final = p[a] if not sampling.greedy else _softmax(logits[a])  # verified row
            extra = {
                "prefix_s": (t1 - t0) / 1e9,
                "suffix_s": (t2 - t1) / 1e9,
                "ee_sent_ns": t1,
                "fv_sent_ns": t2,
                "in_tree": in_tree(a, c, ids),  # App. E: F_t = 1 - in_tree
                "omega_kappa": float(q_final[ids[a]].sum()),  # eq. 9 at the correction position
                "payload_bytes": len(payload),
                "window_source": win.source,
                "exit_layer": le,
                "exit_head": "raw" if tuned is None else "tuned",
                # J: draft passes that made this window (an SS draft's η ≥ 1 per pass, §3.2)
                "per_step": {"draft_passes": win.info.get("draft_passes")},
            }
            step += 1
            if more:
                taken = ready is not None
                if taken:
                    win = ready
                    tl.add("channel", "window (taken)", t2, t3, step=step, source=win.source)
                    rv_fv = t3 - t2
                else:
                    win = worker.receive(step)
                    t3 = now_ns()
                    rv_fv = win.info["fv_recv_ns"] - t2 + t3 - win.sent_ns
                extra.update(step_s=(t3 - t0) / 1e9, draft=win.info, rv_fv_ns=rv_fv, taken=taken,
                             reuse=win.source == "reuse", resume=win.source == "resume",
                             fallback=win.source == "fallback")  # fmt: skip
                # whose branch (A, c) was: the draft's own runner-ups, else the early exit's
                # top-κ, else neither (auto pools these into Ω̂_own and Ω̂: pair_probe)
                extra["per_step"]["branch_hit"] = ("own" if win.info.get("own") else
                                                   "exit" if extra["in_tree"] else "miss")  # fmt: skip
            else:
                extra.update(step_s=(t2 - t0) / 1e9, draft=None, reuse=None, resume=None,
                             fallback=None)  # fmt: skip
                extra["per_step"]["branch_hit"] = None  # no next window: unknown
            yield StepEvent(tokens=committed, accepted=a, drafted=g, draft_s=0.0, verify_s=(t2 - t0) / 1e9,
                            extra=extra)  # fmt: skip
    finally:
        sys.setswitchinterval(switch)
        worker.finish(seq, draft_cache)
        rewind(tc, len(seq))


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


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max())
    return z / z.sum()


# the target runs causal windows split at the exit layer (a HybridCache keeps per-layer
# offsets); a hybrid draft's branch rows fork both kinds of state (fork_at: the KV whole, the
# linear states at each row's branch point), so `why_not` refuses drafts whose cache cannot
RUNS_HYBRID = ("target", "draft")


def why_not(target, draft) -> str | None:
    """Why this pair cannot run mirror beyond the shared checks (one line), or None."""
    if not getattr(getattr(draft, "config", None), "is_hybrid", False):
        return None
    if getattr(draft, "hybrid_rollback", "replay") != "replay":
        return ("--method mirror forks a hybrid torch draft's branch rows by replay; drop "
                "--hybrid-rollback redecode for it (or use the ONNX draft)")  # fmt: skip
    if getattr(draft.new_cache(), "fork_at", None) is None:
        return (f"--method mirror rolls out branch rows; this hybrid {draft.backend} draft "
                "cannot fork its states per row (use the ONNX or torch hybrid draft)")  # fmt: skip
    return None


NEEDS_DRAFT = True


@dataclass
class Options:
    gamma: int = 4  # window length γ
    kappa: int = DEFAULT_KAPPA  # channel width κ
    exit_layer: int | None = None  # ℓe (default N/2)
    branches: int | None = None  # rows per batched branch-rollout pass (None: wave_shape)
    draft_process: bool | None = None  # the draft worker's process (None: draft_in_process)
    exit_head: str | None = None  # raw | tuned (default: tuned when one is stored)
    draft_branches: int | None = None  # own runner-ups rolled out before the early exit


def steps(target, draft, seq, *, max_new, sampling, seed, options, target_cache=None,
          draft_cache=None, timeline=None) -> Iterator[StepEvent]:  # fmt: skip
    """The method-table entry point (runtime.decoding.METHOD_MODULES)."""
    return mirror_steps(target, draft, seq, max_new=max_new, gamma=options.gamma,
                        kappa=options.kappa, exit_layer=options.exit_layer, sampling=sampling,
                        seed=seed, timeline=timeline, target_cache=target_cache,
                        draft_cache=draft_cache, branch_batch=options.branches,
                        draft_process=options.draft_process,
                        exit_head=options.exit_head,
                        draft_branches=options.draft_branches)  # fmt: skip
