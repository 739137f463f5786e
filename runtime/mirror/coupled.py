"""Mirror-SD's early exit when sampling, coupled to the verifier's own step noise.

Greedy, the correction is the target's argmax, and the early-exit top-κ of eq. 7 covers it
often (App. E: FF ≤ 1 - Ω_κ). When sampling, the correction is a *random* draw from the
residual max(p - q, 0) (or from p at the bonus position), and the proxy's top-κ covers that
draw poorly: at T = 1 on emulated m3-max it missed in 52-59 % of steps, so mirror fell back to
a serial rollout and lost to sd.

The verifier's randomness is ours, though. Mirror keys the step's noise by (seed, step, 3)
(runtime.decoding.events.step_noise, whose verdicts sd draws too): the acceptance uniforms
u (γ,) and one row of standard Gumbel noise per window position G (γ+1, V), a counter-based
field read only where needed (kernels/gumbel_field.py).
The correction is the Gumbel-max draw argmax_x log r(x) + G(x) over the residual r
(kernels.verify.verify_sampling), which is an exact draw from norm(r) because the noise of
step t is independent of the window it judges: that window was drafted earlier, from the
draft's own generators (NumPy's, keyed [seed, step, 0 | 1, ...]). Knowing G before the final
layers, the early exit can predict
the draw: `coupled_message` sends, at each position j < γ, the draft's own token d_{j+1} (so
the draft can predict its acceptance) and the κ - 1 other tokens maximising log p̃_j + G_j; at
j = γ the κ tokens maximising log p̃_γ + G_γ. The wire format is eq. 7's (top-κ ids and bf16
proxy log-probs). The draft regenerates (u, G) from the same key and `rank_coupled` orders the
branches by the outcome's probability under the proxy given u.

Why log p̃ + G and not the residual's own score log max(p̃ - q, 0) + G: the proxy's residual is
a difference of two close laws, and its errors exclude tokens the true residual keeps. Measured
on the embedded pair at T = 1 (8 prompts, 191 rejections; the tuned exit at ℓe = 4), the true
correction was among 7 candidates in 85 % of rejections with log p̃ + G, 52 % with the
residual's score, and 46 % with eq. 7's top-κ of p̃ (without the noise); at the bonus position,
97 % with 8 candidates against 54 %.

What it does not do: change any committed token's law (the noise only decides which branches
are rolled out first; each branch's tokens come from the draft's own generator keyed by
(A, c)); tests/test_sampling_gof.py checks mirror's law with it, and its negative control.
Greedy decoding keeps eq. 7 unchanged.
"""

from __future__ import annotations

import math

import numpy as np

from kernels.gumbel_field import GumbelField
from kernels.topk_channel import from_bf16_bits, log_softmax, to_bf16_bits
from runtime.mirror.branches import Branch

SIGMA = 0.75  # assumed spread (nats) of log p around the proxy's log p̃, for the ranking only
_FLOOR = -1e4  # a finite stand-in for log 0 (top-p cuts), so bf16 and sorting stay finite


def coupled_message(
    lp: np.ndarray, drafts: list[int], gumbel: GumbelField, kappa: int
) -> tuple[np.ndarray, np.ndarray]:
    """The early-exit message at T > 0: ids (γ+1, κ) int32 and their proxy log-probs (bf16).

    lp (γ+1, V): log p̃, the early-exit law after the sampling transform (temperature,
    top-p; kernels.sampling.log_probs_from_logits: from logits, the log-softmax costs a third
    of a softmax followed by a log at V = 151,936), -inf where filtered; drafts: the window's
    tokens d_1..d_γ; gumbel: step_noise's field G."""
    g, vocab = len(drafts), lp.shape[-1]
    lp = np.maximum(np.asarray(lp, np.float32), np.float32(_FLOOR))  # a copy: scored in place
    rows, own = np.arange(g), np.asarray(drafts, np.int64)
    kept = lp[rows, own].copy()
    lp[rows, own] = -np.inf  # a rejected token is never the correction
    k = min(kappa, vocab)
    top = gumbel.top(lp, k)[0]  # the Gumbel-max score of each draw under p̃: log p̃ + G
    lp[rows, own] = kept
    ids = np.empty((g + 1, k), dtype=np.int64)
    ids[:g, 0] = own  # the draft's own token first, so the draft can predict its acceptance
    ids[:g, 1:] = top[:g, : k - 1]
    ids[g] = top[g]
    logp = np.take_along_axis(lp, ids, -1).astype(np.float32)
    return ids.astype(np.int32), from_bf16_bits(to_bf16_bits(logp))


OWN_KAPPA = 8  # candidates per window position that rank_own_coupled ranks among


def rank_own_coupled(own_lp, drafts, q, u, gumbel, m: int) -> list:
    """The draft's own branches when sampling, before the early exit: the m·(γ+1) most likely.

    own_lp (γ+1, V): the draft's log-laws at window positions 0..γ, standing in for log p̃; q:
    the window's laws (γ, V); u, gumbel: step_noise's. The candidates are those of
    `coupled_message` with the draft's law as the proxy, ranked by `rank_coupled`. The draft's
    plain runner-ups ignore the noise that decides the correction: on the embedded pair at
    T = 1, γ = 4 (10 prompts, 438 steps) the 10 branches ranked here held the step's (A, c)
    in 61 % of steps, the 10 runner-ups (2 per position) in 25 % (.devrun side script)."""
    ids, logp = coupled_message(own_lp, drafts, gumbel, OWN_KAPPA)
    return rank_coupled(ids, logp, drafts, q, u, gumbel)[: m * (len(drafts) + 1)]


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def rank_coupled(ids, logp, drafts, q, u, gumbel, sigma: float = SIGMA) -> list:
    """Branches (j, v) of a coupled message, most likely first, given the step's noise.

    d_{i+1} is accepted iff u_i q_i(d) < p_i(d); with log p = log p̃ + N(0, σ²) that has
    probability Φ((log p̃_i(d) - log(u_i q_i(d))) / σ). Rejected at j, the correction is the
    Gumbel-max winner of the residual; the candidates' chance of winning is taken as the
    softmax of their scores log p̃ + G over σ. Only the rollout order depends on this.
    """
    path, out = 0.0, []
    for j in range(len(drafts) + 1):
        row, lp = np.asarray(ids[j]), np.asarray(logp[j], np.float64)
        if j == len(drafts):  # the bonus position: c = argmax log p + G
            w = log_softmax((lp + gumbel[j, row]) / sigma)
            out += [Branch(j, int(v), path + float(x)) for v, x in zip(row, w, strict=True)]
            break
        own = int(drafts[j])
        lp_own = float(lp[0]) if row[0] == own else _FLOOR
        qd = max(float(q[j, own]) * float(u[j]), 1e-30)
        acc = min(max(_phi((lp_own - math.log(qd)) / sigma), 1e-6), 1 - 1e-6)
        keep = row != own
        cand = row[keep]
        w = log_softmax((lp[keep] + gumbel[j, cand]) / sigma)
        base = path + math.log1p(-acc)
        out += [Branch(j, int(v), base + float(x)) for v, x in zip(cand, w, strict=True)]
        path += math.log(acc)
    return sorted(out, key=lambda b: -b.score)
