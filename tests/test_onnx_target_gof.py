"""At temperature 1, sd over an int4 ONNX target keeps the int4 target's own law: a chi-square
goodness-of-fit test on the joint law of the first two generated tokens against the law the
int4 graph itself gives (not the float32 model's), with a negative control (verification with a
q other than the one the draft sampled from) that must fail. The helpers are
tests/test_sampling_gof.py's."""

import pytest
from test_sampling_gof import (
    ALPHA,
    SAMPLING,
    V,
    exact_joint,
    gof_pvalue,
    sample_pairs,
    verify_with_a_flattened_q,
)

from runtime.backends import load_model
from runtime.backends.onnx.target import OnnxTargetLM

N = 600  # as test_sampling_gof: its negative controls fail at p < 2e-12 with this many


@pytest.fixture(scope="module")
def int4_pair(tiny_dir):
    kw = dict(vocab_size=V, tokenizer=False, initializer_range=0.12)
    target = OnnxTargetLM(tiny_dir("qwen3", seed=1, **kw), "int4", intra_threads=1)
    assert target.quantization["scheme"] == "int4"
    draft = load_model(tiny_dir("qwen3", num_layers=1, seed=2, **kw), "onnx")
    return target, draft, exact_joint(target, SAMPLING)  # the int4 graph's own law


def test_int4_sd_sampling_keeps_the_int4_targets_law(int4_pair):
    target, draft, joint = int4_pair
    p = gof_pvalue(sample_pairs("sd", target, draft, N, seed=0), joint)
    assert p > ALPHA, f"sd over the int4 target left its law (p = {p:.2e})"


def test_negative_control_wrong_q_fails(int4_pair, monkeypatch):
    target, draft, joint = int4_pair
    verify_with_a_flattened_q(monkeypatch)
    p = gof_pvalue(sample_pairs("sd", target, draft, N, seed=0), joint)
    assert p < ALPHA, f"the negative control passed (p = {p:.2e}); the test has no power"
