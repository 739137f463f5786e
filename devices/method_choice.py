"""`--method auto`: predict each method's tokens per second from measured stage times, pick
the fastest.

Pure maths over a `StageTimes` (seconds and rates; devices/pair_probe.py measures them on
the pair at hand, or a calibrated profile supplies them). The laws:

  expected tokens per step   E[τ] = (1 − α^(γ+1)) / (1 − α)   (Leviathan et al., i.i.d.
                                                                acceptance α)
  ar      T = T_target(1)
  sd      T = T_target(γ+1) + T_draft(γ)                       (Mirror-SD App. C, T_SD)
              T_draft(γ): γ draft passes timed as sd runs them (else γ·t_draft)
  mirror  T = s·T_mirror(γ+1)·ℓe/N + T_rv(ee) + s·T_mirror(γ+1)·(N−ℓe)/N + T_rv(fv)  (eq. 10)
              + E[wait for the next window]                     (mirror_wait)
  with T_mirror(γ+1) mirror's own pass alone (split at ℓe, its early-exit head and message:
  measured, since that head alone costs what a layer does on a small target), s the target's
  slowdown while the draft computes beside it (measured, not assumed). eq. (10)'s
  max{suffix, T_draft^gen} becomes the wait at the verdict, from the worker's timeline: it
  extends its cache (one draft pass), rolls out its own runner-up branches to their end (a
  wave of b-second passes per branch_batch rows, γ deep); the early exit's first branches
  join the own wave in flight when it comes (its passes then carry both: linear in rows
  between T_draft(1) and b), the rest follow in waves, until the verdict. The correction is
  an own branch with probability Ω̂_own, an early-exit one with Ω̂ − Ω̂_own (App. E: a
  branch exists iff (A, c) is in the tree, FF ≤ 1 − Ω_κ; devices/pair_probe.prompt_hits),
  else a miss: a branch not complete at the verdict is resumed serially, a miss rolled out
  afresh (γ draft tokens) after the pass in flight.

sd and mirror commit the same tokens per step (same draft, same window: App. B), so the
choice between them rests on the step times alone; ar against them on α. `choose_joint`
also picks γ: each γ comes with its own window passes and its own α, fitted to the τ that γ
would get (devices/pair_probe.pair_taus: acceptance comes in runs, not i.i.d.).
This module runs nothing and reads no clock.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from devices.latency import mirror_step_time, sd_step_time

AUTO_GAMMAS = (2, 3, 4, 5, 6, 8)  # the γ values `choose_joint` compares when none is given


@dataclass
class StageTimes:
    """What the laws above need, for one pair on one machine (seconds unless said)."""

    target_token: float  # T_target(1): one decode step of the target alone
    target_window: float  # T_target(γ+1): the verification pass alone
    draft_token: float  # one single-row draft forward
    draft_batch: float  # one batched branch pass (`branches` rows)
    target_slowdown: float  # s: target pass beside a computing draft / alone (>= ~1)
    t_rv: float  # T_rv(ee) + T_rv(fv): one round trip over the channel
    acceptance: float  # α: per-token acceptance estimate
    omega_kappa: float  # Ω̂: how often a correction is a branch candidate (pair_probe)
    exit_fraction: float  # ℓe / N
    source: str  # where the figures came from
    # mirror's own verification pass alone: split at ℓe, the early-exit head and message
    # (and at T > 0 the step's noise table and coupled message) included; None: target_window
    mirror_window: float | None = None
    omega_own: float = 0.0  # Ω̂_own ≤ Ω̂: corrections among the draft's own runner-ups
    own_rows: int = 0  # runner-up branches per window position rolled out before the exit
    branch_batch: int = 16  # rows per branch wave (draft_batch is one such wave's pass)
    # sd's γ drafts as it runs them: γ single-row passes back to back after a target pass,
    # with their draws; None: γ·draft_token. Not γ·draft_token where a target pass evicts
    # the draft from the CPU's caches: this CPU, 1.05 ms for a pass right after the target's,
    # 0.42 back to back, so γ·draft_token put sd@g6's drafting 50 % high and auto ran γ 3 at
    # T = 1 where γ 6 measured 7 % faster (`apps.bench --methods sd,auto --gammas 4,6`)
    draft_window: float | None = None


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[τ] committed per step (accepted + the correction/bonus token) under i.i.d. acceptance."""
    a = min(max(alpha, 0.0), 0.999999)
    return (1 - a ** (gamma + 1)) / (1 - a)  # Leviathan et al. 2023, eq. (1)


