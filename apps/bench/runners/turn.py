"""What one runner returns for one turn, shared by Duet's methods and the baselines.

A runner is any object with `name`, `settings()` (its backend and thread
settings, for the report) and `generate(ids, max_new, temp, top_p, seed) ->
TurnResult`. Each stops at the target's EOS or `max_new` tokens, and its wall
time covers prefill and decoding, as a user would see it. A baseline whose library refuses
the pair (HF assisted generation and mlx-lm on hybrid, stateful models) returns
`refused(text)`: the row then shows the library's own words, not a number.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TurnResult:
    tokens: list[int]  # generated ids (EOS included when reached)
    wall_s: float
    accept_lengths: list[int] | None  # committed tokens per target pass; None if unobservable
    note: str | None = None  # why accept_lengths is None, or anything else a reader must know
    stage_s: dict | None = None  # Duet's methods: seconds in drafting and in verification
    verified_tokens: int | None = None  # Duet's methods: tokens the target's passes verified
    refused: str | None = None  # the library's own refusal; nothing else is meaningful then
    draft_passes: list | None = None  # sd / mirror: the draft passes J per window (SS: < γ)


def refused(text: str) -> TurnResult:
    """The turn a baseline returns when its library refuses to run this pair."""
    return TurnResult([], 0.0, None, note="refused", refused=text)
