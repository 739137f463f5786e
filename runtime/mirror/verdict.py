"""One Mirror-SD step's verdict on the target's side, and the figures the step reports from it.

The target's pass (runtime/decoding/mirror.py) gives a `Verdict`: the early exit it sent, its
final logits and (A, c), with the pass's times on the shared clock. `step_figures` turns it
into the step's StepEvent.extra, which summary.py sums over a run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime.mirror.branches import in_tree
from runtime.mirror.messages import Window


@dataclass
class Verdict:
    """One step's target pass: the early exit it sent, the final logits and (A, c)."""

    ids: np.ndarray  # the early exit's top-κ ids, (γ + 1, κ)
    payload: bytes  # the early-exit message
    logits: np.ndarray  # the target's final logits over the window, (γ + 1, V)
    p: np.ndarray | None  # their laws when sampling
    a: int
    c: int
    t0: int  # the pass began
    t1: int  # the early exit was sent
    t2: int  # the verdict was reached


def step_figures(v: Verdict, win: Window, labels: dict) -> dict:
    """The step's figures known once (A, c) is sent; `labels`: the run's (exit layer and
    head, κ, where the draft worker runs), repeated on every step."""
    q_final = v.p[v.a] if v.p is not None else _softmax(v.logits[v.a])  # verified row
    return {
        "prefix_s": (v.t1 - v.t0) / 1e9,
        "suffix_s": (v.t2 - v.t1) / 1e9,
        "ee_sent_ns": v.t1,
        "fv_sent_ns": v.t2,
        "in_tree": in_tree(v.a, v.c, v.ids),  # App. E: F_t = 1 - in_tree
        "omega_kappa": float(q_final[v.ids[v.a]].sum()),  # eq. 9 at the correction position
        "payload_bytes": len(v.payload),
        "window_source": win.source,
        **labels,
        # J: draft passes that made this window (an SS draft's η ≥ 1 per pass, §3.2)
        "per_step": {"draft_passes": win.info.get("draft_passes")},
    }


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max())
    return z / z.sum()
