"""The paired percentile bootstrap over prompts behind every 95 % interval the benches print.

A resample draws prompt indices with replacement; the statistic is computed from that one draw
for every quantity it compares (adaptive and fixed K, T = 1 and T = 0, two drafts), so the
interval is paired; `ci_note` is how a row prints it. Used by apps/bench/edge.py,
apps/bench/studies/edge_keep.py and apps/train/draft_eval.py. It resamples; it does not decide
what a statistic is.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def prompt_ci(
    stat: Callable[[np.ndarray], float],
    n: int,
    resamples: int = 2000,
    rng: np.random.Generator | None = None,
) -> list[float]:
    """[2.5th, 97.5th] percentile of `stat(pick)` over `resamples` draws of n prompt indices
    (`pick`, (n,) int) with replacement; `rng` defaults to seed 0."""
    rng = rng if rng is not None else np.random.default_rng(0)
    picks = rng.integers(0, n, size=(resamples, n))
    lo, hi = np.percentile([stat(p) for p in picks], [2.5, 97.5])
    return [float(lo), float(hi)]


def ci_note(ci: list[float] | None, scale: float = 1.0, digits: int = 3) -> str:
    """How a printed row ends with its interval: ", 95 % CI [lo, hi]" (times `scale`, to
    `digits` decimals), or "" for a row without one."""
    if not ci:
        return ""
    lo, hi = (f"{scale * x:.{digits}f}" for x in ci)
    return f", 95 % CI [{lo}, {hi}]"
