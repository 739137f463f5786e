"""The latency models: fits recover parameters, K* is the brute-force argmax and grows with rate."""

import math

import numpy as np
import pytest

from devices import latency as L
from devices.fit import fit_linear
from devices.links import A800_T_BASE_S, LINKS, fading_gain, get_link
from devices.model_sizes import CARD_PARAMS, model_size, preset_names
from devices.profile import load_profile


def test_fit_recovers_known_parameters_from_noisy_timings():
    rng = np.random.default_rng(0)
    alpha, beta = 0.0123, 0.0041
    k = np.repeat(np.arange(1, 9), 5)
    t = alpha * k + beta + rng.normal(0, 2e-4, k.size)  # T_edge(K) = alpha K + beta + jitter
    f = fit_linear(k, t)
    assert f.slope == pytest.approx(alpha, rel=0.02)
    assert f.intercept == pytest.approx(beta, abs=5e-4)
    assert 0.99 < f.r2 <= 1.0


def test_fit_clamps_negative_coefficients_and_rejects_degenerate_input():
    f = fit_linear([1, 2, 3], [3.0, 2.0, 1.0])
    assert f.slope == 0.0 and f.intercept == pytest.approx(2.0)
    with pytest.raises(ValueError):
        fit_linear([2, 2], [1.0, 2.0])


def _brute(t_fixed, t_marg, g, k_max, model):
    vals = [L.expected_accepted(k, g, model) / (t_fixed + k * t_marg) for k in range(1, k_max + 1)]
    return int(np.argmax(vals)) + 1


def _k_stars(p, rtt, g, model, rates):
    out = []
    for rate in rates:
        tf, tm = L.flexspec_terms(p, rate, rtt_s=rtt)
        k = L.k_star(tf, tm, g, k_max=12, model=model)
        assert k == _brute(tf, tm, g, 12, model)
        out.append(k)
    return out


RATES = np.geomspace(30.0, 3e8, 40)  # from a dead link to 5G


@pytest.mark.parametrize("model", ["alg2", "geometric"])
@pytest.mark.parametrize("header_bits", [0.0, 320.0])
def test_k_star_is_brute_force_argmax_and_non_decreasing_in_rate(model, header_bits):
    # b·(T_prop + T_base + T_down + β) >= O_header·(α_edge + δ_cloud): see latency.k_star
    p = L.FlexSpecParams(
        alpha_edge=0.002, beta=0.002, delta_cloud=0.0005, t_base=0.03, header_bits=header_bits
    )
    for g in (0.3, 0.6, 0.8, 0.95):
        ks = _k_stars(p, 0.05, g, model, RATES)
        assert ks == sorted(ks), (g, ks)
        assert ks[-1] > 1  # a fast link lets it speculate


def test_k_star_monotone_on_shipped_profile_and_the_condition_is_tight():
    prof = load_profile("a17-pro")
    p = L.FlexSpecParams(*(prof.param(k) for k in ("alpha_edge", "beta", "delta_cloud", "t_base")))
    for link in LINKS.values():
        ks = _k_stars(p, link.rtt_s, 0.6, "geometric", RATES)
        assert ks == sorted(ks)
    # headers that outweigh the per-token bits break monotonicity (b·A < O·m): documented, not a bug
    p = L.FlexSpecParams(alpha_edge=0.012, beta=0.002, delta_cloud=0.001, t_base=0.03)
    ks = _k_stars(p, 0.05, 0.3, "geometric", RATES)
    assert ks != sorted(ks)


def test_step_time_is_eq7_and_eq10_agrees():
    p = L.FlexSpecParams(alpha_edge=0.01, beta=0.003, delta_cloud=0.0005, t_base=0.02)
    for k in (1, 4, 9):
        t7 = L.flexspec_step_time(k, p, 1e4, 0.1)
        tf, tm = L.flexspec_terms(p, 1e4, 0.1)
        assert t7 == pytest.approx(tf + k * tm)
        by_hand = (0.01 * k + 0.003) + (0.05 + (k * 15 + 320) / 1e4) + (0.02 + 0.0005 * k) + 0.05
        assert t7 == pytest.approx(by_hand)


