"""CU-HLM's uncertainty-aware skipping on the edge (`--skip`): LOSSY, off by default.

A drafted token's uncertainty u is measured by temperature perturbation (CU-HLM eq. 8-9: M
temperatures theta ~ U[0, theta_max] applied to the draft's logits, u = the fraction of tokens
drawn at them that differ from the draft token). If u <= u_th (eq. 10) the token is committed
without verification: its row on the wire is its id alone (kernels/payload_cuhlm.py version 2)
and the verifier commits it untested (kernels/verify.py `forced`). A window whose drafts are all
skipped is not sent at all: its ids ride at the front of the next window that is (the "index
exchange" of CU-HLM §III-B), so a confident stretch costs no round trip. Skipped tokens keep the
draft's law, not the target's: the output is no longer the target's (stats say `lossy: true`).

u_th is Theorem 1's risk-prone threshold (Delta - b) / a (eq. 12), with a, b of eq. (7) and
Delta = P(y_d < x_d) fitted on the embedded pair (FIT below; `--u-th` overrides it for other
pairs, whose fit `python -m apps.bench.studies.uplink_codecs` prints).

The rejection risk R is MEASURED after the run by an audit, when the target is at hand (the
command layer's `--server local`, and every benchmark): one teacher-forced target pass over
prompt + output gives y at each skipped position, so beta_d = (1 - y_d / x_d)^+ (below CU-HLM
eq. 3) is the probability the verifier would have rejected that token, with x_d the q̂(d) it
was drawn from. R = sum of beta_d over skipped tokens / output tokens (Theorem 1's R: the
expected extra rejections per token, each output token being one of the paper's rounds), and
`skipped_reject_rate` = the mean beta_d over skipped tokens (the expected fraction of skipped
tokens the target would have rejected). Theorem 1's bound (eq. 13) on R is reported beside it,
from the run's own uncertainty values. Without a target at hand (a remote verifier and no
--target) R is null and says why.

What it is not: the wire format (kernels/payload_cuhlm.py) or the loop (runtime/edge/loop.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels import cuhlm
from runtime.errors import DuetError

# eq. (7) fit and Delta on the embedded pair, per temperature: (a, b, Delta), from
# `python -m apps.bench.studies.uplink_codecs --limit 6 --temps 0.2,0.5,0.8,1.0 --json` (876
# teacher-forced
# positions, M = 16, theta_max = 1). The fit is weak here (r = 0.39, 0.36, 0.36, 0.29; the
# paper: 0.71), and eq. (12) gives u_th = 0.89 at T = 0.2 and > 1 above, i.e. skip every draft.
FIT = {
    0.2: (0.5786, 0.0875, 0.6016),
    0.5: (0.3614, 0.1111, 0.6119),
    0.8: (0.3089, 0.0921, 0.6039),
    1.0: (0.2456, 0.0704, 0.5708),
}
M_DEFAULT = 16  # perturbation samples M (CU-HLM §III-A uses 20)
THETA_MAX_DEFAULT = 1.0  # theta_max, as the fit above was made (CU-HLM §III-A uses 2)


@dataclass(frozen=True)
class SkipRule:
    """The skip rule: skip iff u <= u_th (eq. 10); a, b, delta: the fit behind u_th (eq. 12)."""

    u_th: float
    a: float | None = None
    b: float | None = None
    delta: float | None = None
    m: int = M_DEFAULT
    theta_max: float = THETA_MAX_DEFAULT
    source: str = ""


def skip_rule(
    temp: float, u_th: float | None = None, m: int = M_DEFAULT, theta_max: float = THETA_MAX_DEFAULT
) -> SkipRule:
    """The rule at `temp`: u_th from Theorem 1 with the fit at the nearest fitted temperature,
    or the given u_th. DuetError (one line) at temp 0: there is nothing to risk-bound."""
    if temp <= 0:
        raise DuetError(
            "--skip needs --temp > 0: CU-HLM's skip rule bounds the rejection "
            "risk of sampled drafts (Theorem 1); at --temp 0 drop --skip"
        )
    if u_th is not None and not 0.0 <= u_th <= 1.0:
        raise DuetError(f"--u-th must be in [0, 1] (u of eq. 9 is a fraction; got {u_th})")
    t = min(FIT, key=lambda x: abs(x - temp))
    a, b, delta = FIT[t]
    if u_th is not None:
        return SkipRule(u_th, a, b, delta, m, theta_max, f"--u-th (fit at T={t:g} for the bound)")
    return SkipRule(
        cuhlm.uncertainty_threshold(a, b, delta),
        a,
        b,
        delta,
        m,
        theta_max,
        f"Theorem 1 eq. (12), embedded pair's fit at T={t:g}",
    )


class Skipper:
    """One generation's skip decisions: `decide(logits, d)` measures u (eq. 8-9) and says
    whether d is committed unverified (eq. 10). Its own RNG, so drafting's draws are unchanged."""

    def __init__(self, rule: SkipRule, rng: np.random.Generator):
        self.rule = rule
        self.rng = rng

    def uncertainty(self, logits: np.ndarray, d: int) -> float:
        """u(t) of eq. (9) for draft token d."""
        th = cuhlm.perturbation_temperatures(self.rng, self.rule.m, self.rule.theta_max)
        return cuhlm.uncertainty(logits, d, th, self.rng.random(self.rule.m))  # eq. (8)-(9)

    def decide(self, u: float) -> bool:
        """True: skip (delta(t) = 0 of eq. 10)."""
        return not cuhlm.transmit(u, self.rule.u_th)


