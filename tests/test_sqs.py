"""SQS-SD's edge rules: Alg. 2 quantization, K-SQS / C-SQS supports, eq. (1)-(5) bit costs,
the per-batch budget L^t, and C-SQS's conformal threshold (eq. 8, Alg. 1) meeting Theorem 2."""

import math

import numpy as np
import pytest

from kernels import sqs
from kernels.lattice import lattice_quantize, lattice_quantize_reference
from kernels.sampling import probs_from_logits, sample
from kernels.verify import verify_sampling


def test_lattice_quantize_matches_alg2_reference():
    rng = np.random.default_rng(0)
    for trial in range(300):
        k = int(rng.integers(1, 40))
        q = rng.dirichlet(np.full(k, float(rng.choice([0.05, 0.5, 5.0]))))
        if trial % 7 == 0:
            q = np.round(q * 8) / 8 + 1e-12  # exact ties in zeta
        ell = int(rng.choice([1, k, 10, 100, 1000]))
        b = lattice_quantize(q, ell)
        assert b.tolist() == lattice_quantize_reference(q, ell)
        assert b.sum() == ell and (b >= 0).all()
        # Teku et al.'s bound used in Theorem 1: TV(q~, q^) <= K / (4 ell)
        assert 0.5 * np.abs(b / ell - q / q.sum()).sum() <= k / (4 * ell) + 1e-12


def test_lattice_quantize_refuses_bad_input():
    for q, ell in [([], 10), ([0.0, 0.0], 10), ([0.5, -0.1], 10), ([0.5, 0.5], 0)]:
        with pytest.raises(ValueError):
            lattice_quantize(np.array(q), ell)


def test_supports_match_reference():
    rng = np.random.default_rng(1)
    for _ in range(100):
        v = int(rng.integers(2, 60))
        q = rng.dirichlet(np.full(v, 0.3))
        q[rng.integers(0, v)] = q.max()  # ties
        q /= q.sum()
        k = int(rng.integers(1, v + 1))
        assert sqs.topk_support(q, k).tolist() == sqs.topk_support_reference(q.tolist(), k)
        for beta in [-0.1, 0.0, 0.01, 0.2, 1.5]:
            got = sqs.threshold_support(q, beta).tolist()
            assert got == sqs.threshold_support_reference(q.tolist(), beta)
            assert math.isclose(
                sqs.dropped_mass(q, np.array(got)),
                q[[i for i in range(v) if i not in got]].sum(),
                abs_tol=1e-12,
            )


def test_bit_costs_follow_eq1_eq2_eq5():
    v, k, ell = 152_064, 8, 100
    assert sqs.ksqs_bits(v, k, ell) == math.ceil(math.log2(math.comb(v, k))) + math.ceil(
        math.log2(math.comb(ell + k - 1, k - 1))
    )
    assert sqs.csqs_bits(v, k, ell) == sqs.ksqs_bits(v, k, ell) + math.ceil(math.log2(v))
    assert sqs.ksqs_bits(v, 1, ell) == 18  # one token: its id, and a trivial lattice point


def test_batch_length_stops_when_budget_is_exhausted():
    assert sqs.batch_length([100, 200, 300, 400], 600) == 3
    assert sqs.batch_length([100, 200, 300, 400], 599) == 2
    assert sqs.batch_length([100, 200], 10_000) == 2
    assert sqs.batch_length([700], 600) == 0  # max over N_0 (§4) may be 0


def test_conformal_threshold_backtracks_to_last_kept_token():
    ct = sqs.ConformalThreshold(alpha=0.05, eta=0.5, beta=0.15)
    q = np.array([0.7, 0.2, 0.1])
    betas = []
    for _ in range(4):
        betas.append(ct.beta)
        ct.support(q)  # eq. (8) moves beta after every drafted token
    assert len(set(betas)) > 1
    ct.verdict(accepted=1)  # token 1 accepted, token 2 rejected: keep 2 updates, drop 2
    assert ct.beta == betas[2] and ct.kept == 2
    ct.support(q)
    ct.support(q)
    after = ct.beta
    ct.verdict(accepted=2)  # all accepted, no bonus distribution: nothing to rewind
    assert ct.beta == after and ct.kept == 4
    with pytest.raises(ValueError):
        ct.verdict(accepted=1)  # nothing was drafted since


def _simulated_run(alpha, eta, beta1, temp, n_batches, seed, v=64, gamma=4, ell=100):
    """A C-SQS session over synthetic contexts: the draft samples from q^, the target verifies."""
    rng = np.random.default_rng(seed)
    ct = sqs.ConformalThreshold(alpha=alpha, eta=eta, beta=beta1)
    rejections = 0
    for _ in range(n_batches):
        base = rng.normal(0, 3, v)
        qs = probs_from_logits(base + rng.normal(0, 1, (gamma, v)), temp)
        ps = probs_from_logits(base + rng.normal(0, 1, (gamma + 1, v)), temp)
        qhat, toks = [], []
        for q in qs:
            ids = ct.support(q)
            qh = sqs.dense_qhat(ids, sqs.quantize_on_support(q, ids, ell), ell, v)
            qhat.append(qh)
            toks.append(int(sample(qh, rng.random())))
        a, _ = verify_sampling(ps, np.stack(qhat), np.array(toks), rng.random(gamma), rng.random())
        rejections += a < gamma
        ct.verdict(a, q_bonus=probs_from_logits(base, temp) if a == gamma else None)
    return ct, rejections


@pytest.mark.parametrize(
    "alpha,eta,beta1,temp",
    [(0.05, 0.05, 0.1, 1.0), (0.0005, 0.001, 0.01, 0.8), (0.2, 0.5, 0.5, 0.3)],
)
def test_theorem2_bound_holds_on_a_simulated_run(alpha, eta, beta1, temp):
    ct, _ = _simulated_run(alpha, eta, beta1, temp, n_batches=150, seed=3)
    t = ct.kept
    # Lemma 2: the kept updates telescope exactly
    assert math.isclose(
        ct.dropped_sum, alpha * t + (beta1 - ct.beta) / eta, rel_tol=1e-9, abs_tol=1e-9
    )
    assert ct.dropped_sum / t <= sqs.theorem2_bound(alpha, eta, beta1, t)  # eq. (9)
    assert -eta * (1 - alpha) - 1e-12 <= ct.beta  # Lemma 4's lower envelope
