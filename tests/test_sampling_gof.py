"""At temperature > 0, sd's and mirror's output law is the target's: a chi-square
goodness-of-fit test on the joint law of the first two generated tokens, with a
negative control (verification with a q other than the one the draft sampled from)
that must fail."""

import numpy as np
import pytest
from scipy.stats import chisquare

from kernels.sampling import probs_from_logits
from runtime.backends import load_model
from runtime.decoding import Sampling, make_steps, mirror_pass
from runtime.decoding import sd as sd_module

# the module whose verify_sampling each method's acceptance rule calls
MODULES = {"sd": sd_module, "mirror": mirror_pass, "mirror-plain": mirror_pass,
           "mirror-lazy": mirror_pass}  # fmt: skip
# mirror rolls out the draft's own runner-up branches before the early exit by default;
# mirror-plain only the early-exit top-κ branches
OPTIONS = {"mirror-plain": {"draft_branches": 0}}
# mirror-lazy: plain sampling over a vocabulary taken as wide (DENSE_UP_TO lowered): the
# branch waves and the fallback draw by Gumbel-max over logits and carry the logits
# (Sampling.lazy), the step noise is the block-built field (kernels/gumbel_field.py)
METHODS = ["sd", "mirror", "mirror-plain", "mirror-lazy"]

V = 8
PROMPT = [1, 2, 3]
N = 600  # enough power: every negative control fails at p < 2e-12 with this many (1000: < 1e-20)
ALPHA = 1e-3  # the test passes at p > ALPHA; the negative control must give p < ALPHA
SAMPLING = Sampling(temp=1.0, top_p=0.95)
SAMPLINGS = {"mirror-lazy": Sampling(temp=1.0)}


@pytest.fixture(scope="module")
def pair(tiny_dir):
    kw = dict(vocab_size=V, tokenizer=False, initializer_range=0.12)
    target = load_model(tiny_dir("qwen3", seed=1, **kw), "mlx")
    draft = load_model(tiny_dir("qwen3", num_layers=1, seed=2, **kw), "onnx")
    return target, draft


@pytest.fixture
def wide(monkeypatch, method):
    """For mirror-lazy: every vocabulary counts as wide; yields the count of lazy wave draws."""
    from kernels import gumbel_field
    from runtime.decoding import events
    from runtime.mirror import wave

    drawn = []
    if method == "mirror-lazy":
        monkeypatch.setattr(events, "DENSE_UP_TO", 4)
        monkeypatch.setattr(gumbel_field, "DENSE_UP_TO", 4)
        real = wave.gumbel_draws
        monkeypatch.setattr(wave, "gumbel_draws", lambda *a: drawn.append(1) or real(*a))
    return drawn


def exact_joint(target, sampling=SAMPLING, prompt=PROMPT) -> np.ndarray:
    """P(t1, t2) from the target's logits: p(t1 | prompt) * p(t2 | prompt, t1)."""
    c = target.new_cache()
    p1 = sampling.probs(target.forward(np.array([prompt]), c)[0, -1])
    joint = np.zeros((V, V))
    for t1 in range(V):
        c.trim(c.offset - len(prompt))
        joint[t1] = p1[t1] * sampling.probs(target.forward(np.array([[t1]]), c)[0, -1])
    return joint


def sample_pairs(method, target, draft, n, seed) -> np.ndarray:
    opts = OPTIONS.get(method, {})
    sampling = SAMPLINGS.get(method, SAMPLING)
    return joint_counts(
        method.split("-")[0],
        target,
        draft,
        n,
        seed,
        gamma=2,
        kappa=3,
        exit_layer=2,
        sampling=sampling,
        **opts,
    )


def joint_counts(method, target, draft, n, seed, max_new=3, **options) -> np.ndarray:
    """Counts of the first two tokens (t1, t2) over n generations by `method` with
    make_steps's `options`, the i-th seeded seed * 100003 + i; the caches keep the prompt
    between samples."""
    counts = np.zeros((V, V))
    tc, dc = target.new_cache(), draft.new_cache()
    for i in range(n):
        steps = make_steps(
            method,
            target,
            draft,
            PROMPT,
            max_new=max_new,
            seed=seed * 100003 + i,
            target_cache=tc,
            draft_cache=dc,
            **options,
        )
        out = [t for ev in steps for t in ev.tokens]
        counts[out[0], out[1]] += 1
        tc.trim(tc.offset - len(PROMPT))  # keep the prompt's cache between samples
        dc.trim(dc.offset - len(PROMPT))
    return counts


def gof_pvalue(counts, joint) -> float:
    exp = joint.ravel() / joint.sum() * counts.sum()  # joint is float32-rounded; renormalize
    obs = counts.ravel()
    big = exp >= 5  # pool small cells so the chi-square approximation holds
    o = np.append(obs[big], obs[~big].sum())
    e = np.append(exp[big], exp[~big].sum())
    if e[-1] == 0:
        o, e = o[:-1], e[:-1]
    assert big.sum() >= 10, "the target law is too peaked for a meaningful test"
    return chisquare(o, e * o.sum() / e.sum()).pvalue


def assert_keeps_law(counts, target, what: str) -> None:
    """The chi-square test: the counts of (t1, t2) fit the target's joint law."""
    p = gof_pvalue(counts, exact_joint(target))
    assert p > ALPHA, f"{what}: joint law differs from the target's (p = {p:.2e})"


def assert_breaks_law(counts, target) -> None:
    """A negative control's counts must not fit the target's law, or the test has no power."""
    p = gof_pvalue(counts, exact_joint(target))
    assert p < ALPHA, f"the negative control passed (p = {p:.2e}); the test has no power"


@pytest.mark.parametrize("method", METHODS)
def test_matches_target_distribution(pair, method, wide):
    target, draft = pair
    joint = exact_joint(target, SAMPLINGS.get(method, SAMPLING))
    p = gof_pvalue(sample_pairs(method, target, draft, N, seed=0), joint)
    assert p > ALPHA, f"{method}'s joint law differs from the target's (p = {p:.2e})"
    assert bool(wide) == (method == "mirror-lazy")  # its waves drew lazily; no other's did


def verify_with_a_flattened_q(monkeypatch, module=sd_module) -> None:
    """The negative control: `module`'s acceptance rule is given the draft's q flattened
    (temperature 3), not the q the draft sampled from."""
    real = module.verify_sampling

    def wrong_q(p, q, d, ua, ur):
        return real(p, probs_from_logits(np.log(q + 1e-9), temp=3.0), d, ua, ur)

    monkeypatch.setattr(module, "verify_sampling", wrong_q)


@pytest.mark.parametrize("method", METHODS)
def test_negative_control_wrong_q_fails(pair, monkeypatch, method, wide):
    """Verifying with a q other than the one the draft sampled from must break the law."""
    target, draft = pair
    verify_with_a_flattened_q(monkeypatch, MODULES[method])
    joint = exact_joint(target, SAMPLINGS.get(method, SAMPLING))
    p = gof_pvalue(sample_pairs(method, target, draft, N, seed=0), joint)
    assert p < ALPHA, f"the negative control passed (p = {p:.2e}); the test has no power"