def predict(t: StageTimes, gamma: int) -> dict[str, dict]:
    """{method: {"tokens_per_s", "step_ms", "tokens_per_step", ...}} for ar, sd and mirror."""
    tau = expected_tokens(t.acceptance, gamma)
    s = max(t.target_slowdown, 1.0)
    window = t.mirror_window or t.target_window  # mirror's pass costs its early exit too
    prefix = s * window * t.exit_fraction
    suffix = s * window * (1 - t.exit_fraction)
    wait, reuse = mirror_wait(t, gamma, prefix, suffix)
    t_mirror = mirror_step_time(prefix, suffix, 0.0, t.t_rv / 2, t.t_rv / 2) + wait  # eq. (10)
    drafting = t.draft_window if t.draft_window is not None else gamma * t.draft_token
    t_sd = sd_step_time(t.target_window, drafting)  # App. C
    rows = {
        "ar": (t.target_token, 1.0, {}),
        "sd": (t_sd, tau, {"draft_share": drafting / t_sd}),
        "mirror": (t_mirror, tau, {"reuse": reuse, "target_slowdown": s}),
    }
    return {
        m: {"tokens_per_s": n / step, "step_ms": 1e3 * step, "tokens_per_step": n, **extra}
        for m, (step, n, extra) in rows.items()
    }


