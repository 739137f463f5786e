"""Greedy `tree` and `heterospec` give the target's own tokens (tiny Llama / Qwen2 / Qwen3,
ONNX, MLX and torch drafts, and the embedded pair); exact acceptance with the target as its
own draft; caches hold exactly the committed sequence after every step; a tree wider than
the context left shrinks instead of failing; bad tree flags are one clear error."""

import json

import numpy as np
import pytest

from runtime.assets import default_pair
from runtime.backends import load_model
from runtime.decoding import Sampling, make_steps, run
from runtime.errors import DuetError

PROMPT = [11, 42, 7, 99, 5, 250]
N = 20
TOL = 2e-4


def gen(method, target, draft, n=N, prompt=PROMPT, **kw):
    steps = make_steps(method, target, draft, prompt, max_new=n, sampling=Sampling(), seed=0, **kw)
    return run(steps, max_new=n, eos_ids=target.config.eos_token_ids)


@pytest.mark.parametrize("draft_backend", ["onnx", "mlx"])
def test_greedy_tree_and_heterospec_equal_ar(tiny_dir, arch, draft_backend):
    td = tiny_dir(arch)
    dd = tiny_dir(arch, num_layers=1, hidden_size=32, seed=7)  # a weak, different draft
    target, draft = load_model(td, "mlx"), load_model(dd, draft_backend)
    ref = gen("ar", target, None).tokens
    shapes = [{}, dict(tree_k=4, top_n=16, depth=5, expand=4)]  # the defaults, EAGLE-2's K x K
    if draft_backend == "onnx":
        shapes.append(dict(tree_k=2, top_n=5, depth=3, expand=2))
    for kw in shapes:
        assert gen("tree", target, draft, **kw).tokens == ref, kw
        assert gen("heterospec", target, draft, **kw).tokens == ref, kw


def test_greedy_tree_on_a_torch_target(tiny_dir):
    target = load_model(tiny_dir("qwen2"), "torch", threads=1)  # 1: no oversubscribed cores
    draft = load_model(tiny_dir("qwen2", num_layers=1, hidden_size=32, seed=7), "torch")
    assert gen("tree", target, draft).tokens == gen("ar", target, None).tokens


def test_embedded_pair_greedy(tiny_dir):
    t, d = default_pair()
    target, draft = load_model(t, "torch", threads=1), load_model(d, "onnx")
    prompt = list(range(300, 340))
    ref = gen("ar", target, None, n=24, prompt=prompt).tokens
    assert gen("tree", target, draft, n=24, prompt=prompt).tokens == ref
    r = gen("heterospec", target, draft, n=24, prompt=prompt)
    assert r.tokens == ref
    per = r.stats.as_dict()["per_step"]
    assert len(per["bin"]) == len(r.stats.accept_lengths) and all(0 <= b <= 7 for b in per["bin"])


def test_target_as_its_own_draft_accepts_the_full_depth(tiny_dir):
    target = load_model(tiny_dir("qwen3"), "mlx")
    # top_n covers every node, so the target's greedy path is always in the tree
    r = gen("tree", target, target, n=5 * 4, tree_k=2, top_n=10, depth=3, expand=2)  # 2+4+4
    assert r.stats.accept_lengths == [4] * 5
    assert r.tokens == gen("ar", target, None, n=20).tokens
    d = r.stats.as_dict()
    assert d["calls"] == 5 and d["verified_tokens"] == 5 * (1 + 10)


def test_caches_hold_the_committed_sequence_after_every_step(tiny_dir):
    target = load_model(tiny_dir("llama"), "mlx")
    draft = load_model(tiny_dir("llama", num_layers=1, hidden_size=32, seed=3), "onnx")
    tc, dc = target.new_cache(), draft.new_cache()
    seq = list(PROMPT)
    steps = make_steps(
        "tree",
        target,
        draft,
        PROMPT,
        max_new=12,
        sampling=Sampling(temp=1.0),
        seed=1,
        target_cache=tc,
        draft_cache=dc,
    )
    for ev in steps:
        seq += ev.tokens
        assert tc.offset == len(seq) - 1 and dc.offset <= len(seq) - 1
        nxt = np.array([[seq[-1]]])
        fresh = target.new_cache()
        target.forward(np.array([seq[:-1]]), fresh)
        want = target.forward(nxt, fresh)[0]
        got = target.forward(nxt, tc)[0]
        tc.trim(1)
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


def test_tree_wider_than_the_context_shrinks(tiny_dir):
    td = tiny_dir("qwen3", max_context=24)
    target = load_model(td, "mlx")
    draft = load_model(tiny_dir("qwen3", num_layers=1, seed=4, max_context=24), "mlx")
    prompt = list(range(1, 19))  # 6 positions left, the tree wants 16 nodes
    ref = gen("ar", target, None, n=6, prompt=prompt).tokens
    r = gen("tree", target, draft, n=6, prompt=prompt, tree_k=4, top_n=16, depth=5)
    assert r.tokens == ref and len(r.tokens) == 6


def test_bad_tree_flags_and_bins(tiny_dir, tmp_path):
    target = load_model(tiny_dir("qwen3"), "mlx")
    with pytest.raises(DuetError, match="--depth must be at least 1"):
        gen("tree", target, target, depth=0)
    bad = tmp_path / "bins.json"
    bad.write_text(json.dumps({"nothresholds": []}))
    with pytest.raises(DuetError, match="not a bins file"):
        gen("heterospec", target, target, bins=str(bad))
