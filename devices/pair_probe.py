"""`--method auto` on the pair at hand: measure what the latency model needs, then choose.

choose_for gathers the stage times (devices/pair_stages.py: the probe's measurements) and the
acceptance laws (devices/pair_laws.py: α, τ per γ, Ω̂), asks devices/method_choice.py for the
fastest method (and γ), and with γ free runs sd and mirror once each as trials
(devices/pair_trials.py) whose measured rates correct the laws before the first choice. The
probe's passes are the chosen method's prefill (caches handed on). devices/probe_export.py
carries what this process measured to devices/probe_store.py and back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from devices.method_choice import StageTimes
from devices.pair_laws import (  # noqa: F401 (observe_*: the command layer's auto_chooser)
    POOL_STEPS,
    PRIOR_OMEGA,
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
from devices.pair_trials import with_trials


@dataclass(frozen=True)
class MirrorShape:
    """The mirror that would run on this pair, whose stage times and trials the probe takes:
    κ, the exit layer ℓe and head, the branch wave's rows, the draft's own rows, and whether its
    worker runs in a process (as asked, and as it will be)."""

    kappa: int
    exit_layer: int
    exit_head: str | None
    branches: int
    own: int
    draft_process: bool | None
    process: bool

    def split(self) -> dict:
        """Where and how mirror's verification pass splits: κ, ℓe and the exit head."""
        return dict(kappa=self.kappa, exit_layer=self.exit_layer, exit_head=self.exit_head)

    def run_options(self) -> dict:
        """The options a mirror (or sd) trial runs with (pair_trials.trial_rate)."""
        rows = dict(branches=self.branches, draft_branches=self.own)
        return dict(**self.split(), **rows, draft_process=self.draft_process)


def mirror_shape(
    target, draft, *, kappa, exit_layer, branches, draft_process, draft_branches, exit_head
) -> MirrorShape:
    """mirror's defaults filled in for this pair (None: the method's own choice)."""
    from runtime.decoding.mirror import draft_in_process, wave_shape
    from runtime.mirror.draft_worker import own_branches

    process = draft_in_process(target, draft, draft_process)
    branches, draft_branches = wave_shape(draft, branches, draft_branches)
    return MirrorShape(
        kappa=kappa or 8,
        exit_layer=target.config.num_layers // 2 if exit_layer is None else exit_layer,
        exit_head=exit_head,
        branches=branches,
        own=own_branches(draft, draft_branches),
        draft_process=draft_process,
        process=process,
    )


def stages_at(target, draft, s: MirrorShape, *, gamma, sampling, mirror, profile=None) -> dict:
    """The stage times at γ: the profile's when one is given, else measured on the pair."""
    if profile is not None:
        return from_profile(profile, gamma=gamma, branches=s.branches)
    rows = dict(branches=s.branches, process=s.process)
    return measure_stages(
        target, draft, gamma=gamma, sampling=sampling, mirror=mirror, **rows, **s.split()
    )


def stage_times(
    target,
    draft,
    ids,
    s: MirrorShape,
    *,
    gamma,
    sampling,
    profile=None,
    acceptance=None,
    mirror=True,
) -> StageTimes:
    """Everything method_choice needs, for this pair and machine, with Ω̂ and Ω̂_own at their
    priors: the prompt's own (prompt_hits) are measured by choose_for, and only when they
    can change the pick. acceptance: α when the caller has it (from the pooled τ); else a
    short sd run measures it (pair_acceptance)."""
    st = stages_at(target, draft, s, gamma=gamma, sampling=sampling, mirror=mirror, profile=profile)
    if st["target_slowdown"] is None:  # unmeasurable: mirror is not a candidate (choose_for)
        st = dict(st, target_slowdown=1.0)
    alpha = acceptance
    if alpha is None:
        alpha = pair_acceptance(target, draft, ids, gamma=gamma, sampling=sampling)
    omega, own = PRIOR_OMEGA, (PRIOR_OMEGA / 2 if s.own else 0.0)
    return StageTimes(
        acceptance=alpha,
        omega_kappa=omega,
        exit_fraction=s.exit_layer / target.config.num_layers,
        omega_own=own,
        own_rows=s.own,
        branch_batch=s.branches,
        **st,
    )