def mirror_wait(t: StageTimes, gamma: int, prefix: float, suffix: float) -> tuple[float, float]:
    """(E[wait], reuse): the expected time from the verdict's arrival at the draft worker to
    its next window, and the share of steps whose window is complete by then (module
    docstring; times from the step's start, the worker's as draft_worker.DraftWorker._run
    spends them; early-exit hits are taken to be in its first wave, the most likely one)."""
    b, tok, rv = t.draft_batch, t.draft_token, t.t_rv / 2
    big = max(1, t.branch_batch)
    rows = t.own_rows * (gamma + 1)
    own_waves = math.ceil(rows / big) if t.own_rows else 0
    own_end = tok + own_waves * gamma * b  # extend the cache, then the own waves to their end
    arrive, verdict = prefix + rv, prefix + suffix + 2 * rv
    k, pass_t, joined, started = 0, b, 0, rows
    ee_start = max(own_end, arrive)  # after the own waves, unless it joins one (below)
    if own_waves and b > 0 and tok < arrive < own_end:  # it comes during the own wave w
        w = min(int((arrive - tok) // (gamma * b)), own_waves - 1)
        k = math.ceil((arrive - tok) / b) - w * gamma  # that wave's passes before it is read
        own_end = ee_start = tok + (w + 1) * gamma * b  # later own waves are not started:
        started = min(rows, (w + 1) * big)  # their share of Ω̂_own counts as early-exit hits
        if k < gamma:  # its first wave joins the wave in flight (draft_worker.Wave.join)
            n_in = min(rows - w * big, big)  # a pass of n_in + big rows: linear between 1
            pass_t, joined = b + (b - tok) * n_in / max(big - 1, 1), 1  # and big rows
            ee_start = tok + (w * gamma + k) * b
            own_end = ee_start + (gamma - k) * pass_t
    ee_end = ee_start + gamma * pass_t
    if verdict < own_end:  # the own rows still run (the joined ones with them): they finish
        passes, free = (gamma - k) * joined, own_end
    elif verdict < ee_end:  # the early exit's first wave is cut after the pass in flight
        passes = math.ceil((verdict - ee_start) / pass_t) if pass_t > 0 else gamma
        free = ee_start + passes * pass_t
    else:
        passes, free = gamma, verdict
    w_own = max(0.0, own_end - verdict)
    w_ee = 0.0 if ee_end <= verdict else (free - verdict) + (gamma - passes) * tok  # resumed
    w_miss = (free - verdict) + gamma * tok  # a fresh rollout
    own = t.omega_own * started / rows if rows else 0.0
    ee = max(0.0, t.omega_kappa - own)
    wait = own * w_own + ee * w_ee + (1 - own - ee) * w_miss
    reuse = own * (own_end <= verdict) + ee * (ee_end <= verdict)
    return wait, reuse


def mirror_bound(t: StageTimes, gamma: int) -> float:
    """Mirror's predicted tokens/s at the most favourable Ω̂ and Ω̂_own: an upper bound over
    both, as the wait (mirror_wait) is linear in the shares of own hits, early-exit hits and
    misses, so its least value is at a vertex: all own (with own branches), all early exit,
    or all misses."""
    vertices = [(1.0, 0.0), (0.0, 0.0)] + ([(1.0, 1.0)] if t.own_rows else [])
    return max(
        predict(replace(t, omega_kappa=o, omega_own=w), gamma)["mirror"]["tokens_per_s"]
        for o, w in vertices
    )


def mirror_cannot_win(
    by_gamma: dict[int, StageTimes], runnable: list[str], factors: dict[str, float] | None = None
) -> str | None:
    """Why measuring Ω̂ on this prompt cannot change the pick, or None when it can: mirror
    cannot run the pair, or its bound at every γ, scaled by its correction factor, is below
    the best other method's prediction (scaled by its own). Ω̂ is then left unmeasured, which
    saves the probe's early-exit head and, at T > 0, its simulated steps (_sampled_hits:
    20-30 ms a prompt on a 2-core CPU, about 3 % of a 128-token answer)."""
    if "mirror" not in runnable:
        return "Ω̂ not measured: mirror cannot run this pair"
    f = factors or {}
    others = [m for m in runnable if m != "mirror"]
    if not others:
        return None
    best, best_g, best_m = -1.0, None, None
    for g, t in by_gamma.items():
        preds = predict(t, g)
        for m in others:
            r = preds[m]["tokens_per_s"] * f.get(m, 1.0)
            if r > best:
                best, best_g, best_m = r, g, m
    top = max(mirror_bound(t, g) for g, t in by_gamma.items()) * f.get("mirror", 1.0)
    if top >= best:
        return None
    scaled = " (measured factors applied)" if f else ""
    return (
        f"Ω̂ not measured: mirror at most {top:.1f} tok/s{scaled} with every correction a "
        f"branch, {best_m} at γ {best_g} {best:.1f}"
    )


def choose(t: StageTimes, gamma: int, runnable: list[str]) -> dict:
    """The fastest predicted method among `runnable`, with every prediction and the reason."""
    preds = {m: p for m, p in predict(t, gamma).items() if m in runnable}
    if not preds:
        raise ValueError(f"no method with a latency law among {runnable}")
    best = max(preds, key=lambda m: preds[m]["tokens_per_s"])
    ranked = sorted(preds, key=lambda m: -preds[m]["tokens_per_s"])
    runner_up = ranked[1] if len(ranked) > 1 else None
    why = f"{best}: predicted {preds[best]['tokens_per_s']:.1f} tok/s"
    if runner_up:
        r = preds[best]["tokens_per_s"] / preds[runner_up]["tokens_per_s"]
        why += f", {r:.2f}x {runner_up}"
    if "mirror" in preds and best != "mirror":
        why += (
            f"; mirror loses its hidden drafting to the target's {t.target_slowdown:.2f}x "
            "slowdown beside the draft"
            if t.target_slowdown > 1.05
            else "; mirror's hidden drafting does not pay for its rendezvous and misses"
        )
    return {
        "choice": best,
        "why": why,
        "predictions": {m: {k: round(v, 4) for k, v in p.items()} for m, p in preds.items()},
        "inputs": {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(t).items()},
        "gamma": gamma,
    }


def choose_joint(by_gamma: dict[int, StageTimes], runnable: list[str]) -> dict:
    """The fastest predicted (method, γ) over the candidate γ values (each with its own
    measured window passes): `choose`'s record at the winning γ, with every γ's predictions."""
    if not by_gamma:
        raise ValueError("no γ to choose among")
    recs = {g: choose(t, g, runnable) for g, t in by_gamma.items()}

    def rate(g: int) -> float:
        return recs[g]["predictions"][recs[g]["choice"]]["tokens_per_s"]

    best = max(recs, key=lambda g: (rate(g), -g))  # a tie goes to the shorter window
    out = dict(recs[best])
    if len(recs) > 1:
        out["why"] += f"; γ {best} of {', '.join(map(str, sorted(recs)))}"
        out["by_gamma"] = {g: r["predictions"] for g, r in sorted(recs.items())}
    return out


# Corrections.apply explores: a method predicted within EXPLORE of the pick after scaling,
# measured on fewer than EXPLORE_RUNS runs, runs next. Else a method once measured low (one
# trial on a hard prompt) never runs again to correct it: on an H100 target auto kept
# mirror@g6 at 0.83-0.87x sd@g6, sd's one trial at 0.78x its law (`apps.bench
# --target-backend torch --target-device cuda --methods sd,mirror,auto --gammas 4,6`)
EXPLORE, EXPLORE_RUNS = 0.05, 3


class Corrections:
    """What the chosen runs measured, folded back into the next choice (an autotuner's loop).

    After a run of `method` at γ, `observe` records measured / predicted step rates (tokens
    per second where the run's tokens per step are not known); `apply` multiplies every
    prediction of that method (at that sampling regime: greedy or not) by the geometric mean
    of its recorded ratios and re-picks the fastest (method, γ).
    The laws above leave things out (at T > 0 mirror's branch waves complete less often than
    its candidate coverage says: EMULATED m3-max, predicted 68 tok/s at γ 6, measured 48), and
    a process that runs many generations (a chat, a bench) should not repeat the same miss.
    A method never run keeps its prediction; one generation's ratio counts once, and a
    method's first run in the process is not counted: it pays one-time costs (a worker's
    start, first-shape warm-ups) that later runs do not, and a low factor from it would keep
    the method from ever running again (EMULATED m3-max T = 0: auto then ran sd@g5 at 60.8
    tok/s against mirror@g6's 77.9). A near tie decided by few runs is explored (EXPLORE).
    """

    def __init__(self):
        self.logs: dict[tuple[str, bool], list[float]] = {}
        self.seen: set[str] = set()  # methods whose first (warm-up) run has been skipped

    def factor(self, method: str, greedy: bool) -> float:
        xs = self.logs.get((method, greedy))
        return math.exp(sum(xs) / len(xs)) if xs else 1.0

    def observe(
        self,
        rec: dict,
        method: str,
        gamma: int | None,
        greedy: bool,
        tokens_per_s: float,
        tokens_per_step: float | None = None,
    ) -> None:
        """Record the run `rec` chose: `method` at `gamma` measured `tokens_per_s`, committing
        `tokens_per_step`. With the latter the ratio is of step rates (measured steps per
        second over 1 / the predicted step time): the laws' τ is the pair's pooled one, and a
        prompt's own acceptance would otherwise ride on the factor. On an H100 target the
        tokens-per-second ratios of one method swung e^±0.8 from prompt to prompt, and sd's
        one trial on a hard prompt (0.77x its law) kept auto on mirror@g6 at 0.87x sd@g6."""
        if method not in self.seen:  # its first run: warm-up, not the method's steady rate
            self.seen.add(method)
            return
        pred = (rec.get("by_gamma", {}).get(gamma) or rec.get("predictions", {})).get(method, {})
        if tokens_per_step and pred.get("step_ms") and tokens_per_s > 0:
            ratio = tokens_per_s / tokens_per_step * pred["step_ms"] / 1e3  # step rates
        elif pred.get("tokens_per_s") and tokens_per_s > 0:
            ratio = tokens_per_s / pred["tokens_per_s"]
        else:
            return
        self.logs.setdefault((method, greedy), []).append(math.log(ratio))

    KEEP = 32  # ratios per (method, regime) a saved state keeps: the latest

    def state(self) -> list:
        """The recorded ratios as JSON (devices/probe_store.py); `seen` is not kept, since every
        process pays its own first run's warm-up."""
        return [[m, g, xs[-self.KEEP :]] for (m, g), xs in self.logs.items()]

    def load_state(self, saved: list) -> None:
        for m, g, xs in saved:
            self.logs.setdefault((str(m), bool(g)), []).extend(float(x) for x in xs)

    def apply(self, rec: dict, greedy: bool) -> dict:
        """`rec` with its predictions scaled by the measured factors and its pick redone."""
        if not self.logs or not rec.get("predictions"):
            return rec
        tables = rec.get("by_gamma") or {rec["gamma"]: rec["predictions"]}
        top: dict[str, tuple[float, int]] = {}  # each method's best scaled rate and its γ
        for g, preds in sorted(tables.items()):
            for m, p in preds.items():
                rate = p["tokens_per_s"] * self.factor(m, greedy)
                if rate > top.get(m, (-1.0, 0))[0]:  # a tie goes to the shorter window
                    top[m] = (rate, g)
        first = max(top, key=lambda m: (top[m][0], -top[m][1]))
        best, best_rate = (first, top[first][1]), top[first][0]
        factors = {m: round(self.factor(m, greedy), 4) for m, g in self.logs if g == greedy}
        scaled = ", ".join(f"{m} x{f:.2f}" for m, f in factors.items())
        near = [
            m
            for m in top
            if m != first
            and top[m][0] >= (1 - EXPLORE) * best_rate
            and len(self.logs.get((m, greedy), ())) < EXPLORE_RUNS
        ]
        if near:  # a near tie that few runs decided: measure the other side too
            m = max(near, key=lambda x: top[x][0])
            runs = len(self.logs.get((m, greedy), ()))
            why = (
                f"{m} at γ {top[m][1]}, exploring: predicted {top[m][0]:.1f} tok/s, within "
                f"{EXPLORE:.0%} of {first} at γ {best[1]} ({best_rate:.1f}) after scaling "
                f"({scaled}), and measured on {runs} run(s) only"
            )
            best = (m, top[m][1])
        elif best == (rec["choice"], rec["gamma"]):
            return dict(rec, factors=factors) if factors else rec
        else:
            why = (
                f"{best[0]} at γ {best[1]}: predicted {best_rate:.1f} tok/s after scaling "
                f"by what earlier runs measured ({scaled}); the laws alone said "
                f"{rec['choice']} at γ {rec['gamma']}"
            )
        out = dict(rec, choice=best[0], gamma=best[1], factors=factors, why=why)
        if rec.get("by_gamma"):
            out["predictions"] = rec["by_gamma"][best[1]]
        return out
