"""FlexSpec's channel-aware draft length (flexspec.txt §IV-B eq. (10)-(11), Alg. 2), online.

`AdaptiveK` is the edge client's K controller: before a round, `choose(k_max)` returns
K* = argmax E[τ|K] / (T_fixed + K·T_marginal) (eq. (11)) from what it has measured; after a
round, `update(...)` folds in the round's acceptance (EMA, Alg. 2), the link rate R_n the round
saw, the real frame bytes and the measured edge, cloud and network times. E[τ|K] defaults to
the bounded geometric model (1 − γ̂^{K+1}) / (1 − γ̂); Alg. 2's unbounded 1 + γ̂·K is available
as model="alg2" (with it K* = K_max whenever the round trip dominates).

Without profile parameters, α_edge/β and T_base/δ_cloud are fitted online by exponentially
weighted least squares of the measured draft and verify times on K. It does no I/O.
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
class AdaptiveK:
    """K* per round by eq. (11). `params`: a profile's α_edge, β, δ_cloud, T_base (None: fitted
    online); mu: Alg. 2's EMA decay (the paper gives no value; 0.3 here); gamma0: Alg. 2's 0.8."""

    params: FlexSpecParams | None = None
    model: str = "geometric"
    mu: float = 0.3
    gamma0: float = 0.8
    k_first: int = 4  # before anything is measured
    gamma_hat: float = field(init=False)
    edge: _AffineEMA = field(default_factory=lambda: _AffineEMA("slope"))
    cloud: _AffineEMA = field(default_factory=lambda: _AffineEMA("intercept"))
    net_s: float | None = None  # EMA of the round's network time beyond serialization
    rate_bps: float = math.inf  # R_n of the last round
    bits_per_token: float = 0.0  # b, from the real frames
    header_bits: float = 0.0  # O_header, from the real frames
    history: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self.gamma_hat = self.gamma0  # Alg. 2: γ̂ ← 0.8

    def terms(self) -> tuple[float, float]:
        """(T_fixed, T_marginal) of eq. (10) from the current estimates."""
        if self.params is not None:
            alpha, beta = self.params.alpha_edge, self.params.beta
            t_base, delta = self.params.t_base, self.params.delta_cloud
        else:
            beta, alpha = self.edge.fit() or (0.0, 0.0)
            t_base, delta = self.cloud.fit() or (0.0, 0.0)
        r = self.rate_bps
        t_fixed = (self.net_s or 0.0) + t_base + beta + self.header_bits / r  # eq. (10) T_fixed
        t_marg = alpha + self.bits_per_token / r + delta  # eq. (10) T_marginal(n)
        return t_fixed, t_marg

    def choose(self, k_max: int) -> int:
        """K*_n ∈ [1, k_max] by eq. (11) (k_first before the first round)."""
        if self.net_s is None:
            k = min(self.k_first, k_max)
        else:
            t_fixed, t_marg = self.terms()
            k = k_star(t_fixed, t_marg, self.gamma_hat, k_max, self.model)  # eq. (11)
        self.history.append({"k": k, "gamma_hat": self.gamma_hat})
        return k

    def update(self, *, k, accepted, bytes_up, bytes_down, rate_bps, draft_s, uplink_s, cloud_s,
               downlink_s, header_bytes=None) -> None:  # fmt: skip
        """Fold in one round: acceptance (Alg. 2 EMA), R_n, frame sizes and measured times."""
        if k > 0:
            self.gamma_hat = ema_acceptance(self.gamma_hat, accepted, k, self.mu)  # Alg. 2
        self.rate_bps = rate_bps
        if header_bytes is not None:
            self.header_bits = 8.0 * header_bytes
            if k > 0:
                self.bits_per_token = 8.0 * (bytes_up - header_bytes) / k
        serial = 8.0 * (bytes_up + bytes_down) / rate_bps
        net = max(0.0, uplink_s + downlink_s - serial)
        self.net_s = net if self.net_s is None else 0.7 * self.net_s + 0.3 * net
        self.edge.add(k, draft_s)
        self.cloud.add(k, cloud_s)
