"""`--method auto` for a target alone: `ar`, or `sd` with a model-free draft (runtime/drafts/).

The latency law. A target step over a window of 1 + g tokens costs T(g) = T1·(1 + c·g)
(measured: devices/pair_stages.measure_windows, affine in g); a model-free draft costs
T_d per step (measured on the prompt: its index built once, then a proposal per step) and
proposes a token only where the text backs it, with an estimated chance p of being accepted.
Verifying that token costs c·T1 and, accepted, saves a whole step T1, so it pays exactly
when p > c: auto sets the draft's floor on p (`min_prob`) to c, and a step where nothing
clears it is the target's own step (no drafts). sd with the draft then runs at least as fast
as `ar` in expectation, less T_d, whatever the prompt; so auto takes it when c < 1 (a
verified token costs less than a step) and T_d is a small share of T1 (MAX_DRAFT_SHARE), and
`ar` otherwise. γ is only a ceiling here (ALONE_GAMMA, or the draft's own `alone_gamma`): the
chances set each step's length. Prompt lookup's chances are shares of a handful of earlier
occurrences (one occurrence: 1.0 for every token it continues with), so its ceiling is the
default γ: on SmolLM2-135M's chat prompts (int4 ONNX target) sd+lookup ran at 1.23x / 1.18x /
1.11x ar at γ 4 / 8 / 12 on summarization and RAG, and auto at ceiling 16 at 1.18x overall
against sd+lookup's 1.34x; at ceiling 4 auto and sd+lookup ran the same steps (80.0 tok/s
each). The suffix draft caps each proposal by its match's length (runtime/drafts/suffix.py)
and keeps 16 (sd+suffix 1.29x / 1.32x / 1.33x at γ 4 / 8 / 12 there).
"""

from __future__ import annotations

import statistics
import time

ALONE_GAMMA = 16  # sd's ceiling on drafts per step; the draft's chances decide how many
MAX_DRAFT_SHARE = 0.1  # a draft costing more than this share of a target step is not taken
WINDOW = 8  # the window over which the target's cost per verified token is measured


def draft_cost(draft, ids: list[int], gamma: int, repeats: int = 20) -> tuple[float, float]:
    """(seconds to index `ids` once, median seconds of one proposal after it) for `draft`."""
    cache = draft.new_cache()
    t0 = time.perf_counter()
    draft.chain(cache, ids, gamma)  # indexes ids[:-1], then proposes
    index_s = time.perf_counter() - t0
    times = []
    for i in range(repeats):
        seq = ids[: max(2, len(ids) - repeats + i + 1)]
        t0 = time.perf_counter()
        draft.chain(cache, seq, gamma)
        times.append(time.perf_counter() - t0)
    return index_s, statistics.median(times)


def target_costs(target) -> dict:
    """{"target_step_s": a one-token pass, "verify_token_share": c}: the target's part of the
    law, measured (the draft's is measured per prompt: draft_cost)."""
    from devices.pair_stages import measure_windows

    win = measure_windows(target, (0, WINDOW // 2, WINDOW), mirror=False)
    t1 = win[0]["target_window"]
    share = max(0.0, (win[WINDOW]["target_window"] - t1) / (WINDOW * t1))
    return {"target_step_s": t1, "verify_token_share": share}


def choose_alone(
    target, draft, ids: list[int], *, gamma: int | None = None, costs: dict | None = None
) -> dict:
    """auto's record for a target alone with model-free `draft`: the step cost and cost per
    verified token (`costs`, kept from an earlier run, else measured now: target_costs), the
    draft's cost, the choice ("ar" or "sd"), its γ and why. Sets the draft's `min_prob` to the
    cost per verified token when it chooses sd."""
    g = gamma or getattr(draft, "alone_gamma", ALONE_GAMMA)
    costs = costs or target_costs(target)
    t1, c = float(costs["target_step_s"]), float(costs["verify_token_share"])
    index_s, step_s = draft_cost(draft, list(ids), g)
    share = step_s / t1
    rec = {"alone": True, "draft": draft.name, "target_step_s": t1, "verify_token_share": c,
           "draft_step_s": step_s, "draft_index_s": index_s, "draft_share": share}  # fmt: skip
    if c >= 1:
        why = f"a verified token costs {c:.2f} of a target step: speculation cannot pay"
        return rec | {"choice": "ar", "why": why}
    if share > MAX_DRAFT_SHARE:
        why = f"the {draft.name} draft costs {share:.1%} of a target step"
        return rec | {"choice": "ar", "why": why}
    if hasattr(draft, "min_prob"):
        draft.min_prob = max(draft.min_prob, c)
    why = (
        f"a target alone: sd with the {draft.name} draft (no model) drafts a token only where "
        f"its chance beats its cost ({c:.2f} of a step); the draft costs {share:.1%} "
        "of a step"
    )
    return rec | {
        "choice": "sd",
        "gamma": g,
        "min_prob": getattr(draft, "min_prob", None),
        "why": why,
    }
