"""Measure what `--method auto` needs (devices/method_choice.StageTimes) on the pair at hand.

Stage times (medians, after a warm-up pass each):
  target_token / target_window  the target's 1-token and (γ+1)-token passes, alone;
  mirror_window                 mirror's own (γ+1)-token pass alone: split at ℓe, with the
                                early-exit head and message (mirror_pass);
  draft_window                  sd's γ drafts: γ 1-row passes back to back with their draws
                                (the first after a target pass, as in a step: colder caches);
  draft_token / draft_batch     the draft's 1-row pass, and one pass of a `branches`-row
                                branch wave as the worker runs it (wave_pass);
  target_slowdown               the target's window pass while the draft loops batched
                                passes beside it (as Mirror-SD's worker does: in a thread, or
                                in its own process where mirror would run it so), over it alone;
  t_rv                          a queue round trip between two threads (devices.calibrate).
A calibrated profile (`python -m devices calibrate`) may supply the stage times instead
(`from_profile`); it is then named as their source.

Acceptance α: from a short `sd` run (RUN_TOKENS tokens) on the first prompt seen, the
α whose E[τ] equals the mean tokens committed per step (cached per pair, γ and temperature):
the models' agreement on the target's own continuation, which is what sd and mirror verify.
Choosing γ as well (choose_for's `gammas`), τ per γ comes from the pair's pooled accepted
runs instead (pair_taus: one longer sd run at the largest γ, then every run auto observes),
each γ's α fitted to its own τ, and sd and mirror each run once as trials (trial_rate) whose
measured rates correct the laws before the first choice.
Ω̂, prompt-dependent, from the probe's pass over the prompt (its last 32 positions): how
often a correction is a branch candidate, i.e. in the exit layer's top-κ (eq. 9, tuned head
as mirror uses it) or among the draft's own runner-ups (prompt_hits), shrunk toward 0.4
with the weight of 8 rejections, pooled with every mirror run's steps (whether each step's (A, c)
was an own or an early-exit branch: observe_branches); once POOL_STEPS are pooled, from those
alone, the prompt not probed. The probe's passes are the chosen method's prefill (caches
handed on).
Stage times are cached per (target, draft, γ, branches) for the life of the process.
"""

from __future__ import annotations

import statistics
import threading
import time

import numpy as np

from devices.method_choice import StageTimes

PRIOR_OMEGA, PRIOR_WEIGHT = 0.4, 8.0
RUN_TOKENS = 48
JOINT_RUN_TOKENS = 128  # pair_taus: a longer run, since it sets the γ as well
OMEGA_POSITIONS = 32  # Ω̂ from the prompt's last positions: two heads over all would cost more
# pooled mirror steps from which Ω̂ comes from the runs alone (3x the prompt's positions):
# the prompt's probe (its passes, exit head and simulated steps) cost 52-158 ms a prompt, 3-7 %
# of a 128-token answer, and with the draft in its own process its draft pass is the child's
# to repeat (EMULATED m3-max, T = 1: .devrun/auto_cost17.py; auto 0.94-0.97x mirror@g6)
POOL_STEPS = 3 * OMEGA_POSITIONS
_CACHE: dict[tuple, dict] = {}
_ALPHA: dict[tuple, float] = {}


TRIAL_TOKENS, TRIAL_SKIP = 64, 2  # trial runs: tokens, and first steps left out of the rate


def trial_rate(method: str, target, draft, ids: list[int], *, gamma: int, sampling,
               **options) -> float | None:  # fmt: skip
    """Tokens per second of `method` at γ on `ids` over TRIAL_TOKENS, measured after its
    first TRIAL_SKIP steps (a worker's start and first shapes are paid once per run or per
    process, not per token); None when the run is too short to tell. Cached per pair, method
    and γ: the measured side of auto's corrections (method_choice.Corrections) before any
    chosen run has reported, where the stage times miss what only a whole run shows (an H100
    target: the probe put the draft process's slowdown at 0.88x, the mirror run at 1.5x)."""
    from runtime.decoding import make_steps

    key = _trial_key("trial", method, target, draft, gamma, sampling)
    if key in _CACHE:
        return _CACHE[key]
    n = max(1, min(TRIAL_TOKENS, target.config.max_context - len(ids) - gamma - 2))
    steps = make_steps(method, target, draft, list(ids), max_new=n, sampling=sampling, seed=0,
                       gamma=gamma, **options)  # fmt: skip
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
    _CACHE[key] = rate
    _CACHE[_trial_key("trial steps", method, target, draft, gamma, sampling)] = (
        made / timed if timed else None)  # fmt: skip
    if method in ("sd", "mirror"):  # its accepted runs join the pair's τ(γ) as well
        observe_run(target, draft, sampling, committed, gamma)
    if method == "mirror":  # and mirror's branch hits the pair's Ω̂ (omega_estimate)
        observe_branches(target, draft, sampling, hits, kappa=options["kappa"],
                         own_rows=options["draft_branches"])  # fmt: skip
    return rate