def skipped_positions(events, prompt_len: int, n_out: int) -> tuple[list[int], list[float]]:
    """(positions in prompt + output, x_d) of the skipped tokens that made it into the output."""
    pos, xs = [], []
    for ev in events:
        for p, x in ev.extra.get("edge", {}).get("skipped", ()):
            if p < prompt_len + n_out:
                pos.append(p)
                xs.append(x)
    return pos, xs


def audit(target, seq: list[int], positions: list[int], x_d: list[float], sampling) -> list[float]:
    """beta_d = (1 - y_d / x_d)^+ at each skipped position, y from one teacher-forced pass of
    the target over `seq` (prompt + output) under the run's sampling settings."""
    if not positions:
        return []
    end = max(positions)
    logits = np.asarray(target.forward(np.array([seq[:end]]), target.new_cache()))[0]  # (end, V)
    y = sampling.probs(logits[np.asarray(positions) - 1])  # the law at position p: logits p-1
    return [
        cuhlm.rejection_probability(xd, float(y[i, seq[p]]))
        for i, (p, xd) in enumerate(zip(positions, x_d, strict=True))
    ]


def skip_summary(
    events, rule: SkipRule, n_out: int, betas: list[float] | None, why_no_audit: str = ""
) -> dict:
    """The `stats.skip` object: rule, skip rate, measured R (or why not) and Theorem 1's bound."""
    us = [u for ev in events for u in ev.extra.get("edge", {}).get("u", ())]
    rounds = [ev.extra["edge"] for ev in events if "edge" in ev.extra]
    skipped = sum(len(r.get("skipped", ())) for r in rounds)
    n = max(1, n_out)
    out = {"lossy": True, "u_th": rule.u_th, "a": rule.a, "b": rule.b, "delta": rule.delta,
           "m": rule.m, "theta_max": rule.theta_max, "source": rule.source,
           "skipped": skipped, "output_tokens": n_out, "skip_rate": skipped / n,
           "windows_not_sent": sum(1 for r in rounds if not r.get("sent", True)),
           "mean_u": float(np.mean(us)) if us else None}  # fmt: skip
    if rule.a is not None and rule.a > 0:
        out["theorem1_bound"] = cuhlm.theorem1_bound(
            np.array(us), rule.a, rule.b, rule.delta, rule.m, rule.u_th
        )  # eq. (13)
    if betas is None:
        out.update(measured_risk=None, skipped_reject_rate=None, audit=why_no_audit)
    else:
        out.update(
            measured_risk=sum(betas) / n,
            skipped_reject_rate=sum(betas) / len(betas) if betas else 0.0,
            audit="teacher-forced target pass over prompt + output",
        )
    return out
