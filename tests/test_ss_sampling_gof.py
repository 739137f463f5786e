"""At temperature > 0, mirror with a speculative-streaming draft keeps the target's law: the chi-square test of tests/test_sampling_gof.py on the joint law of the first two
tokens, with its negative control (verification with a q other than the one each draft
token was drawn from) that must fail."""

import numpy as np
import pytest
from test_sampling_gof import ALPHA, PROMPT, V, exact_joint, gof_pvalue, sample_pairs

from kernels.sampling import probs_from_logits
from runtime.backends import load_model
from runtime.decoding import mirror as mirror_module
from runtime.ss_checkpoint import make_ss_checkpoint

N = 600  # the negative control still fails at p < 1e-10 with this many


@pytest.fixture(scope="module")
def ss_pair(tiny_dir, tmp_path_factory):
    kw = dict(vocab_size=V, tokenizer=False, initializer_range=0.12)
    target = load_model(tiny_dir("qwen3", seed=1, **kw), "mlx")
    base = tiny_dir("qwen3", num_layers=1, seed=2, **kw)
    ss = make_ss_checkpoint(base, tmp_path_factory.mktemp("ssgof") / "d", 2, scale=0.3, seed=3)
    draft = load_model(ss, "torch")
    assert draft.ss_streams == 2 and len(PROMPT) < 8
    return target, draft


@pytest.mark.parametrize("method", ["sd", "mirror"])
def test_ss_draft_keeps_the_target_law(ss_pair, method):
    target, draft = ss_pair
    p = gof_pvalue(sample_pairs(method, target, draft, N, seed=1), exact_joint(target))
    assert p > ALPHA, (
        f"{method} with an SS draft: joint law differs from the target's (p = {p:.2e})"
    )


def test_negative_control_wrong_q_fails(ss_pair, monkeypatch):
    """Mirror with the SS draft, verifying with a flattened q: the law must break."""
    target, draft = ss_pair
    real = mirror_module.verify_sampling

    def wrong_q(p, q, d, ua, ur):
        return real(p, probs_from_logits(np.log(q + 1e-9), temp=3.0), d, ua, ur)

    monkeypatch.setattr(mirror_module, "verify_sampling", wrong_q)
    p = gof_pvalue(sample_pairs("mirror", target, draft, N, seed=1), exact_joint(target))
    assert p < ALPHA, f"the negative control passed (p = {p:.2e}); the test has no power"
