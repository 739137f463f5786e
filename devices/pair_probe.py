"""`--method auto` on the pair at hand: measure what the latency model needs, then choose.

choose_for gathers the stage times (devices/pair_stages.py: the probe's measurements) and the
acceptance laws (devices/pair_laws.py: α, τ per γ, Ω̂), asks devices/method_choice.py for the
fastest method (and γ), and with γ free runs sd and mirror once each as trials (trial_rate)
whose measured rates correct the laws before the first choice. The probe's passes are the
chosen method's prefill (caches handed on). export_state / restore_state carry what this
process measured to devices/probe_store.py and back.
"""

from __future__ import annotations

import time
from dataclasses import replace

from devices import probe_memo as memo
from devices.method_choice import StageTimes
from devices.pair_laws import (  # noqa: F401 (observe_*: the command layer's auto_chooser)
    POOL_STEPS,
    PRIOR_OMEGA,
    RunLengths,
    alpha_for,
    branch_pool,
    observe_branches,
    observe_run,
    omega_estimate,
    pair_acceptance,
    pair_taus,
    prompt_hits,
)
from devices.pair_stages import from_profile, measure_stages, measure_windows

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


def stage_times(
    target,
    draft,
    ids,
    *,
    gamma,
    branches,
    kappa,
    exit_layer,
    sampling,
    profile=None,
    process=False,
    draft_branches=0,
    exit_head=None,
    acceptance=None,
    mirror=True,
) -> StageTimes:
    """Everything method_choice needs, for this pair and machine, with Ω̂ and Ω̂_own at their
    priors: the prompt's own (prompt_hits) are measured by choose_for, and only when they
    can change the pick. acceptance: α when the caller has it (from the pooled τ); else a
    short sd run measures it (pair_acceptance)."""
    n = target.config.num_layers
    le = n // 2 if exit_layer is None else exit_layer
    st = (
        from_profile(profile, gamma=gamma, branches=branches)
        if profile is not None
        else measure_stages(
            target,
            draft,
            gamma=gamma,
            branches=branches,
            process=process,
            sampling=sampling,
            kappa=kappa,
            exit_layer=le,
            exit_head=exit_head,
            mirror=mirror,
        )
    )
    if st["target_slowdown"] is None:  # unmeasurable: mirror is not a candidate (choose_for)
        st = dict(st, target_slowdown=1.0)
    alpha = acceptance
    if alpha is None:
        alpha = pair_acceptance(target, draft, ids, gamma=gamma, sampling=sampling)
    omega, own = PRIOR_OMEGA, (PRIOR_OMEGA / 2 if draft_branches else 0.0)
    return StageTimes(
        acceptance=alpha,
        omega_kappa=omega,
        exit_fraction=le / n,
        omega_own=own,
        own_rows=draft_branches,
        branch_batch=branches,
        **st,
    )


def runnable_methods(target, draft) -> list[str]:
    """The methods with a latency law that this pair can run."""
    from runtime.decoding import cannot_run

    out = ["ar"]
    if draft is not None:
        out.append("sd")
        coreml = str(getattr(draft, "backend", "")).startswith("coreml")  # batch 1: no branches
        if getattr(target, "supports_layer_range", False) and not coreml:
            out.append("mirror")
    return [m for m in out if cannot_run(m, target, draft) is None]


