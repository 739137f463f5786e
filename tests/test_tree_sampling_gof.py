"""At temperature > 0, `tree`'s output law is the target's: the chi-square test of
tests/test_sampling_gof.py on the first two generated tokens, end to end through drafting,
the tree pass and the commit, with a negative control (siblings tried against the full p
instead of the residual) that must fail. Depth 2: the root's two siblings are drawn from q
without replacement and the best of them is expanded into two more (the default shape)."""

import numpy as np
import pytest
from test_sampling_gof import ALPHA, PROMPT, SAMPLING, V, exact_joint, gof_pvalue

from runtime.backends import load_model
from runtime.decoding import make_steps
from runtime.decoding import tree_pass as tree_pass_module

N = 300


@pytest.fixture(scope="module")
def pair(tiny_dir):
    kw = dict(vocab_size=V, tokenizer=False, initializer_range=0.12)
    target = load_model(tiny_dir("qwen3", seed=1, **kw), "mlx")
    draft = load_model(tiny_dir("qwen3", num_layers=1, seed=2, **kw), "onnx")
    return target, draft


def sample_pairs(target, draft, n, seed) -> np.ndarray:
    counts = np.zeros((V, V))
    tc, dc = target.new_cache(), draft.new_cache()
    for i in range(n):
        out = []
        steps = make_steps("tree", target, draft, PROMPT, max_new=3, tree_k=2, top_n=4, depth=2,
                           sampling=SAMPLING, seed=seed * 100003 + i, target_cache=tc,
                           draft_cache=dc)  # fmt: skip
        for ev in steps:
            out += ev.tokens
        counts[out[0], out[1]] += 1
        tc.trim(tc.offset - len(PROMPT))
        dc.trim(dc.offset - len(PROMPT))
    return counts


def test_tree_matches_target_distribution(pair):
    target, draft = pair
    p = gof_pvalue(sample_pairs(target, draft, N, seed=0), exact_joint(target))
    assert p > ALPHA, f"tree's joint law differs from the target's (p = {p:.2e})"


def test_negative_control_no_residual_fails(pair, monkeypatch):
    target, draft = pair

    def no_residual(p, tokens, parents, u, uf, q):  # every sibling against the full p and q
        from kernels.sampling import sample
        from kernels.tree_mask import children_lists

        kids, node, path = children_lists(parents), -1, []
        while True:
            row, qr = p[node + 1], (None if q is None else q[node + 1])
            nxt = next((k for k in kids[node + 1] if u[k] * qr[tokens[k]] < row[tokens[k]]), None)
            if nxt is None:
                return path, int(sample(row, uf))
            path.append(nxt)
            node = nxt

    monkeypatch.setattr(tree_pass_module, "verify_tree_sampling", no_residual)
    p = gof_pvalue(sample_pairs(target, draft, N, seed=0), exact_joint(target))
    assert p < ALPHA, f"the negative control passed (p = {p:.2e}); the test has no power"