def test_ema_acceptance_alg2():
    g = 0.8
    g = L.ema_acceptance(g, accepted=2, k=4, mu=0.25)
    assert g == pytest.approx(0.75 * 0.8 + 0.25 * 0.5)


def test_mirror_step_time_and_speedup():
    # draft hidden under the suffix: T = T_target + T_rv
    assert L.mirror_step_time(0.01, 0.03, 0.02, 1e-4, 2e-4) == pytest.approx(0.04 + 3e-4)
    # draft dominates the parallel region
    assert L.mirror_step_time(0.01, 0.03, 0.05, 1e-4, 2e-4) == pytest.approx(0.06 + 3e-4)
    for t_draft in (0.02, 0.05):
        s = L.mirror_speedup(0.01, 0.03, t_draft, 3e-4)
        t_sd = L.sd_step_time(0.04, t_draft)
        assert s == pytest.approx(t_sd / L.mirror_step_time(0.01, 0.03, t_draft, 1e-4, 2e-4))
    assert L.target_range_time([1.0, 2.0, 3.0, 4.0], 1, 3) == 5.0
    assert L.draft_gen_time(7, 0.002, eta_bar=3) == pytest.approx(0.006)


def test_cu_hlm_throughput():
    # CU-HLM §I/§V: a 92 kB full-vocabulary payload (eq. 4, |V| = 32000, 8 + 15 bits) at W = 10 MHz
    up = L.hlm_uplink_time(32000 * (8 + 15), 10e6, 10.0)  # 10 dB, no fade: 21 ms
    assert up == pytest.approx(32000 * 23 / (10e6 * math.log2(11)))
    assert L.hlm_throughput(0.0256, up, 0.1046) == pytest.approx(1 / (0.0256 + up + 0.1046))
    # a Rayleigh fade to a tenth of the mean SNR is what drops it below CU-HLM's "fewer than
    # 5 tokens/s"
    assert L.hlm_throughput(0.0256, L.hlm_uplink_time(32000 * 23, 10e6, 1.0), 0.1046) < 5


def test_roofline_memory_vs_compute_bound():
    m = model_size("qwen3-8b")
    bw, peak = 400e9, 13e12
    t1 = L.per_token_time(m, bw, peak)
    assert t1 == pytest.approx(m.weight_bytes() / bw, rel=0.01)  # decode is memory-bound
    t_big = L.window_time(m, 4096, bw, peak)
    assert t_big > 100 * t1  # a long prefill is compute-bound
    half = L.window_time(m, 1, bw, peak, layers=(0, m.num_layers / 2), head=False)
    assert half == pytest.approx(L.window_time(m, 1, bw, peak, head=False) / 2)


def test_model_sizes_match_model_cards():
    for name in preset_names():
        assert model_size(name).params == pytest.approx(CARD_PARAMS[name], rel=0.02), name
    assert model_size("qwen3-8b@4").weight_bytes() == pytest.approx(
        model_size("qwen3-8b").weight_bytes() / 4
    )


def test_links_are_sourced_and_rtt_matches_the_a800_profile():
    assert load_profile("a800").param("t_base") == pytest.approx(A800_T_BASE_S, rel=1e-3)
    for name, link in LINKS.items():
        assert link is get_link(name)
        assert {"rate_bps", "rtt_s", "mean_snr_db", "fading"} <= set(link.sources)
    assert LINKS["5g"].rate_bps > LINKS["4g"].rate_bps > LINKS["wifi-weak"].rate_bps
    assert LINKS["5g"].rtt_s < LINKS["4g"].rtt_s < LINKS["wifi-weak"].rtt_s


def test_fading_gain_has_unit_mean_and_rate_at_mean_snr_is_nominal():
    rng = np.random.default_rng(0)
    for fading, k in (("rayleigh", None), ("rician", 10.0)):
        g = [fading_gain(rng, fading, k) for _ in range(4000)]
        assert np.mean(g) == pytest.approx(1.0, abs=0.06)
    link = LINKS["4g"]
    assert L.shannon_rate(link.bandwidth_hz, 10 ** (link.mean_snr_db / 10)) == pytest.approx(
        link.rate_bps
    )
    assert link.sample_rate(rng) > 0