def choose_for(
    target,
    draft,
    ids,
    *,
    gamma: int,
    kappa: int | None,
    exit_layer: int | None,
    branches: int | None,
    sampling,
    profile=None,
    target_cache=None,
    draft_cache=None,
    draft_process: bool | None = None,
    draft_branches: int | None = None,
    exit_head: str | None = None,
    gammas=None,
    factors: dict[str, float] | None = None,
) -> dict:
    """`--method auto` for this pair and prompt: the method_choice.choose record.
    Empty caches given are left holding the prompt when Ω̂ is measured (prompt_hits), else
    empty; the chosen method continues from them either way. draft_process,
    draft_branches and exit_head are mirror's (None: its defaults), so the prediction is of
    the mirror that would run: its worker's slowdown, its exit head, its own branches.
    gammas: choose γ among these too (method_choice.choose_joint): the record's "gamma" is the
    one to run; the stage times other than the window passes are `gamma`'s. With `gammas`
    and mirror a candidate, sd and mirror each run once per pair and regime at their
    predicted best γ (trial_rate), and that record's "trials" carry the measured rates for
    the chooser's corrections. factors: the chooser's measured/predicted factors per method
    (method_choice.Corrections), with which Ω̂ is measured on the prompt only when it can
    change the pick (method_choice.mirror_cannot_win); else the caches given stay empty."""
    from devices.method_choice import choose, choose_joint, mirror_cannot_win
    from runtime.decoding.mirror import draft_in_process, wave_shape
    from runtime.mirror.draft_worker import own_branches

    process = draft_in_process(target, draft, draft_process)
    branches, draft_branches = wave_shape(draft, branches, draft_branches)
    own = own_branches(draft, draft_branches)
    le = target.config.num_layers // 2 if exit_layer is None else exit_layer
    kappa = kappa or 8

    runnable = runnable_methods(target, draft)
    if runnable == ["ar"]:
        return {"choice": "ar", "why": "no draft model: ar is the only method", "predictions": {}}
    mirror = "mirror" in runnable
    if profile is None:
        st = measure_stages(
            target,
            draft,
            gamma=gamma,
            branches=branches,
            process=process,
            sampling=sampling,
            kappa=kappa,
            exit_layer=le,
            exit_head=exit_head,
            mirror=mirror,
        )
        if st["target_slowdown"] is None:  # the draft failed in its worker thread or process
            runnable.remove("mirror")
    joint = bool(gammas) and profile is None  # a profile's windows follow its own law in γ
    # choosing γ, each γ's α comes from the pooled τ: no separate α run (pair_acceptance)
    taus = (
        pair_taus(target, draft, ids, gammas=sorted({*gammas, gamma}), sampling=sampling)
        if joint
        else None
    )
    t = stage_times(
        target,
        draft,
        ids,
        gamma=gamma,
        branches=branches,
        kappa=kappa,
        exit_layer=le,
        sampling=sampling,
        profile=profile,
        process=process,
        draft_branches=own,
        exit_head=exit_head,
        mirror=mirror,
        acceptance=alpha_for(taus[gamma], gamma) if joint else None,
    )
    by_gamma = {gamma: t}
    if joint:
        shape = dict(kappa=kappa, exit_layer=le, exit_head=exit_head, mirror=mirror)
        by_gamma = times_by_gamma(t, target, draft, gammas, taus, sampling=sampling, **shape)
    skipped = mirror_cannot_win(by_gamma, runnable, factors)
    pool = branch_pool(target, draft, sampling, kappa, own)
    pooled = pool[0] >= POOL_STEPS  # the runs pin Ω̂: the prompt is not probed
    if not skipped:  # else the caches stay empty: the chosen method's first window pass then
        # holds the prompt too (sd: one fused pass), where a separate prefill pass cost about
        # one window pass more per prompt (18 ms of a 0.8 s answer on this CPU)
        hits = (
            ([], [])
            if pooled
            else prompt_hits(
                target,
                draft,
                ids,
                sampling=sampling,
                kappa=kappa,
                exit_layer=le,
                target_cache=target_cache,
                draft_cache=draft_cache,
                draft_branches=own,
                exit_head=exit_head,
            )
        )

        def with_omega(by_gamma: dict) -> dict:  # the pooled runs' hits as they stand now
            omega, omega_own = omega_estimate(*hits, draft_branches=own, pool=pool)
            return {
                g: replace(v, omega_kappa=omega, omega_own=omega_own) for g, v in by_gamma.items()
            }

        by_gamma = with_omega(by_gamma)
    rec = (
        choose_joint(by_gamma, runnable)
        if joint
        else {**choose(by_gamma[gamma], gamma, runnable), "gamma": gamma}
    )
    rec["branch_shape"] = {"kappa": kappa, "own_rows": own}  # observe_branches's pool
    if skipped:
        rec["omega"] = skipped
        rec["why"] += f"; {skipped}"
    elif pooled:
        rec["omega_from"] = f"{pool[0]} mirror steps pooled on this pair (the prompt not probed)"
    if not joint:
        return rec
    opts = dict(
        kappa=kappa,
        exit_layer=le,
        branches=branches,
        draft_process=draft_process,
        draft_branches=own,
        exit_head=exit_head,
    )
    rescored = None if skipped else lambda: with_omega(by_gamma)
    return with_trials(rec, target, draft, ids, runnable, sampling, opts, rescored)