def trial_tokens_per_step(method: str, target, draft, gamma: int, sampling) -> float | None:
    """The tokens per step of trial_rate's timed steps (None: not measured in this process)."""
    return _CACHE.get(_trial_key("trial steps", method, target, draft, gamma, sampling))


def _trial_key(table: str, method: str, target, draft, gamma: int, sampling) -> tuple:
    """trial_rate's cache key (its rate, or its tokens per step) for one pair, γ and regime."""
    return (table, method, id(target), id(draft), gamma, sampling.temp, sampling.top_p,
            sampling.top_k)  # fmt: skip


def alpha_for(tau: float, gamma: int) -> float:
    """The α whose E[τ] at γ (method_choice.expected_tokens) equals `tau`, by bisection."""
    from devices.method_choice import expected_tokens

    lo, hi = 0.0, 0.999
    for _ in range(40):  # E[τ](α) is increasing in α
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, gamma) < tau else (lo, mid)
    return (lo + hi) / 2


HAZARD_PRIOR = 8.0  # steps: the weight of h_{j-1} in h_j's estimate (RunLengths.hazards)


class RunLengths:
    """The accepted runs A (drafts accepted per step) seen on one pair in one sampling regime,
    pooled over every sd and mirror run that reports them (the same verification: App. B).

    τ(γ) = 1 + E[min(A, γ)] = 1 + Σ_{k=1..γ} P(A ≥ k), with P(A ≥ k) = Π_{j<k} h_j and the
    hazard h_j = P(A ≥ j+1 | A ≥ j) estimated product-limit (Kaplan-Meier) style: from the
    steps at risk at j whose window γ_r > j, since a step's A is censored at its own γ_r (a
    run at γ 3 says nothing about A ≥ 4). Each h_j is shrunk toward h_{j-1} with the weight
    of HAZARD_PRIOR steps (`hazards`), so a tail seen on a handful of steps is not taken as
    a wall: one prompt's 128-token run at γ 8 accepted 5 or more on 3 of its
    steps, which had put τ(6) = τ(8) = 3.32 where 10 prompts measured τ(6) = 3.78 and auto
    then ran sd@g3 at 12 % below sd@g6 (this CPU, `apps.bench --methods sd,auto
    --gammas 4,5,6`)."""

    def __init__(self):
        self.risk = np.zeros(64)  # steps with A ≥ j whose window could show A ≥ j + 1
        self.survived = np.zeros(64)  # of those, the steps with A ≥ j + 1

    def add(self, accepted, gamma: int) -> None:
        """One run's A per step at window γ (the last, token-budget-cut step left out)."""
        g = min(int(gamma), len(self.risk))
        for a in accepted:
            a = min(max(int(a), 0), g)
            self.risk[: min(a + 1, g)] += 1
            self.survived[:a] += 1

    def hazards(self) -> np.ndarray:
        """h_j, each shrunk toward h_{j-1} (h_0 toward the pooled acceptance) with the weight
        of HAZARD_PRIOR steps: where few steps reach position j, the estimate carries the
        last well-seen hazard forward. Not the pooled mean: acceptance comes in runs, so the
        hazard grows with j, and with the tail shrunk toward the mean auto ran sd@g4 at
        T = 1 on this CPU, 4 % behind sd@g6 (`apps.bench --methods sd,mirror,auto --gammas
        4,6 --temps 0,1 --samples 2`)."""
        seen = self.risk.sum()
        prior = self.survived.sum() / seen if seen else 0.5
        h = np.empty(len(self.risk))
        for j in range(len(h)):
            w = self.risk[j] + HAZARD_PRIOR
            h[j] = (self.survived[j] + HAZARD_PRIOR * prior) / w if w > 0 else prior
            prior = h[j]
        return h

    def taus(self, gammas) -> dict[int, float]:
        reach = np.cumprod(self.hazards())  # P(A ≥ k) for k = 1, 2, ...
        return {g: 1.0 + float(reach[: min(g, len(reach))].sum()) for g in gammas}


def run_lengths(target, draft, sampling) -> RunLengths:
    """This pair's pooled RunLengths for `sampling`'s regime (one per process)."""
    key = ("runs", id(target), id(draft), sampling.temp, sampling.top_p, sampling.top_k)
    return _CACHE.setdefault(key, RunLengths())


def observe_run(target, draft, sampling, accept_lengths, gamma: int) -> None:
    """Pool a finished sd or mirror run's steps (committed tokens per step, A + 1) into the
    pair's RunLengths, so the next τ(γ) reads every prompt seen so far, not only the first."""
    acc = list(accept_lengths)[:-1]  # the last step is cut by the token budget
    if acc and gamma:
        run_lengths(target, draft, sampling).add([max(0, int(c) - 1) for c in acc], gamma)


