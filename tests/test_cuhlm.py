"""CU-HLM's kernels: uncertainty (eq. 8-9), skip rule (eq. 10) and u_th (eq. 12), the fit of
eq. (7), 8-bit top-k compression with eq. (15)'s residual, and k* offline (eq. 21) / online
(eq. 24)."""

import math

import numpy as np
import pytest

from kernels import cuhlm
from kernels.sampling import probs_from_logits


def test_uncertainty_matches_reference_and_limits():
    rng = np.random.default_rng(0)
    for _ in range(30):
        z = rng.normal(0, 3, 40)
        th = cuhlm.perturbation_temperatures(rng, 16, 2.0)
        th[0] = 0.0  # the greedy end of U[0, theta_max]
        u = rng.random(16)
        d = int(rng.integers(0, 40))
        assert cuhlm.uncertainty(z, d, th, u) == cuhlm.uncertainty_reference(z, d, th, u)
    z = np.array([10.0, 0.0, 0.0])
    assert cuhlm.uncertainty(z, 0, np.full(8, 0.5), rng.random(8)) == 0.0  # confident: all agree
    assert cuhlm.uncertainty(z, 1, np.zeros(4), rng.random(4)) == 1.0  # a non-argmax draft


def test_skip_rule_and_thresholds():
    a, b, delta = 0.815, -0.066, 0.5956  # the paper's fit and Delta (§III-C)
    assert math.isclose(cuhlm.uncertainty_threshold(a, b, delta), 0.8117, abs_tol=5e-4)  # eq. (12)
    assert math.isclose(cuhlm.risk_averse_threshold(a, b), 0.0810, abs_tol=5e-4)
    assert cuhlm.transmit(0.9, 0.8117) and not cuhlm.transmit(
        0.8117, 0.8117
    )  # eq. (10): skip at u <= u_th
    u = np.array([0.0, 0.05, 0.1, 0.5, 0.9])
    # R = E[(a u + b) 1(-b/a < u <= u_th)]: only 0.1 and 0.5 are inside
    assert math.isclose(cuhlm.rejection_risk(u, a, b, 0.8117), ((a * 0.1 + b) + (a * 0.5 + b)) / 5)


def test_linear_fit_matches_closed_form():
    rng = np.random.default_rng(1)
    u = rng.random(200)
    beta = 0.8 * u - 0.07 + rng.normal(0, 0.05, 200)
    fit = cuhlm.fit_linear(u, beta)
    a, b = cuhlm.fit_linear_reference(u.tolist(), beta.tolist())
    assert math.isclose(fit.a, a, rel_tol=1e-9) and math.isclose(
        fit.b, b, rel_tol=1e-9, abs_tol=1e-12
    )
    assert 0.9 < fit.r < 1 and math.isclose(fit.r**2, fit.r2, rel_tol=1e-9)
    with pytest.raises(ValueError):
        cuhlm.fit_linear([0.5, 0.5], [0.1, 0.2])


def test_u8_quantization_and_reconstruction():
    rng = np.random.default_rng(2)
    for _ in range(200):
        x = rng.dirichlet(np.full(30, 0.2))
        k = int(rng.integers(1, 30))
        ids = cuhlm.topk_ids(x, k)
        assert x[ids].tolist() == sorted(x[ids], reverse=True)
        lv = cuhlm.quantize_probs_u8(x[ids])
        assert lv.tolist() == cuhlm.quantize_probs_u8_reference(x[ids])
        assert int(lv.sum()) <= 255 and (np.abs(lv / 255 - x[ids]) <= 1 / 255 + 1e-12).all()
        xh = cuhlm.reconstruct(ids, lv, 30)
        assert math.isclose(float(xh.astype(np.float64).sum()), 1.0, abs_tol=1e-6)
        rest = np.setdiff1d(np.arange(30), ids)
        assert np.ptp(xh[rest]) == 0  # eq. (15): the residual is uniform
    with pytest.raises(ValueError):
        cuhlm.topk_ids(np.full(5, 0.2), 5)  # k = V leaves no residual


