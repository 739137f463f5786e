"""Latency models of the papers, as pure functions of numbers (seconds, bits, bytes, FLOPs).

  FlexSpec (flexspec.txt §IV-B, Alg. 2)  edge-cloud step time eq. (7)-(10), K* eq. (11),
                                          EMA acceptance
  Mirror-SD (mirror-sd.txt §3.4, App. C) overlapped step time eq. (10)/(14), vanilla SD, speedup S
  CU-HLM (cu-hlm.txt §II-B/C)             Shannon uplink time eq. (5), token throughput eq. (6)
  roofline                                a forward's time = max(bytes / bandwidth, FLOPs / peak)

Every function takes plain numbers (or a `ModelSize`) and returns seconds or a
count; none reads a profile or a clock. Profiles supply the numbers
(`devices.profile`), links supply rates and delays (`devices.links`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from devices.model_sizes import ModelSize

# ---------------------------------------------------------------------------
# FlexSpec: edge drafts K tokens, uplinks them, cloud verifies, downlinks the result.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FlexSpecParams:
    """The device and protocol constants of FlexSpec's latency model (seconds, bits)."""

    alpha_edge: float  # edge seconds per drafted token
    beta: float  # edge fixed seconds per round
    delta_cloud: float  # cloud seconds per extra verified token
    t_base: float  # cloud fixed seconds per verification
    bits_per_token: float = 15.0  # b: ceil(log2 32000), Llama-2's vocabulary (FlexSpec's target)
    header_bits: float = 320.0  # O_header: IPv4 (20 B) + TCP (20 B) headers, RFC 791 / RFC 793


def edge_time(k: int, alpha_edge: float, beta: float) -> float:
    """Edge drafting time, FlexSpec §IV-B: T_edge(K) ≈ α_edge·K + β."""
    return alpha_edge * k + beta  # FlexSpec §IV-B linear approximation of T_edge(K)


def uplink_time(
    k: int, rate_bps: float, t_prop: float, bits_per_token: float, header_bits: float
) -> float:
    """FlexSpec eq. (8): T_up(K, R_n) = T_prop + (K·b + O_header) / R_n."""
    return t_prop + (k * bits_per_token + header_bits) / rate_bps  # eq. (8)


def cloud_time(k: int, t_base: float, delta_cloud: float) -> float:
    """FlexSpec eq. (9): T_cloud(K) = T_base + K·δ_cloud."""
    return t_base + k * delta_cloud  # eq. (9)


def flexspec_step_time(k: int, p: FlexSpecParams, rate_bps: float, rtt_s: float) -> float:
    """FlexSpec eq. (7): T_step(K, R_n) = T_edge(K) + T_up(K, R_n) + T_cloud(K) + T_down.

    T_prop is half the round-trip time (§IV-B); T_down is the other half: the
    verification result is a few token ids, so its transmission time is the
    propagation delay alone.
    """
    t_prop = t_down = rtt_s / 2
    return (  # eq. (7)
        edge_time(k, p.alpha_edge, p.beta)
        + uplink_time(k, rate_bps, t_prop, p.bits_per_token, p.header_bits)
        + cloud_time(k, p.t_base, p.delta_cloud)
        + t_down
    )


def flexspec_terms(p: FlexSpecParams, rate_bps: float, rtt_s: float) -> tuple[float, float]:
    """FlexSpec eq. (10): T_step = T_fixed + K·T_marginal, returned as (T_fixed, T_marginal).

    T_fixed = T_prop + T_base + T_down + O_header/R_n + β;
    T_marginal(n) = α_edge + b/R_n + δ_cloud.
    """
    t_fixed = (
        rtt_s / 2 + p.t_base + rtt_s / 2 + p.header_bits / rate_bps + p.beta
    )  # eq. (10) T_fixed
    t_marginal = (
        p.alpha_edge + p.bits_per_token / rate_bps + p.delta_cloud
    )  # eq. (10) T_marginal(n)
    return t_fixed, t_marginal