def pair_taus(target, draft, ids: list[int], *, gammas, sampling) -> dict[int, float]:
    """E[τ] per γ from the pair's pooled RunLengths: on first use seeded by one sd run at the
    largest γ on `ids` (a step that accepted A of γ_max would have accepted min(A, γ) of γ),
    then fed by every run auto observes (observe_run). Acceptance comes in runs (a
    predictable stretch accepts whole windows), which one i.i.d. α misses: on the embedded
    pair τ(6)/τ(4) is 1.20 measured, 1.09-1.16 from an α."""
    from runtime.decoding import make_steps, run

    top = max(gammas)
    key = ("taus", id(target), id(draft), top, sampling.temp, sampling.top_p, sampling.top_k)
    if key not in _CACHE:
        n = max(1, min(JOINT_RUN_TOKENS, target.config.max_context - len(ids) - top - 2))
        r = run(make_steps("sd", target, draft, ids, max_new=n, sampling=sampling, seed=0,
                           gamma=top), max_new=n)  # fmt: skip
        observe_run(target, draft, sampling, r.stats.accept_lengths, top)
        _CACHE[key] = True
    return run_lengths(target, draft, sampling).taus(gammas)


def pair_acceptance(target, draft, ids: list[int], *, gamma: int, sampling) -> float:
    """α from a RUN_TOKENS-token sd run on `ids` (module docstring); cached per pair."""
    from runtime.decoding import make_steps, run

    key = (id(target), id(draft), gamma, sampling.temp, sampling.top_p, sampling.top_k)
    if key not in _ALPHA:
        n = max(1, min(RUN_TOKENS, target.config.max_context - len(ids) - gamma - 2))
        r = run(make_steps("sd", target, draft, ids, max_new=n, sampling=sampling, seed=0,
                           gamma=gamma), max_new=n)  # fmt: skip
        per_step = sum(r.stats.accept_lengths) / max(1, len(r.stats.accept_lengths))
        _ALPHA[key] = alpha_for(per_step, gamma)
    return _ALPHA[key]


