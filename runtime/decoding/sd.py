"""`sd`: serial speculative decoding — the draft proposes γ tokens, the target verifies.

One step: the draft runs γ times autoregressively, sampling d_i ~ q_i; the
target scores `[last committed, d1..dγ]` in one forward; `kernels.verify`
accepts a prefix A and gives the correction/bonus token c; both caches are
rolled back to the committed sequence. Lossless by construction (see
kernels/verify.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kernels.verify import verify_greedy, verify_sampling
from runtime.arg_rules import check_gamma
from runtime.decoding.events import (
    GREEDY,
    Sampling,
    StepCall,
    StepEvent,
    draw,
    no_summary,
    option_keywords,
    pending,
    rewind,
    step_noise,
    window_rng,
)
from runtime.decoding.ss_draft import is_ss_draft, ss_draft_window
from runtime.drafts.base import chain_window, is_model_free
from runtime.drafts.mixed import is_mixed


def draft_window(
    draft,
    cache,
    seq: list[int],
    gamma: int,
    sampling: Sampling,
    rng,
    law=None,
    observe=None,
    info=None,
    gumbel: bool = False,
) -> tuple[list[int], np.ndarray]:
    """Draft γ tokens after `seq`; returns (tokens, q (γ, V)), q the law each was drawn from
    (empty when greedy, where verification needs none). `law(q) -> q_hat`, when given, replaces
    each q by the law the verifier will see (a lossy codec's decoded q̂, SQS §2) before the
    token is drawn from it with a fresh uniform; a `law` that returns None ends the window
    there, before any draw (SQS §4's bit budget), so fewer than γ tokens may come back.
    `observe(logits, d, q_row)`, when given, sees each token after its draw (CU-HLM's skip
    rule, runtime/edge/skip.py). A speculative-
    streaming draft drafts the same tokens in fewer passes (runtime/decoding/ss_draft.py;
    not under `observe`, which needs every token's own logits: its main stream then drafts
    one pass per token); `info["passes"]`, when a dict is given, receives the draft passes J
    the window took (γ for an ordinary draft). gumbel: each draw by Gumbel-max (events.draw;
    Mirror-SD's windows, whose branch waves draw so).
    A draft with `stop_below` > 0 (the fitted head, whose confidence is calibrated) ends its
    window once the product of its drafts' max probabilities, the chance that all are accepted,
    falls below it: EAGLE-2's dynamic draft length, as a chain. The length depends on the
    draft's own draws only, so every drafted position is still verified against the q it came
    from (a stop leaves the next position to the target's own law): the output law is p.

    On return the draft cache holds seq + d1..d(γ-1) (dγ is fed next step if accepted).
    """
    if is_model_free(draft):  # prompt lookup / suffix tries: q = δ, maybe fewer than γ
        if info is not None:
            info["passes"] = 0
        return chain_window(draft, cache, seq, gamma, sampling)
    if is_mixed(draft):  # the text's chain when it predicts well, else the model's
        got = draft.free_window(cache, seq, gamma, sampling)
        if got is not None:
            if info is not None:
                info["passes"] = 0
            return got
        draft.model_steps += 1
        return draft_window(
            draft.model, cache.model, seq, gamma, sampling, rng, law, observe, info, gumbel
        )
    if is_ss_draft(draft) and observe is None:  # Mirror-SD §3.2: η ≥ 1 tokens per pass
        toks, q, passes = ss_draft_window(draft, cache, seq, gamma, sampling, rng, law, gumbel)
        if info is not None:
            info["passes"] = passes
        return toks, q
    if info is not None:
        info["passes"] = gamma  # one pass per token
    toks, qs = [], []
    feed = pending(cache, seq)
    stop, chance = getattr(draft, "stop_below", 0.0), 1.0
    for _ in range(gamma):
        logits = draft.forward(np.array([feed]), cache)[0, -1]
        got = draw(logits, sampling, rng, law, gumbel)
        if got is None:  # the law ended the window (SQS §4's budget)
            if toks:
                rewind(cache, len(seq) + len(toks) - 1)  # as if γ had been len(toks)
            break
        d, q = got
        if q is not None:
            qs.append(q)
        toks.append(d)
        if observe is not None:
            observe(logits, d, q)
        if stop and len(toks) < gamma:  # a calibrated draft's chance that all are accepted
            z = logits - logits.max()
            chance /= float(np.exp(z).sum())  # × its max softmax probability
            if chance < stop:  # as if γ had been len(toks): d is fed next step if accepted
                break
        feed = [d]
    return toks, (np.stack(qs) if qs else np.zeros((0, draft.config.vocab_size), np.float32))


def sd_steps(
    target,
    draft,
    seq: list[int],
    *,
    max_new: int,
    gamma: int = 4,
    sampling: Sampling = GREEDY,
    rng: np.random.Generator | None = None,
    target_cache=None,
    draft_cache=None,
    seed: int | None = None,
) -> Iterator[StepEvent]:
    """Yield one StepEvent per draft-then-verify step, continuing `seq`.

    Never commits more than `max_new` tokens; the window shrinks near the end and
    near the context limit. Caches hold only committed tokens on exit. seed: when sampling,
    draw each window and verdict from the streams keyed by (seed, step) that mirror draws
    them from (events.window_rng, events.step_noise), so that sd and mirror commit the same
    tokens for a seed; None: one stream, `rng`.
    """
    check_gamma(gamma, "sd")
    rng = rng or np.random.default_rng(0)
    seq = list(seq)
    tc = target_cache if target_cache is not None else target.new_cache()
    dc = draft_cache if draft_cache is not None else draft.new_cache()
    ctx = min(target.config.max_context, draft.config.max_context)
    produced, step, prev = 0, 0, None
    keyed = seed is not None and not sampling.greedy
    reverify = False  # a redecode target restored its checkpoint: re-verify, no new drafts
    try:
        pre = _prefill_for_hidden(target, draft, tc, seq)
        while produced < max_new:
            g = 0 if reverify else max(0, min(gamma, max_new - produced - 1, ctx - len(seq) - 1))
            t0 = time.perf_counter()
            info: dict = {}
            wrng = window_rng(seed, step, prev) if keyed else rng
            drafts, q = draft_window(draft, dc, seq, g, sampling, wrng, info=info, gumbel=keyed)
            g = len(drafts)  # a model-free draft may propose fewer (none: the target's own step)
            t1 = time.perf_counter()
            window = pending(tc, seq)
            if len(window) > 1 and not reverify and getattr(tc, "rollback", None) == "redecode":
                # llama.cpp prefills the prompt but its last token first, so that a rejection in
                # the first round restores a checkpoint there, not the empty cache
                target.forward(np.array([window[:-1]]), tc)
                window = window[-1:]
            window += drafts
            # (γ+1, V); the ONNX target's head runs on those rows only (the first holds the prompt)
            last = {"last": g + 1} if getattr(target, "logits_last", False) else {}
            logits = target.forward(np.array([window]), tc, **last)[0, -(g + 1) :]
            d = np.array(drafts, dtype=np.int64)
            if sampling.greedy:
                a, c = verify_greedy(logits, d)
            elif keyed:  # the correction by Gumbel-max with the step's noise, as mirror's
                u, noise = step_noise(seed, step, g, logits.shape[-1])
                a, c = verify_sampling(sampling.probs(logits), q, d, u, noise)
            else:
                a, c = verify_sampling(sampling.probs(logits), q, d, rng.random(g), rng.random())
            step, prev = step + 1, (a, c)
            t2 = time.perf_counter() + pre  # the first step's verify includes the prefill
            pre = 0.0
            committed = drafts[:a] + [c]
            seq += committed
            produced += len(committed)
            if a < g and getattr(tc, "rollback", None) == "redecode" and tc.reverify:
                # llama.cpp on a hybrid target: restore the checkpoint before the window; the
                # kept tokens and c are the next window, re-verified (yielding one token)
                reverify = tc.restore(len(seq) - 1) < len(seq) - 1
            else:
                rewind(tc, len(seq) - 1)  # target saw the window; keep the accepted prefix
                reverify = False
            rewind(dc, len(seq) - 1)
            yield StepEvent(
                tokens=committed,
                accepted=a,
                drafted=g,
                draft_s=t1 - t0,
                verify_s=t2 - t1,
                extra={"per_step": {"draft_passes": info["passes"]}},
            )
    finally:
        rewind(tc, len(seq))
        rewind(dc, len(seq))


def _prefill_for_hidden(target, draft, tc, seq: list[int]) -> float:
    """A draft that reads the target's hidden states (an MTP head) drafts its first window
    from them only if the target has seen the prompt: feed the target seq[:-1] first (the
    first window then starts at seq[-1], as every later one does). Same target work, split in
    two passes; without it that window is drafted blind and almost all rejected. Seconds."""
    if not getattr(draft, "reads_target_hidden", False) or tc.offset >= len(seq) - 1:
        return 0.0
    t0 = time.perf_counter()
    target.forward(np.array([seq[tc.offset : len(seq) - 1]]), tc)
    return time.perf_counter() - t0


RUNS_HYBRID = ("target", "draft")  # causal windows: a HybridCache lands states on the prefix
NEEDS_DRAFT = True
RUNS_MODEL_FREE = True  # --draft lookup / suffix: chains read from text (runtime/drafts/)
RUNS_MIXED = True  # --draft head+suffix: the text's chain or the head's (runtime/drafts/mixed.py)


@dataclass
class Options:
    gamma: int = 4  # draft tokens per step (--gamma: every command's, runtime/cli_args.py)


def check(options: Options) -> None:
    check_gamma(options.gamma, "sd")


summarize = no_summary  # `sd` adds nothing to the run's stats beyond the shared figures


def steps(c: StepCall) -> Iterator[StepEvent]:
    """The method-table entry point (runtime.decoding.METHOD_MODULES)."""
    kw = c.keywords("seed", "target_cache", "draft_cache")
    return sd_steps(c.target, c.draft, c.seq, **kw, **option_keywords(c.options))