def expected_accepted(k: int, gamma_hat: float, model: str = "alg2") -> float:
    """E[τ | K], the tokens one round commits.

    "alg2": FlexSpec Alg. 2's numerator 1 + γ̂·K (the EMA acceptance times K, plus
    the correction token). "geometric": FlexSpec §IV-B's geometric decay model,
    (1 − γ̂^(K+1)) / (1 − γ̂) (i.i.d. per-token acceptance γ̂, Leviathan et al.).
    """
    if model == "alg2":
        return 1.0 + gamma_hat * k  # Alg. 2: K* ← argmax (1 + γ̂K) / (...)
    if model == "geometric":
        if gamma_hat >= 1.0:
            return k + 1.0
        return (1.0 - gamma_hat ** (k + 1)) / (1.0 - gamma_hat)  # §IV-B geometric decay
    raise ValueError(f"unknown acceptance model {model!r}; use 'alg2' or 'geometric'")


def k_star(
    t_fixed: float,
    t_marginal: float,
    gamma_hat: float,
    k_max: int = 8,
    model: str = "alg2",
    k_min: int = 1,
) -> int:
    """FlexSpec eq. (11): K*_n = argmax_{K ∈ [1, K_max]} E[τ|K] / (T_fixed + K·T_marginal(n)).

    `k_min` 0 adds the round that drafts nothing (beyond the paper's range): the cloud's own
    token, E[τ|0] = 1 at cost T_fixed, so the edge stops drafting where drafting loses.

    Ties go to the smaller K (less work for the same rate). K* depends only on
    T_marginal / T_fixed; as R_n grows that ratio falls (so K* is non-decreasing
    in the rate) exactly when b·(T_prop + T_base + T_down + β) ≥ O_header·(α_edge + δ_cloud),
    i.e. unless the header, paid once per round, weighs more than the token bits.
    """
    best_k, best = k_min, -math.inf
    for k in range(k_min, k_max + 1):
        etgr = expected_accepted(k, gamma_hat, model) / (t_fixed + k * t_marginal)  # eq. (11)
        if etgr > best * (1 + 1e-12):
            best_k, best = k, etgr
    return best_k


def ema_acceptance(gamma_hat: float, accepted: int, k: int, mu: float) -> float:
    """FlexSpec Alg. 2 step 3: γ̂ ← (1 − μ)·γ̂ + μ·(τ / K*_n). Alg. 2 starts from γ̂ = 0.8."""
    return (1.0 - mu) * gamma_hat + mu * (accepted / k)  # Alg. 2, state update


# ---------------------------------------------------------------------------
# Mirror-SD: target prefix, early-exit rendezvous, overlapped suffix || draft, final rendezvous.
# ---------------------------------------------------------------------------


def target_range_time(c: list[float] | tuple[float, ...], start: int, stop: int) -> float:
    """Mirror-SD §3.4: T_target^{a:b} = Σ_{ℓ=a}^{b} c_ℓ (here 0-based layers [start, stop))."""
    return float(sum(c[start:stop]))  # §3.4, sum of per-layer times c_ℓ


def draft_gen_time(gamma: int, t_draft_step: float, eta_bar: float = 1.0) -> float:
    """Mirror-SD §3.2 / App. C: T_draft^gen(γ) = Σ_{j=1}^{J} (u_j + s_j), J = ⌈γ / η̄⌉.

    With a uniform internal step time `t_draft_step` = u + s and η̄ tokens per
    step (1 for an ordinary draft, more for speculative streaming).
    """
    return math.ceil(gamma / eta_bar) * t_draft_step  # App. C, J ≤ ⌈γ/η̄⌉ internal steps


def mirror_step_time(
    t_prefix: float, t_suffix: float, t_draft: float, t_rv_ee: float, t_rv_fv: float
) -> float:
    """Mirror-SD eq. (10) = (14):
    T_Mirror = T_target^{1:ℓe} + T_rv^(ee) + max{T_target^{ℓe+1:N}, T_draft^gen(γ)} + T_rv^(fv).
    """
    return t_prefix + t_rv_ee + max(t_suffix, t_draft) + t_rv_fv  # eq. (10)/(14)


def sd_step_time(t_target: float, t_draft: float) -> float:
    """Mirror-SD App. C, vanilla SD runs draft and target serially:
    T_SD = T_target + T_draft^gen(γ)."""
    return t_target + t_draft  # App. C, T_SD


