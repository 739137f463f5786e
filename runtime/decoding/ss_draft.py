"""Drafting a window with a speculative-streaming (SS) draft: J internal passes for γ tokens.

Mirror-SD §3.2 and App. C: each internal pass feeds the draft the last drawn token and the
lookahead guesses of the previous pass as main-stream tokens, with streams on each of them.
The main stream's logits at each fed position are the draft's own next-token law q; walking
along the guesses, a token is drawn from q (argmax when greedy, else from q with one fresh
uniform, exactly as `sd.draft_window` draws it) and the walk goes on while the drawn token
equals the guess, so one pass emits η ≥ 1 tokens (verified guesses + one drawn token). The
streams at the last position walked give the next pass's guesses.

So the window is a draw from the main stream's autoregressive law, token for token the one
`sd.draft_window` would draw with the same uniforms, and each q returned is the law its
token was drawn from (App. B): the streams only decide how many tokens one pass yields
(J ≤ ⌈γ/η̄⌉), never which tokens come out.
"""

from __future__ import annotations

import numpy as np

from runtime.decoding.events import Sampling, draw, pending, rewind


def is_ss_draft(draft) -> bool:
    """True when `draft` can run lookahead streams (runtime/drafts/ss/torch.py)."""
    return getattr(draft, "ss_streams", 0) > 0


def ss_draft_window(
    draft,
    cache,
    seq: list[int],
    gamma: int,
    sampling: Sampling,
    rng,
    law=None,
    gumbel: bool = False,
) -> tuple[list[int], np.ndarray, int]:
    """Draft γ tokens after `seq` with SS passes; returns (tokens, q (γ, V), J passes).

    q is empty when greedy (verification needs none), as in `sd.draft_window`; `law(q)`
    replaces each q by the law the verifier will see before the token is drawn (None: the
    window ends there, as in `sd.draft_window`); gumbel: draws by Gumbel-max (events.draw),
    as Mirror-SD's branch waves draw. On return
    the cache holds seq + d1..d(γ-1), as after `sd.draft_window`.
    """
    toks: list[int] = []
    qs: list[np.ndarray] = []
    feed = pending(cache, seq)  # tokens the cache lacks; the last one's main logits give d1
    guesses: list[int] = []
    passes = 0
    stopped = False  # a law returned None: the window ends (SQS §4's bit budget)
    while len(toks) < gamma and not stopped:
        base = cache.offset + len(feed)  # cache length once every fed token is in
        inp = feed + guesses
        first = len(feed) - 1  # streams on the last fed token and on every guess
        main, streams = draft.forward_streams(np.array([inp]), cache, first=first)
        passes += 1
        walked = 0  # guesses confirmed in this pass
        while True:
            got = draw(main[0, first + walked], sampling, rng, law, gumbel)
            if got is None:  # the law ended the window (SQS §4's budget)
                stopped = True
                break
            d, q = got
            if q is not None:
                qs.append(q)
            toks.append(d)
            if len(toks) == gamma or walked >= len(guesses) or d != guesses[walked]:
                break
            walked += 1  # the guess is the token drawn: its main logits are valid next
        rewind(cache, base + walked)  # keep the fed tokens and the confirmed guesses
        if stopped:
            break
        room = gamma - len(toks) - 1  # tokens still to draw after the one just drawn
        guesses = [int(t) for t in streams[0, walked].argmax(-1)[:room]] if room > 0 else []
        feed = [d]
    rewind(cache, len(seq) + len(toks) - 1)
    q = np.stack(qs) if qs else np.zeros((0, draft.config.vocab_size), np.float32)
    return toks, q, passes
