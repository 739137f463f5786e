"""The passes the probe times, each built as its method runs it (devices/pair_stages.py).

wave_pass   one γ-deep branch wave of Mirror-SD's worker (fork, masks, draws);
mirror_pass mirror's split verification pass: layers 1..ℓe, the exit head and its top-κ
            message, layers ℓe+1..N;
sd_drafts   sd's γ drafts, 1-row passes back to back with their draws.
Each returns a function running the pass once and leaving the caches as it found them.
"""

from __future__ import annotations

import numpy as np


def wave_pass(draft, cache, *, branches: int, gamma: int, sampling=None):
    """A function running one γ-deep wave of `branches` rows as Mirror-SD's worker does
    (draft_worker.Wave: fork, masks, and at T > 0 each row's law and draw): its time / γ is
    the branch pass that eq. (10)'s wave term counts. A bare batched forward left the masks
    and the sampling out (EMULATED m3-max T = 1: 3.5 ms timed, 4.9 ms as the wave ran)."""
    from runtime.decoding.events import GREEDY
    from runtime.decoding.ss_draft import is_ss_draft
    from runtime.mirror.branches import Branch
    from runtime.mirror.ss_wave import SSWave
    from runtime.mirror.wave import Wave, fork_rows

    kind = SSWave if is_ss_draft(draft) else Wave  # as the worker picks it (§3.2: η ≥ 1)
    law = sampling or GREEDY
    base = cache.offset - gamma  # the cache holds committed + d1..dγ
    chunk = [Branch(i % (gamma + 1), i, 0.0) for i in range(branches)]

    def run():
        wave = kind(
            draft,
            fork_rows(cache, chunk, base),
            chunk,
            base,
            [gamma] * branches,
            [np.random.default_rng(i) for i in range(branches)],
            law,
        )
        while not wave.finished():
            wave.advance()

    return run


def mirror_pass(
    target,
    cache,
    window,
    *,
    kappa: int,
    exit_layer: int | None,
    exit_head: str | None,
    greedy: bool,
):
    """A function running mirror's verification pass as runtime/decoding/mirror.py does:
    layers 1..ℓe, the early-exit head and its top-κ message (at T > 0 the step's noise table
    and the coupled message), layers ℓe+1..N and the head; None if the target cannot split."""
    if not getattr(target, "supports_layer_range", False):
        return None
    from kernels.topk_channel import encode, topk_message
    from runtime.decoding.events import Sampling, step_noise
    from runtime.mirror.coupled import coupled_message
    from runtime.mirror.exit_head import resolve_exit_head

    n = target.config.num_layers
    le = n // 2 if exit_layer is None else exit_layer
    tuned = resolve_exit_head(target, le, exit_head)
    law = Sampling(1.0)  # at T > 0 the pass costs the same whatever the temperature
    g = window.shape[1] - 1
    drafts = window[0, 1:].tolist()

    def run():
        h = target.forward_layers(window, cache, 0, le)
        exit_logits = target.head(h if tuned is None else tuned.apply(h))[0]
        if greedy:
            ids, logp = topk_message(exit_logits, kappa)
        else:
            _, noise = step_noise(0, 0, g, exit_logits.shape[-1])
            ids, logp = coupled_message(law.log_probs(exit_logits), drafts, noise, kappa)
        encode(ids, logp)
        target.head(target.forward_layers(h, cache, le, n))
        cache.trim(window.shape[1])

    return run


def sd_drafts(draft, prompt, gamma: int, sampling=None):
    """A function drafting γ tokens as sd does (runtime.decoding.sd.draft_window: γ 1-row
    passes back to back, each with its draw) after `prompt`, then rewinding the cache."""
    from runtime.decoding.events import GREEDY, rewind
    from runtime.decoding.sd import draft_window

    seq = [int(x) for x in prompt[0]]
    dc = draft.new_cache()
    draft.forward(prompt[:, :-1], dc)
    rng = np.random.default_rng(0)
    law = sampling if sampling is not None else GREEDY

    def run():
        draft_window(draft, dc, seq, gamma, law, rng)
        rewind(dc, len(seq) - 1)

    return run
