"""What crosses the token channel between the target and the draft workers.

Per step the target sends two messages (Mirror-SD §3.1): the early-exit
message (top-κ ids + bf16 log-probs for each window position, as bytes) and
the final-verification message (A, c). The draft answers with the next
window. Each message carries its step number and the shared-clock time it
was sent, so the receiver can time the rendezvous.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class EarlyExit:
    step: int
    payload: bytes  # kernels.topk_channel.encode(ids, logp)
    sent_ns: int


@dataclass
class FinalVerify:
    step: int
    accepted: int  # A
    token: int  # c: the correction, or the bonus token when A == γ
    sent_ns: int


@dataclass
class Window:
    """The draft's proposal for `step`: γ tokens and the law each was drawn from."""

    step: int
    tokens: list[int]
    q: np.ndarray  # (γ, V): the laws, or the logits they come from when `logits`
    sent_ns: int
    source: str  # "initial", "reuse" or "fallback"
    info: dict = field(default_factory=dict)  # the draft's timings for the step just verified
    # q holds the logits of a branch wave's rows, drawn by Gumbel-max without a softmax
    # (draft_worker.Wave): the receiver forms the laws, for the one window it verifies
    logits: bool = False

    def laws(self, sampling) -> np.ndarray:
        """q as laws (γ, V): sampling.probs of the logits, when the window carries those."""
        return sampling.probs(self.q) if self.logits else self.q


@dataclass
class WorkerFailed:
    error: BaseException


STOP = object()