def test_log_quantization_matches_reference_and_keeps_sum():
    """Log levels (v -> 2^(-16 v / 255), 255 = no mass): the fast quantizer equals its plain twin,
    every sent p is within one rounding step of x (or x < 2^-16 and dropped), the sum never
    passes 1, and the lowering pass really runs (peaked rows whose top-k holds almost all mass)."""
    rng = np.random.default_rng(5)
    step = 2.0 ** (cuhlm.LOG_SPAN / cuhlm.PROB_LEVELS)  # one level: a factor 2^(16/255)
    lowered = 0
    for n in range(400):
        alpha = (0.02, 0.2, 1.0)[n % 3]
        x = rng.dirichlet(np.full(30, alpha))
        k = int(rng.integers(1, 30))
        ids = cuhlm.topk_ids(x, k)
        lv = cuhlm.quantize_probs_log(x[ids])
        assert lv.dtype == np.uint8 and lv.tolist() == cuhlm.quantize_probs_log_reference(x[ids])
        sent = cuhlm.dequantize(lv, "log")
        assert math.fsum(sent.tolist()) <= 1.0
        kept = lv < cuhlm.LOG_NONE
        assert (
            sent[kept] <= x[ids][kept] * step**0.5 * (1 + 1e-12)
        ).all()  # never over half a level
        assert (sent[kept] >= x[ids][kept] / step**1.5 * (1 - 1e-12)).all()  # at most one lowering
        assert (x[ids][~kept] < 2.0**-cuhlm.LOG_SPAN * step**0.5).all()  # dropped: below the range
        with np.errstate(divide="ignore"):  # x = 0 -> level 255
            t = -np.log2(x[ids]) * cuhlm.PROB_LEVELS / cuhlm.LOG_SPAN
        nearest = np.minimum(np.floor(t + 0.5), 255)
        lowered += int((lv != nearest).any())
        xh = cuhlm.reconstruct(ids, lv, 30, "log")
        assert math.isclose(float(xh.astype(np.float64).sum()), 1.0, abs_tol=1e-6)
        rest = np.setdiff1d(np.arange(30), ids)
        assert np.ptp(xh[rest]) == 0  # eq. (15): the residual is uniform
    assert lowered > 0, "no row needed the lowering pass: the test does not cover it"
    assert cuhlm.quantize_probs_log(np.array([1.0, 0.0])).tolist() == [0, 255]
    assert cuhlm.quantize_probs_log_reference([1.0, 0.0]) == [0, 255]
    assert cuhlm.LOG_TABLE[0] == 1.0 and cuhlm.LOG_TABLE[255] == 0.0
    with pytest.raises(ValueError, match="levels"):
        cuhlm.quantize_levels(np.array([0.5]), "cubic")


def test_log_levels_beat_linear_on_small_probabilities():
    """At T = 1 most top-k probabilities are below 1/255: linear levels send them as 0 or 1/255,
    log levels within a factor 2^(1/32); the TV distance to x shrinks accordingly."""
    rng = np.random.default_rng(6)
    x = probs_from_logits(rng.normal(0, 1.5, 2000), 1.0)
    ids = cuhlm.topk_ids(x, 256)
    tv = {
        s: 0.5 * np.abs(cuhlm.reconstruct(ids, cuhlm.quantize_levels(x[ids], s), 2000, s) - x).sum()
        for s in cuhlm.LEVELS
    }
    assert tv["log"] < 0.5 * tv["linear"], tv


def test_residual_deviation_matches_reference():
    rng = np.random.default_rng(3)
    for alpha in [0.05, 1.0, 20.0]:
        x = rng.dirichlet(np.full(60, alpha))
        np.testing.assert_allclose(
            cuhlm.residual_deviation(x), cuhlm.residual_deviation_reference(x), atol=1e-12
        )


def test_k_offline_and_online():
    rng = np.random.default_rng(4)
    base = rng.normal(0, 3, (20, 200))
    xs = probs_from_logits(base, 1.0)
    ys = probs_from_logits(base + rng.normal(0, 1, base.shape), 1.0)
    ks = [cuhlm.k_offline(xs, ys, th) for th in (0.5, 0.1, 0.02)]
    assert ks == sorted(ks) and ks[0] < ks[-1]  # tighter tolerance, larger k*
    mean = np.mean([cuhlm.utv_offline(x, y) for x, y in zip(xs, ys, strict=True)], axis=0)
    k = ks[1]
    assert mean[k - 1] <= 0.1 and (k == 1 or mean[k - 2] > 0.1)  # eq. (21): the smallest such k
    x = xs[0]
    d = int(np.argmax(x))
    lo = cuhlm.k_online(x, x[d], u=0.0, a=0.8, b=-0.07, theta=0.1)
    hi = cuhlm.k_online(x, x[d], u=1.0, a=0.8, b=-0.07, theta=0.1)
    assert lo <= hi  # eq. (24): k(t)* grows with uncertainty
    assert math.isclose(cuhlm.softplus(0.0, 10.0), math.log(2) / 10)
