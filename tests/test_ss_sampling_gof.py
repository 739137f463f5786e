"""At temperature > 0, mirror and sd with a speculative-streaming draft keep the target's law:
the chi-square test of tests/test_sampling_gof.py on the joint law of the first two tokens,
with its negative control (verification with a q other than the one each draft token was
drawn from) that must fail."""

import numpy as np
import pytest
from test_sampling_gof import (
    PROMPT,
    SAMPLING,
    V,
    assert_breaks_law,
    assert_keeps_law,
    joint_counts,
    verify_with_a_flattened_q,
)

from runtime.backends import load_model
from runtime.decoding import mirror_pass
from runtime.decoding import sd as sd_module
from runtime.drafts.ss.torch import make_ss_checkpoint

N = 400
SEEDS = {"mirror": 1, "sd": 2}


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
    return joint_counts(
        method, target, draft, n, seed, max_new=4, gamma=3, kappa=3, exit_layer=2, sampling=SAMPLING
    )


@pytest.mark.parametrize("method", ["mirror", "sd"])
def test_ss_draft_keeps_the_target_law(ss_pair, method):
    """mirror; and sd, which draws its SS windows and verdicts from mirror's keyed streams
    (Gumbel-max corrections, runtime/decoding/events.py)."""
    target, draft = ss_pair
    counts = sample_ss(target, draft, N, seed=SEEDS[method], method=method)
    assert_keeps_law(counts, target, f"{method} with an SS draft")


@pytest.mark.parametrize("method", ["mirror", "sd"])
def test_negative_control_wrong_q_fails(ss_pair, monkeypatch, method):
    """Verifying with a flattened q: the law must break."""
    target, draft = ss_pair
    verify_with_a_flattened_q(monkeypatch, {"mirror": mirror_pass, "sd": sd_module}[method])
    assert_breaks_law(sample_ss(target, draft, N, seed=SEEDS[method], method=method), target)