def runnable_methods(target, draft) -> list[str]:
    """The methods with a latency law that this pair can run."""
    from runtime.decoding import cannot_run

    out = ["ar"]
    if draft is not None:
        out.append("sd")
        coreml = str(getattr(draft, "backend", "")).startswith("coreml")  # batch 1: no branches
        # a head (fitted or MTP) reads the target's features and drafts one row: no branches
        one_row = getattr(draft, "reads_target_hidden", False)
        if getattr(target, "supports_layer_range", False) and not coreml and not one_row:
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
    predicted best γ (pair_trials.trial_rate), and that record's "trials" carry the measured
    rates for the chooser's corrections. factors: the chooser's measured/predicted factors per
    method (method_choice.Corrections), with which Ω̂ is measured on the prompt only when it
    can change the pick (method_choice.mirror_cannot_win); else the caches given stay empty."""
    from devices.method_choice import mirror_cannot_win

    s = mirror_shape(
        target,
        draft,
        kappa=kappa,
        exit_layer=exit_layer,
        branches=branches,
        draft_process=draft_process,
        draft_branches=draft_branches,
        exit_head=exit_head,
    )
    runnable = runnable_methods(target, draft)
    if runnable == ["ar"]:
        return {"choice": "ar", "why": "no draft model: ar is the only method", "predictions": {}}
    joint = bool(gammas) and profile is None  # a profile's windows follow its own law in γ
    table = dict(gamma=gamma, gammas=gammas if joint else None, sampling=sampling, profile=profile)
    by_gamma = _gamma_table(target, draft, ids, s, runnable, **table)
    skipped = mirror_cannot_win(by_gamma, runnable, factors)
    pool = branch_pool(target, draft, sampling, s.kappa, s.own)
    pooled = pool[0] >= POOL_STEPS  # the runs pin Ω̂: the prompt is not probed
    rescored = None
    if not skipped:  # else the caches stay empty: the chosen method's first window pass then
        # holds the prompt too (sd: one fused pass), where a separate prefill pass cost about
        # one window pass more per prompt (18 ms of a 0.8 s answer on this CPU)
        caches = (target_cache, draft_cache)
        hits = ([], []) if pooled else _prompt_hits(target, draft, ids, s, sampling, *caches)
        rescored = _with_omega(by_gamma, hits, s.own, pool)
        by_gamma = rescored()
    rec = _record(by_gamma, runnable, s, gamma=gamma, joint=joint, skipped=skipped)
    if pooled and not skipped:
        rec["omega_from"] = f"{pool[0]} mirror steps pooled on this pair (the prompt not probed)"
    if not joint:
        return rec
    return with_trials(rec, target, draft, ids, runnable, sampling, s.run_options(), rescored)


def _gamma_table(
    target, draft, ids, s: MirrorShape, runnable: list[str], *, gamma, gammas, sampling, profile
) -> dict:
    """{γ: StageTimes} with Ω̂ at its priors: `gamma`'s alone, or each of `gammas` (and
    `gamma`) with its α from the pooled τ. Takes "mirror" out of `runnable` when the draft
    fails beside the target (in its worker thread or process)."""
    mirror = "mirror" in runnable
    if profile is None:
        st = stages_at(target, draft, s, gamma=gamma, sampling=sampling, mirror=mirror)
        if st["target_slowdown"] is None:  # the draft failed in its worker thread or process
            runnable.remove("mirror")
    # choosing γ, each γ's α comes from the pooled τ: no separate α run (pair_acceptance)
    taus = (
        pair_taus(target, draft, ids, gammas=sorted({*gammas, gamma}), sampling=sampling)
        if gammas
        else None
    )
    t = stage_times(
        target,
        draft,
        ids,
        s,
        gamma=gamma,
        sampling=sampling,
        profile=profile,
        mirror=mirror,
        acceptance=alpha_for(taus[gamma], gamma) if gammas else None,
    )
    if not gammas:
        return {gamma: t}
    return times_by_gamma(
        t, target, draft, gammas, taus, sampling=sampling, mirror=mirror, **s.split()
    )


def _prompt_hits(target, draft, ids, s: MirrorShape, sampling, target_cache, draft_cache):
    """The prompt's own branch hits (prompt_hits), prefilling the caches given."""
    caches = dict(target_cache=target_cache, draft_cache=draft_cache)
    return prompt_hits(
        target, draft, ids, sampling=sampling, draft_branches=s.own, **caches, **s.split()
    )


def _with_omega(by_gamma: dict, hits, own: int, pool: list):
    """A function returning the γ table with Ω̂ and Ω̂_own from `hits` and the pooled runs'
    hits as they stand when it is called (a trial adds to the pool)."""

    def rescored() -> dict:
        omega, omega_own = omega_estimate(*hits, draft_branches=own, pool=pool)
        return {g: replace(v, omega_kappa=omega, omega_own=omega_own) for g, v in by_gamma.items()}

    return rescored


def _record(by_gamma, runnable, s: MirrorShape, *, gamma, joint, skipped) -> dict:
    """method_choice's record from the γ table, and why Ω̂ was not measured if it was not."""
    from devices.method_choice import choose, choose_joint

    rec = (
        choose_joint(by_gamma, runnable)
        if joint
        else {**choose(by_gamma[gamma], gamma, runnable), "gamma": gamma}
    )
    rec["branch_shape"] = {"kappa": s.kappa, "own_rows": s.own}  # observe_branches's pool
    if skipped:
        rec["omega"] = skipped
        rec["why"] += f"; {skipped}"
    return rec


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