def times_by_gamma(
    t: StageTimes,
    target,
    draft,
    gammas,
    taus: dict,
    *,
    kappa: int,
    exit_layer: int,
    exit_head: str | None,
    sampling,
    mirror: bool,
) -> dict:
    """`t` at each γ of `gammas`: the measured window passes (measure_windows) and α from the
    pooled τ (alpha_for); the other stage times are `t`'s."""
    wins = measure_windows(
        target,
        sorted(set(gammas)),
        kappa=kappa,
        exit_layer=exit_layer,
        exit_head=exit_head,
        greedy=sampling is None or sampling.greedy,
        draft=draft,
        sampling=sampling,
        mirror=mirror,
    )
    return {
        g: replace(
            t,
            target_window=w["target_window"],
            mirror_window=w.get("mirror_window"),
            draft_window=w.get("draft_window"),
            acceptance=alpha_for(taus[g], g),
        )
        for g, w in wins.items()
    }


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


def export_state(target, draft) -> list[dict]:
    """This pair's cached figures (stage times, windows, trial rates, pooled runs, α) as JSON
    entries for devices/probe_store.py: the models' ids in each key become "@target" and
    "@draft". An entry is the pair's when its key holds both."""
    marks = {id(target): "@target", id(draft): "@draft"}
    out = []
    for table, tab in ((memo.CACHE, "cache"), (memo.ALPHA, "alpha")):
        for key, value in table.items():
            if id(target) not in key or id(draft) not in key:
                continue
            k = [marks.get(x, x) if type(x) is int else x for x in key]
            if isinstance(value, RunLengths):
                v = {"runs": {"risk": value.risk.tolist(), "survived": value.survived.tolist()}}
            elif key[0] == "windows":
                v = {"by_gamma": {str(g): w for g, w in value.items()}}
            else:
                v = {"value": value}
            out.append({"table": tab, "key": k, **v})
    return out


KEPT = ", kept from "  # restore_state's note in a stage-times source


def restore_state(target, draft, entries: list[dict], note: str = "") -> int:
    """Put export_state's entries back, keyed by these models; an entry the process already
    holds stays (it is newer). Stage times' "source" gains `note`. Returns how many were put."""
    ids = {"@target": id(target), "@draft": id(draft)}
    put = 0
    for e in entries:
        key = tuple(tuple(x) if isinstance(x, list) else ids.get(x, x) for x in e["key"])
        table = memo.ALPHA if e["table"] == "alpha" else memo.CACHE
        if key in table:
            continue
        if "runs" in e:
            value = RunLengths()
            value.risk[:] = e["runs"]["risk"]
            value.survived[:] = e["runs"]["survived"]
        elif "by_gamma" in e:
            value = {int(g): w for g, w in e["by_gamma"].items()}
        else:
            value = e["value"]
            if isinstance(value, dict) and "source" in value and note:
                base = value["source"].split(KEPT)[0]  # an earlier restore's note goes
                value = dict(value, source=f"{base}{KEPT}{note}")
        table[key] = value
        put += 1
    return put
