"""CU-HLM's edge-side rules: uncertainty, skipping, top-k 8-bit compression, k* selection.

- Uncertainty by temperature perturbation (eq. 8-9): M temperatures
  theta ~ U[0, theta_max], one token drawn from softmax(z / theta) for each, u =
  the fraction that differ from the draft token.
- Opportunistic skipping (eq. 10): transmit iff u > u_th, with u_th = (Delta - b)/a
  (Theorem 1, eq. 12; risk-averse: -b/a) from the linear fit beta_d = a u + b (eq. 7).
- Compressed vocabulary: the top-k probabilities as 8 bits each plus their ids;
  the receiver spreads the residual mass uniformly over the other V - k tokens
  (eq. 15). The paper fixes b_prob = 8 (§V-A) but not what the 8 bits mean: `"linear"`
  levels are v / 255; `"log"` levels are p = 2^(-v * LOG_SPAN / 255) for v < 255 and no
  mass for v = 255. At T = 1 most top-k probabilities are below 1/255, where linear
  levels round them to 0 or 1/255; log levels keep each one above 2^-16 within a factor
  2^(8/255) ~ 2^(1/32). Offline k* (eq. 21) from E_t[U_TV(k, t)] (eq. 20) and online k(t)*
  (eq. 23-24) from the device-side bound.

Departure from the paper, on purpose: the paper samples the draft token from
x and verifies against x^, which biases the output (its eq. 17). Here the draft
token is sampled from the reconstructed x^ itself, so verification with x^ is
exact (SQS §2's quantize-and-sample argument): compression costs acceptance,
never fidelity. Skipping (eq. 10) still accepts unverified tokens and is lossy.

Plain twins: `uncertainty_reference`, `residual_deviation_reference`,
`fit_linear_reference`, `quantize_probs_u8_reference`, `quantize_probs_log_reference`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kernels.sampling import sample

PROB_BITS = 8  # b_prob = 8 (CU-HLM §V-A)
PROB_LEVELS = (1 << PROB_BITS) - 1  # linear: a probability is v / 255, v in 0..255
# log: level v < 255 is p = 2^(-v * 16 / 255): 2^-16 <= p <= 1 in steps of 2^(16/255) ~ 2^(1/16)
LOG_SPAN = 16
LOG_NONE = PROB_LEVELS  # log: level 255 sends no mass for that id
# p of each log level (float64, level 255 -> 0), built with Python's ** as the plain twin does
LOG_TABLE = np.array([2.0 ** (-v * LOG_SPAN / PROB_LEVELS) for v in range(LOG_NONE)] + [0.0])
LEVELS = ("log", "linear")  # the meanings of the 8 bits (b_prob = 8, CU-HLM §V-A)


# --- uncertainty and skipping -------------------------------------------------------------


def perturbation_temperatures(rng: np.random.Generator, m: int, theta_max: float) -> np.ndarray:
    """M temperatures theta^(m) ~ U[0, theta_max] (Alg. 1 line 4)."""
    return rng.uniform(0.0, theta_max, m)


def uncertainty(logits: np.ndarray, draft_token: int, thetas: np.ndarray, u: np.ndarray) -> float:
    """u(t) = (1/M) sum_m 1(d^(m) != d), d^(m) ~ softmax(z / theta^(m)) by inverse CDF at u[m]
    (eq. 8-9)."""
    z = np.asarray(logits, np.float64)
    th = np.asarray(thetas, np.float64)
    hot = th > 0
    d = np.full(len(th), int(np.argmax(z)))  # theta = 0: the argmax (greedy limit of eq. 8)
    if hot.any():
        s = z[None, :] / th[hot, None]  # eq. (8): z_v / theta^(m)
        s -= s.max(-1, keepdims=True)
        p = np.exp(s)
        d[hot] = sample((p / p.sum(-1, keepdims=True)).astype(np.float32), np.asarray(u)[hot])
    return float(np.mean(d != draft_token))  # eq. (9)


def uncertainty_reference(logits, draft_token: int, thetas, u) -> float:
    """Plain twin of uncertainty: one softmax and one draw per temperature."""
    z = np.asarray(logits, np.float64)
    differ = 0
    for th, um in zip(thetas, u, strict=True):
        if th > 0:
            p = np.exp(z / th - (z / th).max())
            dm = int(sample((p / p.sum()).astype(np.float32), um))
        else:
            dm = int(np.argmax(z))
        differ += dm != draft_token
    return differ / len(thetas)


def transmit(u: float, u_th: float) -> bool:
    """delta(t) of eq. (10): True (send) iff u > u_th; False skips the uplink (lossy)."""
    return u > u_th


def rejection_probability(x_d: float, y_d: float) -> float:
    """beta_d = (1 - y_d / x_d)^+: the chance the verifier rejects draft token d (below eq. 3)."""
    return max(0.0, 1.0 - y_d / x_d) if x_d > 0 else 0.0


@dataclass(frozen=True)
class LinearFit:
    """beta_d ~ a u + b (eq. 7), with Pearson r, MSE and R^2 of the fit."""

    a: float
    b: float
    r: float
    mse: float
    r2: float


def fit_linear(u: np.ndarray, beta: np.ndarray) -> LinearFit:
    """Least-squares a, b of eq. (7) over observed (u(t), beta_d(t)) pairs."""
    u, beta = np.asarray(u, np.float64), np.asarray(beta, np.float64)
    if len(u) < 2 or np.ptp(u) == 0:
        raise ValueError("need at least two distinct uncertainty values to fit eq. (7)")
    a, b = np.polyfit(u, beta, 1)  # eq. (7): beta_d(t) = a u(t) + b
    resid = beta - (a * u + b)
    mse = float(np.mean(resid**2))
    var = float(np.var(beta))
    r = float(np.corrcoef(u, beta)[0, 1]) if var > 0 else 0.0
    return LinearFit(float(a), float(b), r, mse, 1 - mse / var if var > 0 else 0.0)


def fit_linear_reference(u, beta) -> tuple[float, float]:
    """Plain twin: the closed-form simple regression a = cov(u, beta) / var(u),
    b = mean - a mean."""
    n = len(u)
    mu, mb = sum(u) / n, sum(beta) / n
    a = sum((x - mu) * (y - mb) for x, y in zip(u, beta, strict=True)) / sum(
        (x - mu) ** 2 for x in u
    )
    return a, mb - a * mu


def uncertainty_threshold(a: float, b: float, delta: float) -> float:
    """u_th = (Delta - b) / a (Theorem 1, eq. 12): risk-prone skipping; Delta = P(y_d < x_d)."""
    return (delta - b) / a  # eq. (12)


def risk_averse_threshold(a: float, b: float) -> float:
    """-b / a: the lower end of eq. (14), skipping only tokens the fit says are never rejected."""
    return -b / a


def rejection_risk(u: np.ndarray, a: float, b: float, u_th: float) -> float:
    """Empirical R = E[(a u + b) 1(-b/a < u <= u_th)] (Theorem 1's definition, proof of eq. 13)."""
    u = np.asarray(u, np.float64)
    inside = (u > -b / a) & (u <= u_th)
    return float(np.mean(np.where(inside, a * u + b, 0.0)))


def theorem1_bound(
    u: np.ndarray, a: float, b: float, delta: float, m: int, u_th: float | None = None
) -> float:
    """Eq. (13)'s bound on R: Delta^{3/2} / sqrt(3a) * sqrt(int_{-b/a}^{u_th} f(u)^2 du).

    u (eq. 9) takes the values j / M, so f is the histogram density with bins of width 1/M
    centred on them (the paper uses a Gaussian KDE); the integral is exact for that density.
    u_th defaults to eq. (12)'s (Delta - b) / a; for another threshold the same Hölder step
    gives (a u_th + b)^{3/2} in place of Delta^{3/2}.
    """
    if a <= 0:
        raise ValueError(f"eq. (13) needs a > 0 (got a = {a})")
    u = np.asarray(u, np.float64)
    if u.size == 0:
        return 0.0
    h = 1.0 / m
    j = np.rint(u * m).astype(np.int64)
    f = np.bincount(j, minlength=m + 1) / (u.size * h)  # density on bin j: [j/M - h/2, j/M + h/2]
    lo = -b / a  # eq. (14)'s range, up to u_th of eq. (12) unless another is given
    hi = (delta - b) / a if u_th is None else u_th
    if hi <= lo:
        return 0.0
    left = np.arange(m + 1) * h - h / 2
    overlap = np.clip(np.minimum(left + h, hi) - np.maximum(left, lo), 0.0, None)
    top = (a * hi + b) ** 1.5  # Delta^{3/2} at eq. (12)'s u_th
    return float(top / math.sqrt(3 * a) * math.sqrt(float(np.sum(f**2 * overlap))))  # eq. (13)


def theorem1_bound_reference(u, a: float, b: float, delta: float, m: int, u_th=None) -> float:
    """Plain twin of theorem1_bound: midpoint sum of f^2 on a fine grid over [-b/a, u_th]."""
    n, lo, hi = len(u), -b / a, (delta - b) / a if u_th is None else u_th
    if n == 0 or hi <= lo:
        return 0.0
    steps = 20_000
    du = (hi - lo) / steps
    total = 0.0
    for i in range(steps):
        x = lo + (i + 0.5) * du
        c = sum(1 for v in u if abs(x - round(v * m) / m) < 0.5 / m)
        total += (c / (n / m)) ** 2 * du
    return (a * hi + b) ** 1.5 / math.sqrt(3 * a) * math.sqrt(total)


# --- compressed vocabulary ----------------------------------------------------------------


def quantize_probs_u8(x: np.ndarray) -> np.ndarray:
    """8-bit levels v (uint8) with v ~ 255 x and sum(v) <= 255, so eq. (15)'s residual is >= 0.

    Round to nearest; if that overshoots 255 in total, lower the entries rounded
    up the most (Alg. 2's rule, SQS App. A.1), which never drives one below 0.
    """
    target = PROB_LEVELS * np.asarray(x, np.float64)
    v = np.floor(target + 0.5).astype(np.int64)
    excess = int(v.sum()) - PROB_LEVELS
    if excess > 0:
        order = np.argsort(v - target, kind="stable")
        v[order[len(order) - excess :]] -= 1
    return v.astype(np.uint8)


def quantize_probs_u8_reference(x) -> list[int]:
    """Plain twin of quantize_probs_u8."""
    t = [PROB_LEVELS * float(p) for p in x]
    v = [math.floor(p + 0.5) for p in t]
    excess = sum(v) - PROB_LEVELS
    if excess > 0:
        for i in sorted(range(len(v)), key=lambda i: (v[i] - t[i], i))[len(v) - excess :]:
            v[i] -= 1
    return v


def _log_targets(x: np.ndarray) -> np.ndarray:
    """The exact (real) log level of each probability: -log2(x) * 255 / LOG_SPAN (inf at 0)."""
    x = np.asarray(x, np.float64)
    with np.errstate(divide="ignore"):
        return -np.log2(x) * (PROB_LEVELS / LOG_SPAN)


def quantize_probs_log(x: np.ndarray) -> np.ndarray:
    """8-bit log levels (uint8): v = round(-log2(x) * 255 / 16), 255 (no mass) past 2^-16.

    Round to nearest; while the sent probabilities sum past 1, lower by one level (v + 1)
    the entries rounded up the most, so eq. (15)'s residual is >= 0. One pass suffices:
    nearest rounding overshoots by at most 2^(8/255) and one level takes 2^(16/255) off.
    """
    t = _log_targets(x)
    v = np.minimum(np.floor(t + 0.5), LOG_NONE).astype(np.int64)  # b_prob = 8 (CU-HLM §V-A)
    total = math.fsum(LOG_TABLE[v].tolist())
    if total > 1.0:
        order = np.argsort(-(t - v), kind="stable")  # most rounded up (t - v largest) first
        order = order[v[order] < LOG_NONE]
        cut = LOG_TABLE[v[order]] - LOG_TABLE[v[order] + 1]  # what one level lower takes off
        before = np.concatenate([[0.0], np.cumsum(cut)[:-1]])  # taken off before each entry
        n = int(np.count_nonzero(total - before > 1.0))  # entries lowered until the sum <= 1
        v[order[:n]] += 1
    return v.astype(np.uint8)


def quantize_probs_log_reference(x) -> list[int]:
    """Plain twin of quantize_probs_log: one entry at a time."""
    t = [math.inf if float(p) <= 0 else -math.log2(float(p)) * PROB_LEVELS / LOG_SPAN for p in x]
    v = [min(LOG_NONE, math.floor(ti + 0.5)) if ti < math.inf else LOG_NONE for ti in t]

    def prob(level: int) -> float:
        return 0.0 if level >= LOG_NONE else 2.0 ** (-level * LOG_SPAN / PROB_LEVELS)

    total = math.fsum(prob(lv) for lv in v)
    taken = 0.0
    for i in sorted(range(len(v)), key=lambda i: (-(t[i] - v[i]), i)):
        if total - taken <= 1.0:
            break
        if v[i] < LOG_NONE:
            taken += prob(v[i]) - prob(v[i] + 1)
            v[i] += 1
    return v


def quantize_levels(x: np.ndarray, levels: str) -> np.ndarray:
    """The 8-bit levels of probabilities x in the named scale ("log" or "linear")."""
    if levels == "log":
        return quantize_probs_log(x)
    if levels == "linear":
        return quantize_probs_u8(x)
    raise ValueError(f"unknown probability levels {levels!r}; choose from {', '.join(LEVELS)}")


def dequantize(levels: np.ndarray, scale: str = "linear") -> np.ndarray:
    """The probabilities (float64) that 8-bit levels stand for: v / 255, or 2^(-16 v / 255)."""
    lv = np.asarray(levels, np.int64)
    if scale == "log":
        return LOG_TABLE[lv]
    if scale == "linear":
        return lv / PROB_LEVELS
    raise ValueError(f"unknown probability levels {scale!r}; choose from {', '.join(LEVELS)}")


def topk_ids(x: np.ndarray, k: int) -> np.ndarray:
    """The k most likely ids, most likely first (ties: lower id)."""
    x = np.asarray(x)
    if not 1 <= k < x.size:
        raise ValueError(
            f"k must be in [1, V-1] = [1, {x.size - 1}] (eq. 15 needs a residual), got {k}"
        )
    part = np.argpartition(-x, k - 1)[:k]
    return part[np.lexsort((part, -x[part]))]


def reconstruct(ids: np.ndarray, levels: np.ndarray, v: int, scale: str = "linear") -> np.ndarray:
    """x^ of eq. (15) from the sent ids and 8-bit levels in `scale`: the levels' probabilities
    there, the residual uniform over the other V - k ids. (V,) float32."""
    k = len(ids)
    if scale == "linear":  # integer residual: exact for v / 255 levels
        sent = np.asarray(levels, np.float64) / PROB_LEVELS
        rest = (PROB_LEVELS - int(np.sum(levels, dtype=np.int64))) / (PROB_LEVELS * (v - k))
    else:
        sent = dequantize(levels, scale)
        rest = max(0.0, 1.0 - math.fsum(sent.tolist())) / (v - k)  # sum <= 1 up to rounding
    out = np.full(v, rest)  # eq. (15): the residual mass spread uniformly
    out[np.asarray(ids, np.int64)] = sent  # eq. (15): x^_i = x_i for the top k
    return out.astype(np.float32)


def residual_deviation(x: np.ndarray) -> np.ndarray:
    """N(k) = sum_{i>k} |x_i - x^_i| for k = 1..V-1 (x sorted descending; eq. 20/23's numerator).

    x^ is eq. (15) with the exact top-k values. Returns (V-1,) float64, entry k-1 for k.
    """
    xs = np.sort(np.asarray(x, np.float64))[::-1]
    n = xs.size
    pre = np.concatenate([[0.0], np.cumsum(xs)])  # pre[j] = x_1 + ... + x_j
    k = np.arange(1, n)
    r = (1.0 - pre[k]) / (n - k)  # eq. (15)'s residual level
    # tail entries >= r sit at sorted positions k+1..k+c (the top k are all >= the tail mean)
    c = np.clip(n - np.searchsorted(xs[::-1], r, side="left") - k, 0, n - k)
    above = pre[k + c] - pre[k] - c * r
    below = (n - k - c) * r - (pre[n] - pre[k + c])
    return above + below


def residual_deviation_reference(x) -> list[float]:
    """Plain twin of residual_deviation."""
    xs = sorted((float(p) for p in x), reverse=True)
    n, out = len(xs), []
    for k in range(1, n):
        r = (1.0 - sum(xs[:k])) / (n - k)
        out.append(sum(abs(p - r) for p in xs[k:]))
    return out


def utv_offline(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """U_TV(k, t) for k = 1..V-1 (eq. 20): N(k) / TV(x, y). Needs the target's y (offline)."""
    tv = 0.5 * float(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).sum())
    return residual_deviation(x) / max(tv, 1e-12)  # eq. (20)


def k_offline(xs: np.ndarray, ys: np.ndarray, theta: float) -> int:
    """k* = min{k : E_t[U_TV(k, t)] <= theta} (eq. 21) over rows x_t, y_t; V-1 if none qualifies."""
    mean = np.mean([utv_offline(x, y) for x, y in zip(xs, ys, strict=True)], axis=0)  # E_t[U_TV]
    ok = np.flatnonzero(mean <= theta)  # eq. (21)
    return int(ok[0]) + 1 if ok.size else len(mean)


def softplus(z: float, eta: float) -> float:
    """l(z) = ln(1 + e^{eta z}) / eta, the smooth ReLU of eq. (22)."""
    return float(np.logaddexp(0.0, eta * z) / eta)


def k_online(
    x: np.ndarray, x_d: float, u: float, a: float, b: float, theta: float, eta: float = 10.0
) -> int:
    """k(t)* = min{k : N(k) / [(1 - x_d) l(-1) + x_d l(-beta_d)] <= theta},
    beta_d = a u + b (eq. 23-24).

    Everything is on the device: x, the draft token's x_d and its uncertainty u.
    Returns V-1 if no k qualifies.
    """
    beta_d = min(1.0, max(0.0, a * u + b))  # eq. (7), clipped to a probability
    denom = (1 - x_d) * softplus(-1.0, eta) + x_d * softplus(-beta_d, eta)  # eq. (23)'s denominator
    ok = np.flatnonzero(residual_deviation(x) / denom <= theta)  # eq. (24)
    return int(ok[0]) + 1 if ok.size else len(x) - 1
