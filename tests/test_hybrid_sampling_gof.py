"""At temperature > 0, `sd` on a hybrid (Gated DeltaNet) target keeps the target's law: the
chi-square test of tests/test_sampling_gof.py (joint law of the first two tokens), with
rollback by replay, and its negative control (a q other than the draft's) that must fail."""

import pytest
from test_sampling_gof import (
    ALPHA,
    V,
    exact_joint,
    gof_pvalue,
    sample_pairs,
    verify_with_a_flattened_q,
)

from runtime.backends import load_model

N = 300  # with a peaked draft the negative control fails at p ~ 2e-8 with this many (pass: 0.12)


@pytest.fixture(scope="module")
def hybrid_pair(tiny_dir):
    kw = dict(vocab_size=V, tokenizer=False, hidden_size=32)
    tdir = tiny_dir("qwen3_5_text", num_layers=2, seed=1, initializer_range=0.12, **kw)
    # a peaked draft (large weights): a wrong q then moves the output law far
    ddir = tiny_dir("qwen3_5_text", num_layers=1, seed=2, initializer_range=0.6, **kw)
    target = load_model(tdir, "torch", threads=1)
    draft = load_model(ddir, "torch", threads=1)
    return target, draft


def test_sd_on_a_hybrid_target_matches_its_distribution(hybrid_pair):
    target, draft = hybrid_pair
    p = gof_pvalue(sample_pairs("sd", target, draft, N, seed=0), exact_joint(target))
    assert p > ALPHA, f"sd's joint law on a hybrid target differs from the target's (p = {p:.2e})"


def test_negative_control_wrong_q_fails_on_a_hybrid_target(hybrid_pair, monkeypatch):
    target, draft = hybrid_pair
    verify_with_a_flattened_q(monkeypatch)
    p = gof_pvalue(sample_pairs("sd", target, draft, N, seed=0), exact_joint(target))
    assert p < ALPHA, f"the negative control passed (p = {p:.2e}); the test has no power"