def _medians(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each function, the functions interleaved round by round, so that a
    machine whose load drifts (other processes) biases none of them against the others."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(repeats + 1):  # round 0 warms up
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if r:
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def measure_stages(target, draft, *, gamma: int, branches: int, repeats: int = 15,
                   process: bool = False, sampling=None, kappa: int = 8,
                   exit_layer: int | None = None, exit_head: str | None = None,
                   mirror: bool = True) -> dict:  # fmt: skip
    """The stage times of the module docstring, in seconds (cached per pair and shape).
    process: the slowdown beside the draft *process* (Mirror-SD's worker there, as beside a
    CUDA target: runtime.decoding.mirror.draft_in_process), not a thread. sampling, kappa,
    exit_layer, exit_head: mirror's, for its own pass (`mirror_pass`). mirror=False (a pair
    mirror cannot run: runnable_methods): only ar's and sd's figures; nothing forks the
    draft's rows (a draft that drafts one row only, `--draft mtp`, refuses to)."""
    greedy = sampling is None or sampling.greedy
    key = (id(target), id(draft), gamma, branches, process, greedy, kappa, exit_layer, exit_head,
           mirror)  # fmt: skip
    if key in _CACHE:
        return _CACHE[key]
    from devices.calibrate import measure_rendezvous

    rng = np.random.default_rng(0)
    vocab = min(target.config.vocab_size, draft.config.vocab_size)
    prompt = rng.integers(0, vocab, size=(1, 64), dtype=np.int64)
    tc, dc = target.new_cache(), draft.new_cache()
    target.forward(prompt, tc)
    draft.forward(prompt, dc)
    window = prompt[:, : gamma + 1]

    def tpass(x):
        target.forward(x, tc)
        tc.trim(x.shape[1])

    def dpass(x, cache):
        draft.forward(x, cache)
        cache.trim(x.shape[1])

    fns = {"target_token": lambda: tpass(prompt[:, :1]),
           "target_window": lambda: tpass(window),
           "draft_window": sd_drafts(draft, prompt, gamma, sampling),
           "draft_token": lambda: dpass(prompt[:, :1], dc)}  # fmt: skip
    if mirror:
        fns["draft_batch"] = wave_pass(draft, dc, branches=branches, gamma=gamma,
                                       sampling=sampling)  # fmt: skip
        mpass = mirror_pass(target, tc, window, kappa=kappa, exit_layer=exit_layer,
                            exit_head=exit_head, greedy=greedy)  # fmt: skip
        if mpass is not None:
            fns["mirror_window"] = mpass
    out = _medians(fns, repeats)
    if mirror:
        out["draft_batch"] /= max(1, gamma)  # wave_pass runs a whole γ-deep wave
        slowdown = _slowdown_process if process else _slowdown
        out["target_slowdown"] = slowdown(draft, prompt, branches, lambda: tpass(window),
                                          repeats)  # fmt: skip
        out["t_rv"] = measure_rendezvous(trials=200)
        out["source"] = "measured on this machine on the pair at hand"
    else:  # mirror's own figures, unmeasured: neutral values it is never judged by
        out.update(draft_batch=out["draft_token"], target_slowdown=1.0, t_rv=0.0,
                   source="measured on this machine on the pair at hand (ar and sd only)")  # fmt: skip
    _CACHE[key] = out
    return out


def wave_pass(draft, cache, *, branches: int, gamma: int, sampling=None):
    """A function running one γ-deep wave of `branches` rows as Mirror-SD's worker does
    (draft_worker.Wave: fork, masks, and at T > 0 each row's law and draw): its time / γ is
    the branch pass that eq. (10)'s wave term counts. A bare batched forward left the masks
    and the sampling out (EMULATED m3-max T = 1: 3.5 ms timed, 4.9 ms as the wave ran)."""
    from runtime.decoding.events import GREEDY
    from runtime.decoding.ss_draft import is_ss_draft
    from runtime.mirror.branches import Branch
    from runtime.mirror.draft_worker import Wave, fork_rows
    from runtime.mirror.ss_wave import SSWave

    kind = SSWave if is_ss_draft(draft) else Wave  # as the worker picks it (§3.2: η ≥ 1)
    law = sampling or GREEDY
    base = cache.offset - gamma  # the cache holds committed + d1..dγ
    chunk = [Branch(i % (gamma + 1), i, 0.0) for i in range(branches)]

    def run():
        wave = kind(draft, fork_rows(cache, chunk, base), chunk, base, [gamma] * branches,
                    [np.random.default_rng(i) for i in range(branches)], law)  # fmt: skip
        while not wave.finished():
            wave.advance()

    return run


def mirror_pass(target, cache, window, *, kappa: int, exit_layer: int | None,
                exit_head: str | None, greedy: bool):  # fmt: skip
    """A function running mirror's verification pass as runtime/decoding/mirror.py does:
    layers 1..ℓe, the early-exit head and its top-κ message (at T > 0 the step's noise table
    and the coupled message), layers ℓe+1..N and the head; None if the target cannot split."""
    if not getattr(target, "supports_layer_range", False):
        return None
    from kernels.topk_channel import encode, topk_message
    from runtime.decoding.events import Sampling, step_noise
    from runtime.mirror.coupled import coupled_message
    from runtime.mirror.exit_head import resolve_exit_head

    n = target.config.num_layers
    le = n // 2 if exit_layer is None else exit_layer
    tuned = resolve_exit_head(target, le, exit_head)
    law = Sampling(1.0)  # at T > 0 the pass costs the same whatever the temperature
    g = window.shape[1] - 1
    drafts = window[0, 1:].tolist()

    def run():
        h = target.forward_layers(window, cache, 0, le)
        exit_logits = target.head(h if tuned is None else tuned.apply(h))[0]
        if greedy:
            ids, logp = topk_message(exit_logits, kappa)
        else:
            _, noise = step_noise(0, 0, g, exit_logits.shape[-1])
            ids, logp = coupled_message(law.log_probs(exit_logits), drafts, noise, kappa)
        encode(ids, logp)
        target.head(target.forward_layers(h, cache, le, n))
        cache.trim(window.shape[1])

    return run


def sd_drafts(draft, prompt, gamma: int, sampling=None):
    """A function drafting γ tokens as sd does (runtime.decoding.sd.draft_window: γ 1-row
    passes back to back, each with its draw) after `prompt`, then rewinding the cache."""
    from runtime.decoding.events import GREEDY, rewind
    from runtime.decoding.sd import draft_window

    seq = [int(x) for x in prompt[0]]
    dc = draft.new_cache()
    draft.forward(prompt[:, :-1], dc)
    rng = np.random.default_rng(0)
    law = sampling if sampling is not None else GREEDY

    def run():
        draft_window(draft, dc, seq, gamma, law, rng)
        rewind(dc, len(seq) - 1)

    return run


def measure_windows(target, gammas, *, kappa: int = 8, exit_layer: int | None = None,
                    exit_head: str | None = None, greedy: bool = True, draft=None,
                    sampling=None, repeats: int = 9, mirror: bool = True) -> dict[int, dict]:  # fmt: skip
    """{γ: {"target_window", "mirror_window", "draft_window"}}: the (γ+1)-token passes alone
    and, with a draft, sd's γ drafts (sd_drafts), per γ (what `choose_joint` needs beyond one
    γ's stage times). All γ are timed round-robin in one `_medians`, so a machine's drifting
    load biases no γ against another, and each draft window follows a target pass as in a
    step; cached per set."""
    gammas = tuple(sorted(set(gammas)))
    key = ("windows", id(target), id(draft), gammas, kappa, exit_layer, exit_head, greedy, mirror)
    if key not in _CACHE:
        rng = np.random.default_rng(0)
        prompt = rng.integers(0, target.config.vocab_size, size=(1, 64), dtype=np.int64)
        tc = target.new_cache()
        target.forward(prompt, tc)
        fns = {}
        for g in gammas:
            window = prompt[:, : g + 1]

            def tpass(x=window):
                target.forward(x, tc)
                tc.trim(x.shape[1])

            fns[(g, "target_window")] = tpass
            if draft is not None:
                fns[(g, "draft_window")] = sd_drafts(draft, prompt, g, sampling)
            mpass = None
            if mirror:
                mpass = mirror_pass(target, tc, window, kappa=kappa, exit_layer=exit_layer,
                                    exit_head=exit_head, greedy=greedy)  # fmt: skip
            if mpass is not None:
                fns[(g, "mirror_window")] = mpass
        med = _medians(fns, repeats)
        raw = {g: {name: v for (h, name), v in med.items() if h == g} for g in gammas}
        _CACHE[key] = _affine_in_gamma(raw)
    return _CACHE[key]


def _affine_in_gamma(raw: dict[int, dict]) -> dict[int, dict]:
    """Each pass's medians over γ replaced by their least-squares line in γ (FlexSpec eq. 9:
    T(K) = T_base + K·δ), slope ≥ 0. A verification pass's cost is affine in its window, and
    the medians alone are not monotone on a loaded machine (this CPU: 18.2 ms at γ 4 and
    16.2 ms at γ 5 in one probe), which is enough to flip the γ auto picks."""
    if len(raw) < 3:
        return raw
    out = {g: dict(v) for g, v in raw.items()}
    for name in {n for v in raw.values() for n in v}:
        gs = [g for g in raw if name in raw[g]]
        ys = np.array([raw[g][name] for g in gs])
        slope, base = np.polyfit(np.array(gs, float), ys, 1)
        if slope < 0:
            slope, base = 0.0, float(ys.mean())
        for g in gs:
            out[g][name] = float(base + slope * g)  # eq. (9)
    return out


def _slowdown(draft, prompt, branches: int, tpass, repeats: int) -> float | None:
    """Target pass beside a draft thread looping branch passes / the pass alone: rounds
    alternate the draft on and off, so load drifting on a shared machine cancels out.
    None when the draft cannot run in another thread (then neither can Mirror-SD's worker)."""
    side = draft.new_cache()
    draft.forward(prompt, side)
    side = side.fork([0] * branches)
    x = np.repeat(prompt[:, :1], branches, 0)
    go, stop, idle = threading.Event(), threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def loop():
        try:
            while not stop.is_set():
                if not go.wait(0.005):
                    idle.set()
                    continue
                idle.clear()
                draft.forward(x, side)
                side.trim(1)
        except Exception as e:  # e.g. an MLX draft, whose stream belongs to the loading thread
            failed.append(e)
            idle.set()

    th = threading.Thread(target=loop, name="duet-probe-draft", daemon=True)
    th.start()
    alone, beside = [], []
    try:
        for r in range(repeats + 1):
            go.clear()
            idle.wait(1.0)
            t0 = time.perf_counter()
            tpass()
            a = time.perf_counter() - t0
            go.set()
            time.sleep(0.001)  # the draft is computing when the target starts
            t0 = time.perf_counter()
            tpass()
            if r:  # round 0 warms up
                alone.append(a)
                beside.append(time.perf_counter() - t0)
    finally:
        stop.set()
        go.set()
        th.join()
    return None if failed else statistics.median(beside) / statistics.median(alone)


def _slowdown_process(draft, prompt, branches: int, tpass, repeats: int) -> float | None:
    """_slowdown with the draft looping in its own process (runtime/mirror/draft_process.py):
    there it takes no GIL from the target, only what the two processes share."""
    from runtime.mirror.draft_process import draft_host

    try:
        host = draft_host(draft)
    except Exception:  # noqa: BLE001 (no load spec, or it failed to load: mirror cannot run)
        return None
    alone, beside = [], []
    try:
        for r in range(repeats + 1):  # round 0 warms up; rounds alternate the draft off and on
            t0 = time.perf_counter()
            tpass()
            a = time.perf_counter() - t0
            with host.busy(branches):
                t0 = time.perf_counter()
                tpass()
                b = time.perf_counter() - t0
            if r:
                alone.append(a)
                beside.append(b)
    except (RuntimeError, TimeoutError):  # the draft failed in its process: as _slowdown's None
        return None
    return statistics.median(beside) / statistics.median(alone)


def from_profile(profile, *, gamma: int, branches: int) -> dict:
    """Stage times from a calibrated profile's latency figures (FlexSpec eq. 9 fits and T_rv)."""
    lat = profile.latency
    t_base, delta = profile.param("t_base"), profile.param("delta_cloud")
    alpha = profile.param("alpha_edge")
    out = {
        "target_token": t_base,
        "target_window": t_base + gamma * delta,  # eq. (9) at K = γ
        "draft_token": alpha,
        "draft_batch": lat["draft_batch_step"].si if "draft_batch_step" in lat else alpha,
        "target_slowdown": lat["target_slowdown"].si if "target_slowdown" in lat else 1.0,
        "t_rv": profile.param("t_rv"),
        "source": f"profile {profile.name} ({profile.latency['t_base'].source})",
    }
    return out


def prompt_hits(target, draft, ids: list[int], *, sampling, kappa: int, exit_layer: int | None,
                target_cache=None, draft_cache=None, draft_branches: int = 0,
                exit_head: str | None = None) -> tuple[list[float], list[float]]:  # fmt: skip
    """How often a correction is a branch's first token, from one pass of each model over
    the prompt.

    At each of the last positions where the draft's greedy token differs from the target's
    (a rejection), whether the target's token is a branch candidate: in the exit layer's
    top-κ (eq. 9, through the exit head mirror would use: `exit_head` as --exit-head) or
    among the draft's `draft_branches` runner-ups. At T > 0 the step is simulated instead,
    the early exit's candidates coupled to the verifier's noise as mirror does it
    (_sampled_hits). The passes are the prompt's prefill: given (empty) caches, they are left
    holding the prompt, so the method chosen next does not prefill it again. Returns (hits,
    own hits), one 0/1 per rejection: own, a correction among the draft's own runner-ups,
    whose branches the worker rolls out before the early exit arrives."""
    from kernels.topk_channel import top_rows, topk_message
    from runtime.mirror.exit_head import resolve_exit_head

    x = np.array([ids])
    tc = target_cache if target_cache is not None else target.new_cache()
    dc = draft_cache if draft_cache is not None else draft.new_cache()
    exit_logits = None
    hits, own_hits = [], []
    if exit_layer is not None and getattr(target, "supports_layer_range", False):
        h = target.forward_layers(x, tc, 0, exit_layer)
        tuned = resolve_exit_head(target, exit_layer, exit_head)
        h_exit = h[:, -OMEGA_POSITIONS:]
        exit_logits = target.head(h_exit if tuned is None else tuned.apply(h_exit))[0]  # eq. 6
        h = target.forward_layers(h, tc, exit_layer, target.config.num_layers)
        tl = target.head(h[:, -OMEGA_POSITIONS:])[0]  # only the positions Ω̂ reads
    else:
        tl = target.forward(x, tc)[0]  # (T, V)
    dl = draft.forward(x, dc)[0]  # the draft's pass is its prefill
    if exit_logits is not None and (sampling is None or sampling.greedy):
        n = len(exit_logits)
        want, drafted = tl[-n:].argmax(-1), dl[-n:].argmax(-1)
        rej = np.flatnonzero(want != drafted)  # rejected: the target's token is the correction
        # the message and the runner-ups at those rows only: at V = 151,936 the 32 rows' top-κ
        # cost 120 and 100 ms a prompt (',real-vocab' emulation), most of it at accepted rows
        ids_k = topk_message(exit_logits[rej], kappa)[0] if rej.size else None
        own = top_rows(dl[-n:][rej], 1 + draft_branches) if rej.size else None
        for i, c in enumerate(want[rej].tolist()):
            hits.append(float(c in ids_k[i] or c in own[i, 1:]))
            own_hits.append(float(c in own[i, 1:]))
    elif exit_logits is not None:
        n = len(exit_logits)
        hits, own_hits = _sampled_hits(sampling.probs(tl[-n:]), sampling.probs(dl[-n:]),
                                       sampling.probs(exit_logits), kappa, draft_branches)  # fmt: skip
    return hits, own_hits


def omega_estimate(hits, own_hits, *, draft_branches: int, pool=None) -> tuple[float, float]:
    """(Ω̂, Ω̂_own) from the prompt's hits (prompt_hits) and `pool`, the [steps, hits, own
    hits] of the mirror runs seen on this pair (branch_pool), each shrunk toward its prior
    with the weight of PRIOR_WEIGHT steps. The runs' steps count as much as the prompt's
    positions and soon outnumber them: they are what the law predicts (every step's (A, c),
    full windows' bonus tokens included) on the model's own text. On the prompt alone, auto
    put Ω̂_own at 0.35 where mirror's generations measured 0.64 (`apps.profile --emulate
    m3-max:qwen3-8b+qwen3-0.6b --temp 1 --gamma 6`) and ran mirror at γ 4, 4 % behind γ 6
    (EMULATED, `apps.bench ... --methods sd,mirror,auto --gammas 4,6 --temps 1`)."""
    steps, any_hits, own = pool if pool is not None else (0, 0, 0)
    n = len(hits) + steps + PRIOR_WEIGHT
    omega = (sum(hits) + any_hits + PRIOR_WEIGHT * PRIOR_OMEGA) / n
    if not draft_branches:
        return omega, 0.0
    return omega, min(omega, (sum(own_hits) + own + PRIOR_WEIGHT * PRIOR_OMEGA / 2) / n)


def branch_pool(target, draft, sampling, kappa: int, own_rows: int) -> list[int]:
    """[steps, hits, own hits]: the mirror steps seen on this pair in this sampling regime with
    this channel width and own-branch count, how many had (A, c) among its candidates (own
    or the early exit's top-κ), and how many among the draft's own (one per process)."""
    key = ("branches", id(target), id(draft), kappa, own_rows, sampling.temp, sampling.top_p,
           sampling.top_k)  # fmt: skip
    return _CACHE.setdefault(key, [0, 0, 0])


def observe_branches(target, draft, sampling, branch_hits, *, kappa: int, own_rows: int) -> None:
    """Pool a mirror run's per-step branch_hit ("own", "exit", "miss"; None: unknown) into
    the pair's branch_pool, which the next Ω̂ reads (omega_estimate)."""
    seen = [h for h in branch_hits or () if h is not None]
    if seen:
        pool = branch_pool(target, draft, sampling, kappa, own_rows)
        pool[0] += len(seen)
        pool[1] += sum(h != "miss" for h in seen)
        pool[2] += sum(h == "own" for h in seen)


SAMPLED_DRAWS = 4  # per probe position at T > 0


def _sampled_hits(p, q, proxy, kappa: int, m: int) -> tuple[list[float], list[float]]:
    """At T > 0, mirror's step at each position, simulated: the draft samples d ~ q, the
    verifier accepts with u·q(d) < p(d) (u ~ U[0, 1)), else its correction is the Gumbel-max
    draw from the residual max(p − q, 0) under noise G; the early exit sends d and the κ − 1
    tokens maximising log p̃ + G (runtime/mirror/coupled.py), the draft its own m maximising
    log q + G (coupled.rank_own_coupled, per position). A hit: a rejection whose correction is
    among them. Returns (hits, own hits): the second counts the corrections among the
    draft's own."""
    rng = np.random.default_rng(0)
    hits, own_hits = [], []
    with np.errstate(divide="ignore"):
        for t in range(len(p)):
            lp_proxy, resid = np.log(proxy[t]), np.log(np.maximum(p[t] - q[t], 0.0))
            lq = np.log(q[t])
            cdf = np.cumsum(q[t], dtype=np.float64)
            for _ in range(SAMPLED_DRAWS):
                d = min(
                    int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), len(cdf) - 1
                )
                if rng.random() * q[t, d] < p[t, d]:
                    continue  # accepted: no correction here
                g = -np.log(rng.standard_exponential(q.shape[-1]))  # Gumbel (events.step_noise)
                c = int(np.argmax(resid + g))
                sent = _winners(lp_proxy + g, d, kappa - 1)
                mine = c in _winners(lq + g, d, m)
                hits.append(float(c in sent or mine))
                own_hits.append(float(mine))
    return hits, own_hits


