"""FlexSpec's channel-aware draft length (flexspec.txt §IV-B eq. (7)-(11), Alg. 2), online.

`AdaptiveK` is the edge client's K controller: before a round, `choose(k_max)` returns
K* = argmax E[τ|K] / E[T_fixed + K·T_marginal] (eq. (11)) from what it has measured; after a
round, `update(...)` folds in the round's accepted length, the link rate R_n the round saw, the
real frame bytes and the measured edge, cloud and network times. It does no I/O.

What it estimates, and why (each checked against recorded rounds; see tests/test_kstar.py):
  * acceptance: E[τ|K] defaults to the bounded geometric model (1 − γ^{K+1}) / (1 − γ) with γ
    the per-token acceptance. A round that drafts K and accepts A is a truncated geometric
    draw, so γ is estimated by its maximum likelihood ΣA / (ΣA + #rounds that ended in a
    rejection), exponentially weighted, with Alg. 2's γ̂ = 0.8 as a two-trial prior. Alg. 2's
    own EMA of A/K estimates the accepted *fraction*, which is what its numerator 1 + γ̂·K
    needs (model="alg2" keeps it) but which under-estimates γ for K > 1 (E[A/K] =
    γ(1 − γ^K) / (K(1 − γ))): fed to the geometric model it drove K* well below the best K.
  * rate: the emulated links draw one block-fading gain per round, independently, so the last
    round's R_n says nothing about the next one; eq. (11) is a ratio of expectations (tokens per
    round over seconds per round), and the seconds are linear in 1/R_n, so the controller uses
    E[1/R]: the weighted mean of the measured 1/R_n, started from the link condition's own
    E[1/R] when it is known (`inv_rate_prior`, devices.links.Link.mean_inverse_rate). Under
    Rayleigh fading E[1/R] is 2-3× 1/median(R) on 4g and wifi-weak.
  * costs: α_edge/β (draft + encode, eq. (10)'s linear T_edge), T_base/δ_cloud (eq. (9)) and
    the round's network time beyond serialization (propagation, framing, the server's payload
    decode) are each an exponentially weighted least-squares line in K, so a per-token part of
    the network time is not charged to T_fixed. Profile parameters (`params`) replace the fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from devices.latency import FlexSpecParams, ema_acceptance, k_star


@dataclass
class _AffineEMA:
    """Exponentially weighted least squares y ≈ a + b·k; `fallback` says which term takes
    everything while k has not varied ("slope": y ≈ b·k, "intercept": y ≈ a)."""

    fallback: str
    decay: float = 0.9
    s: list[float] = field(default_factory=lambda: [0.0] * 5)  # n, Σk, Σk², Σy, Σky

    def add(self, k: float, y: float) -> None:
        self.s = [self.decay * v for v in self.s]
        for i, v in enumerate((1.0, k, k * k, y, k * y)):
            self.s[i] += v

    def fit(self) -> tuple[float, float] | None:
        n, sk, skk, sy, sky = self.s
        if n == 0:
            return None
        var = skk / n - (sk / n) ** 2
        if var > 1e-6:
            b = (sky / n - sk * sy / n**2) / var
            a = sy / n - b * sk / n
            if a >= 0 and b >= 0:
                return a, b
        if self.fallback == "slope":
            return 0.0, (sy / sk if sk > 0 else 0.0)
        return sy / n, 0.0


@dataclass
class AcceptanceMLE:
    """Per-token acceptance γ of truncated-geometric rounds: exponentially weighted maximum
    likelihood ΣA / (ΣA + #rejections), with a prior of `prior_weight` trials at `gamma0`."""

    gamma0: float = 0.8
    prior_weight: float = 2.0
    decay: float = 0.9
    accepted: float = field(init=False)
    rejected: float = field(init=False)

    def __post_init__(self):
        self.accepted = self.gamma0 * self.prior_weight  # Alg. 2: γ̂ ← 0.8, as pseudo-trials
        self.rejected = (1.0 - self.gamma0) * self.prior_weight

    def add(self, k: int, accepted: int) -> None:
        """One round that drafted k and kept `accepted` (< k: it ended in a rejection)."""
        if k <= 0:
            return
        self.accepted = self.decay * self.accepted + accepted
        self.rejected = self.decay * self.rejected + (1.0 if accepted < k else 0.0)

    @property
    def gamma(self) -> float:
        """argmax_γ Π γ^{A_n} (1 − γ)^{[A_n < K_n]}: the truncated geometric's MLE."""
        return self.accepted / (self.accepted + self.rejected)  # §IV-B geometric decay's γ


@dataclass
class AdaptiveK:
    """K* per round by eq. (11). `params`: a profile's α_edge, β, δ_cloud, T_base (None: fitted
    online); model: E[τ|K] ("geometric" default, or Alg. 2's "alg2"); mu: Alg. 2's EMA decay
    (model="alg2" only; the paper gives no value, 0.3 here); gamma0: Alg. 2's 0.8;
    inv_rate_prior: the link's E[1/R] in s/bit when known, worth `prior_rounds` measured rounds;
    k_min: 1 as in the paper, or 0 to let eq. (11) pick rounds with no drafts (E[τ|0] = 1).
    """

    params: FlexSpecParams | None = None
    model: str = "geometric"
    mu: float = 0.3
    gamma0: float = 0.8
    k_first: int = 4  # before anything is measured
    k_min: int = 1  # eq. (11)'s range starts here; 0 adds rounds that draft nothing (cloud-only)
    inv_rate_prior: float | None = None
    prior_rounds: float = 8.0
    decay: float = 0.9
    gamma_hat: float = field(init=False)
    acceptance: AcceptanceMLE = field(init=False)
    edge: _AffineEMA = field(default_factory=lambda: _AffineEMA("slope"))
    cloud: _AffineEMA = field(default_factory=lambda: _AffineEMA("intercept"))
    net: _AffineEMA = field(default_factory=lambda: _AffineEMA("intercept"))
    inv_rate: list[float] = field(default_factory=lambda: [0.0, 0.0])  # Σw/R_n, Σw
    bits: list[float] = field(default_factory=lambda: [0.0, 0.0])  # Σw·body bits, Σw·K
    header_bits: float = 0.0  # O_header, from the real frames
    rounds: int = 0
    primed: bool = False  # expect_rows gave the first round its priors
    history: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self.gamma_hat = self.gamma0  # Alg. 2: γ̂ ← 0.8
        self.acceptance = AcceptanceMLE(self.gamma0, decay=self.decay)
        if self.inv_rate_prior is not None:
            self.inv_rate = [self.prior_rounds * self.inv_rate_prior, self.prior_rounds]

    def expect_link(self, inv_rate: float) -> None:
        """Take a link condition's E[1/R] (s/bit) as the prior, unless one was given."""
        if self.inv_rate_prior is None:
            self.inv_rate_prior = inv_rate
            s, w = self.inv_rate
            self.inv_rate = [s + self.prior_rounds * inv_rate, w + self.prior_rounds]

    def expect_rows(self, bits_per_token: float, rtt_s: float, header_bits: float = 0.0) -> None:
        """Priors known before any round: the codec's fixed row size (raw: V x 32 bits), the
        link's round trip and the frame header, each worth one measured round. With them (and
        the link's E[1/R]) the first round is chosen by eq. (11) too, not `k_first`: raw's
        8.4 Mbit rows on a slow link make even K = 1 cost seconds before anything is learnt."""
        self.bits = [self.bits[0] + bits_per_token, self.bits[1] + 1.0]
        self.header_bits = header_bits
        self.net.add(0.0, rtt_s)
        self.primed = True

    @property
    def mean_inv_rate(self) -> float:
        """E[1/R] (s/bit): weighted mean of the measured 1/R_n and the prior; 0 if neither."""
        s, w = self.inv_rate
        return s / w if w > 0 else 0.0

    @property
    def bits_per_token(self) -> float:
        """b of eq. (8): the frames' body bits per drafted token (weighted over rounds)."""
        return self.bits[0] / self.bits[1] if self.bits[1] > 0 else 0.0

    def terms(self) -> tuple[float, float]:
        """(T_fixed, T_marginal) of eq. (10) in expectation over the fading: 1/R_n → E[1/R]."""
        if self.params is not None:
            alpha, beta = self.params.alpha_edge, self.params.beta
            t_base, delta = self.params.t_base, self.params.delta_cloud
        else:
            beta, alpha = self.edge.fit() or (0.0, 0.0)
            t_base, delta = self.cloud.fit() or (0.0, 0.0)
        net0, net1 = self.net.fit() or (0.0, 0.0)  # T_prop + T_down (+ per-token framing)
        inv_r = self.mean_inv_rate
        t_fixed = net0 + t_base + beta + self.header_bits * inv_r  # eq. (10) T_fixed
        t_marg = alpha + net1 + self.bits_per_token * inv_r + delta  # eq. (10) T_marginal(n)
        return t_fixed, t_marg

    def choose(self, k_max: int) -> int:
        """K*_n ∈ [k_min, k_max] by eq. (11) (k_first before the first round, unless
        `expect_rows` gave priors)."""
        if self.rounds == 0 and not self.primed:
            k = min(self.k_first, k_max)
        else:
            t_fixed, t_marg = self.terms()
            k = k_star(t_fixed, t_marg, self.gamma_hat, k_max, self.model, self.k_min)  # eq. (11)
        self.history.append({"k": k, "gamma_hat": self.gamma_hat})
        return k

    def update(
        self,
        *,
        k,
        accepted,
        bytes_up,
        bytes_down,
        rate_bps,
        draft_s,
        uplink_s,
        cloud_s,
        downlink_s,
        header_bytes=None,
    ) -> None:
        """Fold in one round: accepted length, R_n, frame sizes and measured times."""
        self.rounds += 1
        if self.model == "alg2":
            if k > 0:  # Alg. 2: EMA of the accepted fraction τ/K, what 1 + γ̂·K needs
                self.gamma_hat = ema_acceptance(self.gamma_hat, accepted, k, self.mu)
        else:
            self.acceptance.add(k, accepted)  # geometric model: the per-token γ's MLE
            self.gamma_hat = self.acceptance.gamma
        if header_bytes is not None:
            self.header_bits = 8.0 * header_bytes
            if k > 0:  # eq. (8): B_up(K) = K·b + O_header, b weighted over rounds
                self.bits = [self.decay * self.bits[0] + 8.0 * (bytes_up - header_bytes),
                             self.decay * self.bits[1] + k]  # fmt: skip
        inv_r = 0.0 if math.isinf(rate_bps) else 1.0 / rate_bps
        self.inv_rate = [self.inv_rate[0] + inv_r, self.inv_rate[1] + 1.0]  # E[1/R], no decay:
        # the rounds' gains are i.i.d. (block fading), so every round weighs the same
        serial = 8.0 * (bytes_up + bytes_down) * inv_r
        self.net.add(k, max(0.0, uplink_s + downlink_s - serial))
        self.edge.add(k, draft_s)
        self.cloud.add(k, cloud_s)
