"""Sampling and verification kernels: the rules, and NumPy == MLX for the same uniforms."""

import mlx.core as mx
import numpy as np
import pytest

from kernels import sampling as snp
from kernels import sampling_mlx as smx
from kernels import verify as vnp
from kernels import verify_mlx as vmx


@pytest.mark.parametrize(
    "temp,top_p,top_k", [(1.0, 1.0, 0), (0.7, 0.9, 0), (1.3, 1.0, 5), (0.0, 1.0, 0), (1.0, 0.5, 3)]
)
def test_probs_numpy_equals_mlx(temp, top_p, top_k):
    logits = np.random.default_rng(0).normal(0, 2, (6, 40)).astype(np.float32)
    a = snp.probs_from_logits(logits, temp, top_p, top_k)
    b = np.array(smx.probs_from_logits(mx.array(logits), temp, top_p, top_k))
    np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(a.sum(-1), 1, atol=1e-5)


def test_row_kernels_match_float64_on_wide_read_only_strided_rows(recwarn):
    """softmax and log-softmax run on PyTorch (kernels.topk_channel.rows_torch):
    read-only and strided inputs (a backend's output, a [:, -1] slice) give float64's values
    and no warning."""
    from kernels.topk_channel import log_softmax

    x = np.random.default_rng(8).normal(0, 3, (3, 2, 20_000)).astype(np.float32)
    x.flags.writeable = False
    rows = x[:, -1]
    z = rows.astype(np.float64) / 0.8
    ref = np.exp(z - z.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    np.testing.assert_allclose(snp.probs_from_logits(rows, 0.8), ref, rtol=1e-4, atol=1e-9)
    lse = np.log(np.exp(rows.astype(np.float64)).sum(-1))
    np.testing.assert_allclose(log_softmax(rows), rows - lse[:, None], atol=1e-4)
    assert not [w for w in recwarn if "writable" in str(w.message)]
    tails = rows.copy()
    tails[0, 500:], tails[1, 500:] = -np.inf, -1e4  # a padded row, and one whose tail underflows
    lse = np.log(np.exp(tails.astype(np.float64)).sum(-1))
    got = log_softmax(tails)[:, :500]
    np.testing.assert_allclose(got, tails[:, :500] - lse[:, None], atol=1e-4)


def test_top_p_keeps_smallest_set_reaching_mass():
    p = snp.probs_from_logits(np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32)), 1.0, top_p=0.8)
    np.testing.assert_allclose(p, [0.5 / 0.8, 0.3 / 0.8, 0, 0], atol=1e-6)
    p = snp.probs_from_logits(np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32)), 1.0, top_p=0.81)
    assert (p > 0).sum() == 3


def test_top_k_and_greedy():
    logits = np.array([1.0, 3.0, 2.0, 0.0], np.float32)
    assert (snp.probs_from_logits(logits, 1.0, top_k=2) > 0).tolist() == [False, True, True, False]
    np.testing.assert_array_equal(snp.probs_from_logits(logits, 0.0), [0, 1, 0, 0])


def test_sample_inverse_cdf_numpy_equals_mlx():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(30), size=50).astype(np.float32)
    p[:, 3] = 0  # zero-probability tokens are never chosen
    u = rng.random(50)
    a = snp.sample(p, u)
    b = np.array(smx.sample(mx.array(p), u))
    np.testing.assert_array_equal(a, b)
    assert (a != 3).all()
    assert (
        snp.sample(np.array([0.0, 1.0, 0.0]), 0.0) == 1
        and snp.sample(np.array([0.0, 1.0, 0.0]), 0.999) == 1
    )


def test_sample_over_a_real_vocabulary_follows_the_float64_inverse_cdf():
    """Rows wider than 8,192 tokens go by blocks (kernels.sampling._sample_blocks): the float64
    inverse CDF's token, up to rounding at a boundary, never a zero-mass one, at u near 0 and 1
    and with all the mass in the last block."""
    rng = np.random.default_rng(2)
    V = 151936
    p = snp.probs_from_logits((rng.standard_normal((8, V)) * 3).astype(np.float32), 1.0)
    p[:, ::3] = 0
    p[7, :-10] = 0  # all the mass in the last (partial) block
    p /= p.sum(-1, keepdims=True)
    c = np.cumsum(p.astype(np.float64), -1)
    same = 0
    for u in [*rng.random((40, 8)), np.zeros(8), np.full(8, 0.9999999)]:
        got = snp.sample(p, u)
        want = np.minimum((c <= u[:, None] * c[:, -1:]).sum(-1), V - 1)
        same += (got == want).sum()
        assert (p[np.arange(8), got] > 0).all()
    assert same >= 0.99 * 42 * 8
    assert snp.sample(p[7], 0.5).shape == () and p[7, int(snp.sample(p[7], 0.5))] > 0


