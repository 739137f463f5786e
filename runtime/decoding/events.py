"""What a decoding step reports, and the sampling settings every strategy takes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kernels.sampling import probs_from_logits


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn. temp == 0 is greedy. The same settings shape p and q."""

    temp: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temp == 0

    def probs(self, logits: np.ndarray) -> np.ndarray:
        return probs_from_logits(logits, self.temp, self.top_p, self.top_k)


GREEDY = Sampling()


@dataclass
class StepEvent:
    """One decoding step: the tokens it committed and where its time went."""

    tokens: list[int]  # committed this step: accepted drafts + the correction/bonus token
    accepted: int = 0  # draft tokens accepted (A)
    drafted: int = 0  # draft tokens proposed (γ for this step)
    draft_s: float = 0.0
    verify_s: float = 0.0
    extra: dict = field(default_factory=dict)  # strategy-specific (reuse, bytes, ...)


def rewind(cache, keep: int) -> None:
    """Trim `cache` so it holds at most the first `keep` tokens of the sequence."""
    if cache is not None and cache.offset > keep:
        cache.trim(cache.offset - keep)


def pending(cache, seq: list[int]) -> list[int]:
    """Tokens of `seq` the cache has not seen yet (at least the last one, to get its logits)."""
    if cache.offset >= len(seq):
        cache.trim(cache.offset - len(seq) + 1)
    return seq[cache.offset :]