def _winners(score: np.ndarray, drafted: int, k: int) -> np.ndarray:
    """The k highest-scoring tokens other than the drafted one (a coupled message's row)."""
    if k < 1:
        return np.zeros(0, np.int64)
    score[drafted] = -np.inf
    return np.argpartition(-score, k - 1)[:k]


def stage_times(target, draft, ids, *, gamma, branches, kappa, exit_layer, sampling,
                profile=None, process=False, draft_branches=0, exit_head=None,
                acceptance=None, mirror=True) -> StageTimes:  # fmt: skip
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
    return StageTimes(acceptance=alpha, omega_kappa=omega, exit_fraction=le / n, omega_own=own,
                      own_rows=draft_branches, branch_batch=branches, **st)  # fmt: skip


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


def choose_for(target, draft, ids, *, gamma: int, kappa: int | None, exit_layer: int | None,
               branches: int | None, sampling, profile=None, target_cache=None,
               draft_cache=None, draft_process: bool | None = None,
               draft_branches: int | None = None, exit_head: str | None = None,
               gammas=None, factors: dict[str, float] | None = None) -> dict:  # fmt: skip
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
    from devices.method_choice import choose, mirror_cannot_win
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
        st = measure_stages(target, draft, gamma=gamma, branches=branches, process=process,
                            sampling=sampling, kappa=kappa, exit_layer=le,
                            exit_head=exit_head, mirror=mirror)  # fmt: skip
        if st["target_slowdown"] is None:  # the draft failed in its worker thread or process
            runnable.remove("mirror")
    joint = bool(gammas) and profile is None  # a profile's windows follow its own law in γ
    # choosing γ, each γ's α comes from the pooled τ: no separate α run (pair_acceptance)
    taus = pair_taus(target, draft, ids, gammas=sorted({*gammas, gamma}),
                     sampling=sampling) if joint else None  # fmt: skip
    t = stage_times(target, draft, ids, gamma=gamma, branches=branches, kappa=kappa,
                    exit_layer=le, sampling=sampling,
                    profile=profile, process=process, draft_branches=own,
                    exit_head=exit_head, mirror=mirror,
                    acceptance=alpha_for(taus[gamma], gamma) if joint else None)  # fmt: skip
    from dataclasses import replace

    from devices.method_choice import choose_joint

    by_gamma = {gamma: t}
    if joint:
        wins = measure_windows(target, sorted(set(gammas)), kappa=kappa, exit_layer=le,
                               exit_head=exit_head, greedy=sampling is None or sampling.greedy,
                               draft=draft, sampling=sampling, mirror=mirror)  # fmt: skip
        by_gamma = {g: replace(t, target_window=w["target_window"],
                               mirror_window=w.get("mirror_window"),
                               draft_window=w.get("draft_window"),
                               acceptance=alpha_for(taus[g], g)) for g, w in wins.items()}  # fmt: skip
    skipped = mirror_cannot_win(by_gamma, runnable, factors)
    pool = branch_pool(target, draft, sampling, kappa, own)
    pooled = pool[0] >= POOL_STEPS  # the runs pin Ω̂: the prompt is not probed
    if not skipped:  # else the caches stay empty: the chosen method's first window pass then
        # holds the prompt too (sd: one fused pass), where a separate prefill pass cost about
        # one window pass more per prompt (18 ms of a 0.8 s answer on this CPU)
        hits = ([], []) if pooled else prompt_hits(
            target, draft, ids, sampling=sampling, kappa=kappa, exit_layer=le,
            target_cache=target_cache, draft_cache=draft_cache, draft_branches=own,
            exit_head=exit_head)  # fmt: skip

        def with_omega(by_gamma: dict) -> dict:  # the pooled runs' hits as they stand now
            omega, omega_own = omega_estimate(*hits, draft_branches=own, pool=pool)
            return {g: replace(v, omega_kappa=omega, omega_own=omega_own)
                    for g, v in by_gamma.items()}  # fmt: skip

        by_gamma = with_omega(by_gamma)
    rec = (choose_joint(by_gamma, runnable) if joint
           else {**choose(by_gamma[gamma], gamma, runnable), "gamma": gamma})  # fmt: skip
    rec["branch_shape"] = {"kappa": kappa, "own_rows": own}  # observe_branches's pool
    if skipped:
        rec["omega"] = skipped
        rec["why"] += f"; {skipped}"
    elif pooled:
        rec["omega_from"] = f"{pool[0]} mirror steps pooled on this pair (the prompt not probed)"
    if not joint:
        return rec
    once = ("trials", id(target), id(draft), sampling.temp, sampling.top_p, sampling.top_k)
    if len(runnable) > 2 and once not in _CACHE:  # sd and mirror: once per pair
        _CACHE[once] = True  # (the chosen runs correct it afterwards: a trial per new γ cost
        # a 64-token run inside a later prompt's turn as the pooled τ moved the best γ)
        opts = dict(kappa=kappa, exit_layer=le, branches=branches, draft_process=draft_process,
                    draft_branches=own, exit_head=exit_head)  # fmt: skip
        rec["trials"] = {}
        for m in (x for x in runnable if x != "ar"):
            g = max(rec["by_gamma"], key=lambda h: rec["by_gamma"][h][m]["tokens_per_s"])
            rate = trial_rate(m, target, draft, ids, gamma=g, sampling=sampling, **opts)
            if rate:
                rec["trials"][m] = {"gamma": g, "tokens_per_s": round(rate, 2),
                                    "tokens_per_step": trial_tokens_per_step(m, target, draft, g, sampling)}  # fmt: skip
        if "mirror" in rec["trials"] and not skipped:  # its trial's hits now join Ω̂: choose
            # again (the trials' rates then correct this record: method_choice.Corrections)
            rec = {**choose_joint(with_omega(by_gamma), runnable), "trials": rec["trials"],
                   "branch_shape": rec["branch_shape"]}  # fmt: skip
    return rec


def export_state(target, draft) -> list[dict]:
    """This pair's cached figures (stage times, windows, trial rates, pooled runs, α) as JSON
    entries for devices/probe_store.py: the models' ids in each key become "@target" and
    "@draft". An entry is the pair's when its key holds both."""
    marks = {id(target): "@target", id(draft): "@draft"}
    out = []
    for table, tab in ((_CACHE, "cache"), (_ALPHA, "alpha")):
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
        table = _ALPHA if e["table"] == "alpha" else _CACHE
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