def test_sample_by_blocks_keeps_the_law():
    """A chi-square test of the block sampler's draws against p; the negative control (the same
    draws against p shifted by one token) must fail."""
    from scipy.stats import chisquare

    rng = np.random.default_rng(3)
    p = np.zeros(9000, np.float32)
    support = rng.choice(9000, 12, replace=False)
    p[support] = rng.dirichlet(np.ones(12))
    rows = np.broadcast_to(p, (2000, 9000))  # 10 batches: a 20000-row batch is 720 MB
    draws = np.concatenate([snp.sample(rows, rng.random(2000)) for _ in range(10)])
    counts = np.bincount(draws, minlength=9000)[support]
    assert counts.sum() == 20000  # nothing outside the support
    law = p[support].astype(np.float64) / p[support].sum()
    assert chisquare(counts, 20000 * law).pvalue > 1e-3
    assert chisquare(counts, 20000 * np.roll(law, 1)).pvalue < 1e-3


@pytest.mark.parametrize("V", [4096, 9000])
def test_topk_message_is_the_stable_top_of_the_log_softmax(V):
    """eq. 7's message: the ids of the κ most likely tokens (ties: lower id first), from the
    logits without a full log-softmax, and their log-probs (bf16) as the log-softmax has them."""
    from kernels.topk_channel import from_bf16_bits, log_softmax, to_bf16_bits, topk_message

    logits = (np.random.default_rng(5).standard_normal((5, V)) * 3).astype(np.float32)
    logits[2, 10:20] = logits[2].max()  # ten tied maxima: the eight lowest ids
    ids, logp = topk_message(logits, 8)
    want = np.argsort(-logits, axis=-1, kind="stable")[:, :8]
    np.testing.assert_array_equal(ids, want)
    lp = np.take_along_axis(log_softmax(logits), want, -1)
    np.testing.assert_allclose(logp, from_bf16_bits(to_bf16_bits(lp)), atol=0.02)
    assert list(ids[2]) == list(range(10, 18))


def test_verify_greedy_patterns():
    logits = np.eye(10, dtype=np.float32)[[4, 5, 6, 7]]  # target argmax per position: 4 5 6 7
    assert vnp.verify_greedy(logits, np.array([4, 5, 6])) == (3, 7)  # all accepted + bonus
    assert vnp.verify_greedy(logits, np.array([4, 9, 6])) == (1, 5)  # correction at the first miss
    assert vnp.verify_greedy(logits, np.array([0, 5, 6])) == (0, 4)
    assert vnp.verify_greedy(logits[:1], np.array([], np.int64)) == (0, 4)
    for d in ([4, 5, 6], [4, 9, 6], [0, 5, 6]):
        assert vmx.verify_greedy(mx.array(logits), mx.array(d)) == vnp.verify_greedy(
            logits, np.array(d)
        )


def test_verify_sampling_numpy_equals_mlx():
    rng = np.random.default_rng(2)
    for _ in range(200):
        g = int(rng.integers(1, 6))
        p = rng.dirichlet(np.ones(12) * 0.5, size=g + 1).astype(np.float32)
        q = rng.dirichlet(np.ones(12) * 0.5, size=g).astype(np.float32)
        d = np.array([snp.sample(q[i], rng.random()) for i in range(g)])
        ua, ur = rng.random(g), rng.random()
        a = vnp.verify_sampling(p, q, d, ua, ur)
        b = vmx.verify_sampling(mx.array(p), mx.array(q), mx.array(d), ua, ur)
        assert a == b


def test_verify_sampling_rules():
    p = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], np.float32)
    q = np.array([[0.25, 0.75, 0.0]], np.float32)
    # d = 0: p/q = 2 >= 1, always accepted; bonus from p[1]
    assert vnp.verify_sampling(p, q, np.array([0]), np.array([0.99]), 0.0) == (1, 0)
    # d = 1: p/q = 2/3; u = 0.9 rejects; residual max(p - q, 0) = [0.25, 0, 0] -> token 0
    assert vnp.verify_sampling(p, q, np.array([1]), np.array([0.9]), 0.7) == (0, 0)
    assert vnp.verify_sampling(p, q, np.array([1]), np.array([0.5]), 0.7) == (1, 2)


def test_speculative_sampling_law_is_exact():
    """Enumerate the kernel's output law for γ = 1 by integrating over uniforms: equals p
    exactly."""
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(5), size=2).astype(np.float64)
    q = rng.dirichlet(np.ones(5), size=1).astype(np.float64)
    law = np.zeros(5)
    for d in range(5):  # P(first token = d accepted) + P(rejection) * residual
        law[d] += q[0, d] * min(1, p[0, d] / q[0, d])
    rej = 1 - law.sum()
    law += rej * np.maximum(p[0] - q[0], 0) / np.maximum(p[0] - q[0], 0).sum()
    np.testing.assert_allclose(law, p[0], atol=1e-12)
    # and the kernel implements that rule: Monte Carlo over its uniforms
    n, counts = 20000, np.zeros(5)
    for _ in range(n):
        d = snp.sample(q[0], rng.random())
        a, c = vnp.verify_sampling(
            p.astype(np.float32), q.astype(np.float32), np.array([d]), rng.random(1), rng.random()
        )
        counts[d if a == 1 else c] += 1
    assert np.abs(counts / n - p[0]).max() < 0.015