def mirror_speedup(t_prefix: float, t_suffix: float, t_draft: float, t_rv: float) -> float:
    """Mirror-SD App. C per-step speedup S = T_SD / T_Mirror, with Δ = T_target^{ℓe+1:N}:

    S = (T_target + T_draft) / (T_target + T_rv)                     if T_draft ≤ Δ,
    S = (T_target^{1:ℓe} + Δ + T_draft) / (T_target^{1:ℓe} + T_draft + T_rv)  otherwise.
    """
    t_target = t_prefix + t_suffix
    if t_draft <= t_suffix:
        return (t_target + t_draft) / (t_target + t_rv)  # App. C, draft fully hidden
    return (t_prefix + t_suffix + t_draft) / (t_prefix + t_draft + t_rv)  # App. C, draft dominates


# ---------------------------------------------------------------------------
# CU-HLM: Shannon-rate uplink and per-token throughput.
# ---------------------------------------------------------------------------


def shannon_rate(bandwidth_hz: float, snr_linear: float) -> float:
    """Achievable rate W·log2(1 + SNR) in bit/s, the denominator of CU-HLM eq. (5)."""
    return bandwidth_hz * math.log2(1.0 + snr_linear)  # eq. (5) denominator


def hlm_uplink_time(payload_bits: float, bandwidth_hz: float, snr_linear: float) -> float:
    """CU-HLM eq. (5): τ(t) = B / (W·log2(1 + SNR(t))) seconds."""
    return payload_bits / shannon_rate(bandwidth_hz, snr_linear)  # eq. (5)


def hlm_throughput(t_slm: float, t_uplink: float, t_llm: float) -> float:
    """CU-HLM eq. (6): TP(t) = 1 / (τ_SLM + τ(t) + τ_LLM) tokens per second."""
    return 1.0 / (t_slm + t_uplink + t_llm)  # eq. (6)


# ---------------------------------------------------------------------------
# Roofline: a forward streams its weights (and KV) once and does 2 FLOPs per weight per token.
# ---------------------------------------------------------------------------


def roofline_time(n_bytes: float, flops: float, bandwidth: float, peak: float | None) -> float:
    """max(bytes / bandwidth, FLOPs / peak): memory-bound or compute-bound, whichever is slower.

    bandwidth in bytes/s, peak in FLOP/s (None: compute is not the limit we model).
    """
    t_mem = n_bytes / bandwidth
    return t_mem if not peak else max(t_mem, flops / peak)  # roofline


def window_time(
    m: ModelSize,
    n_tokens: int,
    bandwidth: float,
    peak: float | None,
    *,
    context: int = 0,
    layers: tuple[float, float] | None = None,
    head: bool = True,
    batch: int = 1,
) -> float:
    """Roofline time of one forward of `n_tokens` new positions over `context` cached ones.

    layers: run only decoder layers [start, stop) (default all; fractional
    bounds scale the layer share); head: include final norm + LM head; batch:
    rows (branches) sharing one pass over the weights. Per-token decode time is
    `window_time(m, 1, ...)`.
    """
    start, stop = layers if layers is not None else (0, m.num_layers)
    n_layers = stop - start
    # weights are streamed once per pass; KV and FLOPs scale with the rows
    n_bytes = n_layers * (m.layer_weight_bytes() + batch * m.kv_bytes_per_layer(context + n_tokens))
    flops = n_layers * batch * m.layer_flops(n_tokens, context)
    if head:
        n_bytes += m.head_weight_bytes()
        flops += batch * m.head_flops(n_tokens)
    return roofline_time(n_bytes, flops, bandwidth, peak)


def per_token_time(m: ModelSize, bandwidth: float, peak: float | None, context: int = 0) -> float:
    """Roofline decode time of one token (one full forward over a single position)."""
    return window_time(m, 1, bandwidth, peak, context=context)


def roofline_layer_params(
    m: ModelSize, bandwidth: float, peak: float | None
) -> tuple[float, float]:
    """(c_layer, c_layer_per_token): the affine per-layer time c(T) ≈ c0 + c1·T the roofline
    implies.

    c0 = one layer's weight bytes / bandwidth (the memory-bound floor);
    c1 = one layer's FLOPs per token / peak (the compute slope once compute-bound).
    """
    c0 = m.layer_weight_bytes() / bandwidth
    c1 = (2 * m.layer_params / peak) if peak else 0.0
    return c0, c1
