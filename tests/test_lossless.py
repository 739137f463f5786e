"""Greedy ar and sd give the target's own tokens, equal to Hugging Face generate."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from runtime.backends import load_model
from runtime.decoding import Sampling, make_steps, run

PROMPT = [11, 42, 7, 99, 5, 250]
N = 40


def hf_greedy(d, prompt, n):
    m = AutoModelForCausalLM.from_pretrained(d).eval()
    with torch.no_grad():
        out = m.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=n
        )
    return out[0, len(prompt) :].tolist()


def gen(method, target, draft, n=N, gamma=4, prompt=PROMPT, **kw):
    steps = make_steps(
        method, target, draft, prompt, max_new=n, sampling=Sampling(**kw), seed=0, gamma=gamma
    )
    return run(steps, max_new=n, eos_ids=target.config.eos_token_ids)


@pytest.mark.parametrize("draft_backend", ["onnx", "mlx"])
def test_greedy_ar_and_sd_equal_hf_generate(tiny_dir, arch, draft_backend):
    td = tiny_dir(arch)
    dd = tiny_dir(arch, num_layers=1, hidden_size=32, seed=7)  # a weak, different draft
    ref = hf_greedy(td, PROMPT, N)
    target, draft = load_model(td, "mlx"), load_model(dd, draft_backend)
    assert gen("ar", target, None).tokens == ref
    for gamma in (1, 3, 5):
        assert gen("sd", target, draft, gamma=gamma).tokens == ref


def test_target_as_its_own_draft_accepts_everything(tiny_dir):
    d = tiny_dir("qwen3")
    target = load_model(d, "mlx")
    for gamma in (1, 2, 4):
        r = gen("sd", target, target, n=5 * (gamma + 1), gamma=gamma)
        assert r.stats.accept_lengths == [gamma + 1] * 5
        assert r.stats.as_dict()["acceptance_rate"] == 1.0
    assert r.tokens == gen("ar", target, None, n=5 * (gamma + 1)).tokens


def test_random_draft_accepts_almost_nothing_and_output_is_unchanged(tiny_dir):
    td = tiny_dir("llama")
    dd = tiny_dir("llama", seed=123)  # same shape, unrelated weights
    target, draft = load_model(td, "mlx"), load_model(dd, "onnx")
    r = gen("sd", target, draft, gamma=4)
    assert r.tokens == hf_greedy(td, PROMPT, N)
    assert r.stats.as_dict()["acceptance_rate"] < 0.1
    assert r.stats.as_dict()["mean_accepted"] < 1.5


def test_sampling_with_its_own_draft_accepts_everything(tiny_dir):
    target = load_model(tiny_dir("qwen3"), "mlx")
    r = gen("sd", target, target, n=15, gamma=4, temp=1.0)
    assert r.stats.accept_lengths == [5, 5, 5]


def test_eos_stops_and_is_kept(tiny_dir):
    td = tiny_dir("qwen2")
    ref = hf_greedy(td, PROMPT, N)
    eos = ref[12]
    cut = ref[: ref.index(eos) + 1]
    target = load_model(td, "mlx")
    for method, draft in (("ar", None), ("sd", target)):
        steps = make_steps(
            method, target, draft, PROMPT, max_new=N, sampling=Sampling(), seed=0, gamma=4
        )
        r = run(steps, max_new=N, eos_ids=(eos,))
        assert r.tokens == cut and r.finish == "eos"


def test_cache_rewound_when_closed_early(tiny_dir):
    """A caller that stops mid-stream leaves both caches holding only committed tokens."""
    target = load_model(tiny_dir("qwen3"), "mlx")
    draft = load_model(tiny_dir("qwen3", num_layers=1, seed=3), "onnx")
    tc, dc = target.new_cache(), draft.new_cache()
    from runtime.decoding.sd import sd_steps

    steps = sd_steps(target, draft, PROMPT, max_new=N, gamma=4, target_cache=tc, draft_cache=dc)
    committed = list(PROMPT)
    for _ in range(3):
        committed += next(steps).tokens
    steps.close()
    assert tc.offset <= len(committed) and dc.offset <= len(committed)
    # continuing from the rewound caches gives the same tokens as a fresh run
    steps2 = sd_steps(
        target, draft, committed, max_new=10, gamma=4, target_cache=tc, draft_cache=dc
    )
    cont = [t for ev in steps2 for t in ev.tokens][:10]
    fresh = gen("ar", target, None, n=len(committed) - len(PROMPT) + 10).tokens
    assert committed[len(PROMPT) :] + cont == fresh


def test_max_tokens_respected_exactly(tiny_dir):
    target = load_model(tiny_dir("qwen3"), "mlx")
    for n in (1, 2, 7):
        r = gen("sd", target, target, n=n, gamma=4)
        assert len(r.tokens) == n
        assert np.sum(r.stats.accept_lengths) == n
