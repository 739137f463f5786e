"""Lossless at kernel level: with the draft token drawn from the *decoded* q^ of each codec and
rejection sampling (kernels/verify.py) against the target p with that q^, the committed token's
law is exactly p. Chi-square goodness of fit (tests/test_sampling_gof.py's pattern), each with a
negative control that must fail: verification with the unquantized q while the token came from
q^."""

import numpy as np
import pytest
from scipy.stats import chisquare

from kernels.payloads import decode, make_codec
from kernels.sampling import sample
from kernels.verify import verify_sampling

V = 8
N = 1500  # the negative controls fail at p < 1e-10 with this many (measured: < 1e-30 at 4000)
ALPHA = 1e-3
P = np.array([0.05, 0.30, 0.10, 0.02, 0.25, 0.08, 0.15, 0.05])  # target
Q = np.array([0.35, 0.30, 0.20, 0.10, 0.03, 0.01, 0.005, 0.005])  # draft: tail far from uniform
PARAMS = {
    "k-sqs": dict(k=3, ell=10),
    "c-sqs": dict(ell=12, alpha=0.2, eta=0.05, beta=0.1),  # beta moves on every row
    "cu-hlm": dict(k=2),  # log levels (the default, payload version 3)
    "cu-hlm/linear": dict(k=2, levels="linear"),  # v / 255 levels (version 1)
}


def committed_counts(name, verify_with_q, seed):
    rng = np.random.default_rng(seed)
    codec = make_codec(name.split("/")[0], **PARAMS[name])
    rows = codec.quantize(np.tile(Q, (N, 1)))
    q_hat = codec.qhat(rows, V)
    tokens = sample(q_hat, rng.random(N))  # the draft samples from q^
    got_tokens, got_q = decode(
        codec.encode(rows, tokens, V), V, max_rows=N
    )  # what the verifier receives
    counts = np.zeros(V)
    p2 = np.tile(P.astype(np.float32), (2, 1))
    for tok, qh in zip(got_tokens, got_q, strict=True):
        q_used = Q[None] if verify_with_q else qh[None]
        a, c = verify_sampling(p2, q_used, np.array([tok]), rng.random(1), rng.random())
        counts[tok if a == 1 else c] += 1
    return counts, got_q


def gof_pvalue(counts):
    return chisquare(counts, P * counts.sum()).pvalue


@pytest.mark.parametrize("name", list(PARAMS))
def test_committed_token_follows_target(name):
    counts, q_hat = committed_counts(name, verify_with_q=False, seed=0)
    assert np.abs(q_hat - Q).sum() > 0.1, "q^ too close to q for the negative control to bite"
    p = gof_pvalue(counts)
    assert p > ALPHA, f"{name}: committed law differs from the target's (p = {p:.2e})"


@pytest.mark.parametrize("name", list(PARAMS))
def test_negative_control_unquantized_q_fails(name):
    counts, _ = committed_counts(name, verify_with_q=True, seed=0)
    p = gof_pvalue(counts)
    assert p < ALPHA, f"{name}: the negative control passed (p = {p:.2e}); the test has no power"
