"""Auto's trial runs: sd and mirror run once each per pair and regime, and their measured rates
correct the laws before the first choice (devices/method_choice.Corrections).

trial_rate times one method at one γ over TRIAL_TOKENS (its first TRIAL_SKIP steps left out);
with_trials adds the trials at each method's predicted best γ to choose_for's joint record.
"""

from __future__ import annotations

import time

from devices import probe_memo as memo
from devices.pair_laws import observe_branches, observe_run

TRIAL_TOKENS, TRIAL_SKIP = 64, 2  # trial runs: tokens, and first steps left out of the rate


def trial_rate(
    method: str, target, draft, ids: list[int], *, gamma: int, sampling, **options
) -> float | None:
    """Tokens per second of `method` at γ on `ids` over TRIAL_TOKENS, measured after its
    first TRIAL_SKIP steps (a worker's start and first shapes are paid once per run or per
    process, not per token); None when the run is too short to tell. Cached per pair, method
    and γ: the measured side of auto's corrections (method_choice.Corrections) before any
    chosen run has reported, where the stage times miss what only a whole run shows (an H100
    target: the probe put the draft process's slowdown at 0.88x, the mirror run at 1.5x)."""
    from runtime.decoding import make_steps

    key = _trial_key("trial", method, target, draft, gamma, sampling)
    if key in memo.CACHE:
        return memo.CACHE[key]
    n = max(1, min(TRIAL_TOKENS, target.config.max_context - len(ids) - gamma - 2))
    steps = make_steps(
        method,
        target,
        draft,
        list(ids),
        max_new=n,
        sampling=sampling,
        seed=0,
        gamma=gamma,
        **options,
    )
    made, total, t0, committed, hits, timed = 0, 0, None, [], [], 0
    try:
        for i, ev in enumerate(steps):
            total += len(ev.tokens)
            committed.append(len(ev.tokens))
            hits.append(ev.extra.get("per_step", {}).get("branch_hit"))
            if i == TRIAL_SKIP - 1:
                t0 = time.perf_counter()
            elif i >= TRIAL_SKIP:
                made += len(ev.tokens)
                timed += 1
            if total >= n:
                break
    finally:
        steps.close()
    rate = made / (time.perf_counter() - t0) if made and t0 is not None else None
    memo.CACHE[key] = rate
    memo.CACHE[_trial_key("trial steps", method, target, draft, gamma, sampling)] = (
        made / timed if timed else None
    )
    if method in ("sd", "mirror"):  # its accepted runs join the pair's τ(γ) as well
        observe_run(target, draft, sampling, committed, gamma)
    if method == "mirror":  # and mirror's branch hits the pair's Ω̂ (omega_estimate)
        observe_branches(
            target,
            draft,
            sampling,
            hits,
            kappa=options["kappa"],
            own_rows=options["draft_branches"],
        )
    return rate


def trial_tokens_per_step(method: str, target, draft, gamma: int, sampling) -> float | None:
    """The tokens per step of trial_rate's timed steps (None: not measured in this process)."""
    return memo.CACHE.get(_trial_key("trial steps", method, target, draft, gamma, sampling))


def _trial_key(table: str, method: str, target, draft, gamma: int, sampling) -> tuple:
    """trial_rate's cache key (its rate, or its tokens per step) for one pair, γ and regime."""
    return (
        table,
        method,
        id(target),
        id(draft),
        gamma,
        sampling.temp,
        sampling.top_p,
        sampling.top_k,
    )


def with_trials(
    rec: dict, target, draft, ids, runnable: list[str], sampling, opts: dict, rescored
) -> dict:
    """choose_for's joint record with, once per pair and regime, sd's and mirror's trial runs
    at their predicted best γ (rec["trials"]); when mirror's trial ran and `rescored` is given
    (a function returning the γ table with Ω̂ as it stands now), the choice is made again."""
    from devices.method_choice import choose_joint

    once = ("trials", id(target), id(draft), sampling.temp, sampling.top_p, sampling.top_k)
    if len(runnable) <= 2 or once in memo.CACHE:  # sd and mirror: once per pair
        return rec
    memo.CACHE[once] = True  # (the chosen runs correct it afterwards: a trial per new γ cost
    # a 64-token run inside a later prompt's turn as the pooled τ moved the best γ)
    rec["trials"] = {}
    for m in (x for x in runnable if x != "ar"):
        g = max(rec["by_gamma"], key=lambda h: rec["by_gamma"][h][m]["tokens_per_s"])
        rate = trial_rate(m, target, draft, ids, gamma=g, sampling=sampling, **opts)
        if rate:
            rec["trials"][m] = {"gamma": g, "tokens_per_s": round(rate, 2),
                                "tokens_per_step": trial_tokens_per_step(m, target, draft, g,
                                                                         sampling)}  # fmt: skip
    if "mirror" in rec["trials"] and rescored is not None:  # its trial's hits now join Ω̂:
        # choose again (the trials' rates then correct this record: method_choice.Corrections)
        rec = {**choose_joint(rescored(), runnable), "trials": rec["trials"],
               "branch_shape": rec["branch_shape"]}  # fmt: skip
    return rec
