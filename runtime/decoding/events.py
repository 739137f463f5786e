"""What a decoding step reports, and the sampling settings every strategy takes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kernels.sampling import log_probs_from_logits, probs_from_logits, sample


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn. temp == 0 is greedy. The same settings shape p and q."""

    temp: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temp == 0

    def probs(self, logits: np.ndarray, out=None) -> np.ndarray:
        return probs_from_logits(logits, self.temp, self.top_p, self.top_k, out=out)

    def log_probs(self, logits: np.ndarray) -> np.ndarray:
        """log self.probs(logits), -inf where filtered (temp > 0 only)."""
        return log_probs_from_logits(logits, self.temp, self.top_p, self.top_k)


GREEDY = Sampling()


def draw(
    logits: np.ndarray, sampling: Sampling, rng, law=None
) -> tuple[int, np.ndarray | None] | None:
    """One draft token from its logits (V,): (d, q), q the law d was drawn from (None when
    greedy without `law`: greedy verification needs none). `law(q) -> q_hat` replaces q by the
    law the verifier will see (a lossy codec's q̂, SQS §2) before the draw; a law that returns
    None ends the window before any draw (SQS §4's bit budget), and so does this: None."""
    if sampling.greedy:
        if law is None:
            return int(logits.argmax()), None
        q = law(Sampling(1.0).probs(logits))  # a codec that always carries q̂: softmax's
        return None if q is None else (int(logits.argmax()), q)
    q = sampling.probs(logits)
    if law is not None:
        q = law(q)
        if q is None:
            return None
    return int(sample(q, rng.random())), q  # SQS §2: drawn from the q̂ sent


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
