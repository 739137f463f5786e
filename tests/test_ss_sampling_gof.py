"""At temperature > 0, mirror with a speculative-streaming draft keeps the target's law:
the chi-square test of tests/test_sampling_gof.py on the joint law of the first two tokens, with its negative control (verification with a q other than the one each draft
token was drawn from) that must fail."""

import numpy as np
import pytest
from test_sampling_gof import ALPHA, PROMPT, SAMPLING, V, exact_joint, gof_pvalue

from kernels.sampling import probs_from_logits
from runtime.backends import load_model
from runtime.backends.torch_ss import make_ss_checkpoint
from runtime.decoding import make_steps
from runtime.decoding import mirror as mirror_module

N = 400


@pytest.fixture(scope="module")
def ss_pair(tiny_dir, tmp_path_factory):
    kw = dict(vocab_size=V, tokenizer=False, initializer_range=0.12)
    target = load_model(tiny_dir("qwen3", seed=1, **kw), "mlx")
    base = tiny_dir("qwen3", num_layers=1, seed=2, **kw)
    ss = make_ss_checkpoint(base, tmp_path_factory.mktemp("ssgof") / "d", 2, scale=0.3, seed=3)
    draft = load_model(ss, "torch")
    assert draft.ss_streams == 2 and len(PROMPT) < 8
    return target, draft


def sample_ss(target, draft, n, seed, method="mirror") -> np.ndarray:
    """Counts of (t1, t2) over n mirror generations with γ = 3 (so that a window takes
    several SS passes and a pass can confirm guesses: tests/test_sampling_gof.py's γ = 2
    would never walk past one)."""
    counts = np.zeros((V, V))
    tc, dc = target.new_cache(), draft.new_cache()
    for i in range(n):
        steps = make_steps(method, target, draft, PROMPT, max_new=4, gamma=3, kappa=3,
                           exit_layer=2, sampling=SAMPLING, seed=seed * 100003 + i,
                           target_cache=tc, draft_cache=dc)  # fmt: skip
        out = [t for ev in steps for t in ev.tokens]
        counts[out[0], out[1]] += 1
        tc.trim(tc.offset - len(PROMPT))
        dc.trim(dc.offset - len(PROMPT))
    return counts


def test_mirror_with_ss_draft_keeps_the_target_law(ss_pair):
    target, draft = ss_pair
    p = gof_pvalue(sample_ss(target, draft, N, seed=1), exact_joint(target))
    assert p > ALPHA, f"mirror with an SS draft: joint law differs from the target's (p = {p:.2e})"


def test_negative_control_wrong_q_fails(ss_pair, monkeypatch):
    """Mirror with the SS draft, verifying with a flattened q: the law must break."""
    target, draft = ss_pair
    real = mirror_module.verify_sampling

    def wrong_q(p, q, d, ua, ur):
        return real(p, probs_from_logits(np.log(q + 1e-9), temp=3.0), d, ua, ur)

    monkeypatch.setattr(mirror_module, "verify_sampling", wrong_q)
    p = gof_pvalue(sample_ss(target, draft, N, seed=1), exact_joint(target))
    assert p < ALPHA, f"the negative control passed (p = {p:.2e}); the test has no power"


def test_sd_with_ss_draft_on_the_keyed_streams_keeps_the_target_law(ss_pair, monkeypatch):
    """sd draws its SS windows and verdicts from mirror's keyed streams (Gumbel-max
    corrections, runtime/decoding/events.py): the same test, and its negative control."""
    from runtime.decoding import sd as sd_module

    target, draft = ss_pair
    p = gof_pvalue(sample_ss(target, draft, N, seed=2, method="sd"), exact_joint(target))
    assert p > ALPHA, f"sd with an SS draft: joint law differs from the target's (p = {p:.2e})"
    real = sd_module.verify_sampling

    def wrong_q(p, q, d, ua, ur):
        return real(p, probs_from_logits(np.log(q + 1e-9), temp=3.0), d, ua, ur)

    monkeypatch.setattr(sd_module, "verify_sampling", wrong_q)
    p = gof_pvalue(sample_ss(target, draft, N, seed=2, method="sd"), exact_joint(target))
    assert p < ALPHA, f"the negative control passed (p = {p:.2e}); the test has no power"
