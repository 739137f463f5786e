"""devices.kstar: the acceptance estimator, E[1/R] of a fading link, and K* = the argmin of the
true expected latency per token on synthetic rounds (FlexSpec eq. (7)-(11)). No I/O, no timing."""

from __future__ import annotations

import numpy as np
import pytest

from devices.kstar import AcceptanceMLE, AdaptiveK
from devices.latency import expected_accepted
from devices.links import LINKS


def _truncated_geometric(rng, gamma, k):
    a = 0
    while a < k and rng.random() < gamma:
        a += 1
    return a


@pytest.mark.parametrize("gamma", [0.3, 0.65, 0.9])
def test_mle_recovers_the_per_token_acceptance_where_the_mean_of_a_over_k_does_not(gamma):
    rng = np.random.default_rng(1)
    est = AcceptanceMLE(decay=1.0)
    fractions = []
    for i in range(4000):
        k = 1 + i % 8
        a = _truncated_geometric(rng, gamma, k)
        est.add(k, a)
        fractions.append(a / k)
    assert abs(est.gamma - gamma) < 0.02
    assert np.mean(fractions) < gamma - 0.08  # Alg. 2's A/K: the accepted fraction, biased low


def test_mle_starts_at_alg2_prior_and_ignores_empty_rounds():
    est = AcceptanceMLE()
    assert est.gamma == pytest.approx(0.8)
    est.add(0, 0)
    assert est.gamma == pytest.approx(0.8)
    est.add(4, 4)  # no rejection: only evidence for γ
    assert est.gamma > 0.8


def test_alg2_model_keeps_its_ema_of_the_accepted_fraction():
    ctl = AdaptiveK(model="alg2", mu=0.5)
    ctl.choose(8)
    ctl.update(
        k=4,
        accepted=1,
        bytes_up=40,
        bytes_down=30,
        rate_bps=1e6,
        draft_s=0.01,
        uplink_s=0.1,
        cloud_s=0.02,
        downlink_s=0.1,
        header_bytes=24,
    )
    assert ctl.gamma_hat == pytest.approx(0.5 * 0.8 + 0.5 * 0.25)


@pytest.mark.parametrize("name", ["5g", "4g", "wifi-weak"])
def test_mean_inverse_rate_matches_the_sampled_fading(name):
    link = LINKS[name]
    rng = np.random.default_rng(7)
    mc = np.mean([1.0 / link.sample_rate(rng) for _ in range(20000)])
    assert link.mean_inverse_rate() == pytest.approx(mc, rel=0.05)
    assert link.mean_inverse_rate() >= 1.0 / link.rate_bps  # Jensen: fading costs time


# A synthetic edge-cloud round: eq. (7) with eq. (8)'s bits / R_n, eq. (9)'s cloud line and the
# linear edge time; the rates alternate (two fading states), so E[1/R] is their mean inverse.
SCENARIOS = [  # rtt, alpha, beta, t_base, delta, net per token, bytes/token, rates, accepted
    (1.2, 0.018, 0.02, 0.05, 0.007, 0.003, 580, (2e5, 1e7), 2),  # K* 6
    (1.2, 0.018, 0.02, 0.05, 0.007, 0.003, 580, (2e5, 1e7), 4),  # K* 8
    (0.4, 0.002, 0.0, 0.02, 0.0005, 0.0, 2, (3e8, 3e8), 5),  # K* 8
    (0.2, 0.002, 0.0, 0.02, 0.0005, 0.0, 131072, (1e6, 1e8), 3),  # K* 1
    (0.6, 0.02, 0.01, 0.05, 0.007, 0.002, 32000, (2e6, 5e7), 1),  # K* 2
]


def _true_ms_per_token(k, rtt, alpha, beta, t_base, delta, net1, bpt, rates, gamma, head=24):
    inv_r = np.mean([1.0 / r for r in rates])
    t = rtt + beta + alpha * k + t_base + delta * k + net1 * k + 8 * (head + bpt * k + 30) * inv_r
    return t / expected_accepted(k, gamma, "geometric")  # eq. (2): seconds per token


@pytest.mark.parametrize("sc", SCENARIOS)
def test_k_star_is_the_argmin_of_the_true_expected_latency(sc):
    rtt, alpha, beta, t_base, delta, net1, bpt, rates, accepted = sc
    ctl = AdaptiveK()
    for i in range(80):  # A accepted then a rejection, every round: the MLE is A / (A + 1)
        ctl.choose(8)
        k = accepted + 1 + i % 3  # K varies so the lines in K can be fitted
        r = rates[i % 2]
        up, down = 24 + bpt * k, 30
        ctl.update(
            k=k,
            accepted=accepted,
            bytes_up=up,
            bytes_down=down,
            rate_bps=r,
            draft_s=beta + alpha * k,
            uplink_s=rtt / 2 + 8 * up / r,
            cloud_s=t_base + delta * k,
            downlink_s=rtt / 2 + 8 * down / r + net1 * k,
            header_bytes=24,
        )
    g = accepted / (accepted + 1)
    assert ctl.gamma_hat == pytest.approx(g, abs=1e-3)
    cost = {
        k: _true_ms_per_token(k, rtt, alpha, beta, t_base, delta, net1, bpt, rates, g)
        for k in range(1, 9)
    }
    assert ctl.choose(8) == min(cost, key=cost.get)


def test_expected_rate_not_last_rate_sets_k():
    """A large payload over a link that alternates between a deep fade and a good state: the
    last (good) rate alone would call for a long window; E[1/R] calls for a short one."""
    ctl = AdaptiveK()
    for i in range(40):
        ctl.choose(8)
        r = (1e5, 1e8)[i % 2]
        up = 24 + 20000 * 3
        ctl.update(
            k=3,
            accepted=2,
            bytes_up=up,
            bytes_down=30,
            rate_bps=r,
            draft_s=0.03,
            uplink_s=0.3 + 8 * up / r,
            cloud_s=0.05,
            downlink_s=0.3 + 240 / r,
            header_bytes=24,
        )
    assert ctl.mean_inv_rate == pytest.approx((1e-5 + 1e-8) / 2)
    assert ctl.choose(8) == 1
    ctl.inv_rate = [1e-8, 1.0]  # as if only the last (good) round counted
    assert ctl.choose(8) >= 4


def test_link_prior_counts_until_rounds_outweigh_it():
    ctl = AdaptiveK()
    ctl.expect_link(LINKS["wifi-weak"].mean_inverse_rate())
    ctl.expect_link(1.0)  # a prior is taken once
    assert ctl.mean_inv_rate == pytest.approx(LINKS["wifi-weak"].mean_inverse_rate())
