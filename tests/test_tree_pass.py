"""One target pass over a draft tree gives each node the logits of a chain pass over its
root-to-node path, and the commit leaves the cache equal to a fresh prefill of the committed
sequence (PyTorch and MLX targets)."""

import numpy as np
import pytest

from runtime.backends import load_model
from runtime.decoding.tree_pass import commit, tree_logits

TOL = 2e-4  # max |Δlogit|, float32 tree pass vs chain pass (different reduction shapes)
PROMPT = [11, 42, 7, 99, 5, 250]
#        0   1   2   3   4   5   6   7   (node)
PARENTS = [-1, -1, 0, 0, 1, 2, 2, 5]
TOKENS = [3, 17, 8, 8, 30, 2, 9, 40]


def chain_logits(model, seq):
    return model.forward(np.array([seq]), model.new_cache())[0, -1]


@pytest.mark.parametrize("backend", ["torch", "mlx"])
@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_tree_pass_equals_chain_pass(tiny_dir, backend, model_type):
    m = load_model(tiny_dir(model_type), backend)
    cache = m.new_cache()
    m.forward(np.array([PROMPT[:3]]), cache)  # part of the prompt already cached
    got = tree_logits(m, cache, PROMPT, TOKENS, PARENTS)  # (N + 1, V)
    assert cache.offset == len(PROMPT) + len(TOKENS)
    np.testing.assert_allclose(got[0], chain_logits(m, PROMPT), atol=TOL, rtol=0)
    for i in range(len(TOKENS)):
        path, j = [], i
        while j >= 0:
            path.insert(0, TOKENS[j])
            j = PARENTS[j]
        want = chain_logits(m, PROMPT + path)
        np.testing.assert_allclose(got[1 + i], want, atol=TOL, rtol=0, err_msg=f"node {i}")


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_commit_leaves_the_committed_sequence(tiny_dir, backend):
    m = load_model(tiny_dir("qwen2"), backend)
    cache = m.new_cache()
    tree_logits(m, cache, PROMPT, TOKENS, PARENTS)
    path = [0, 2, 5, 7]  # a root-to-leaf path
    commit(cache, len(PROMPT), path)
    seq = PROMPT + [TOKENS[i] for i in path]
    assert cache.offset == len(seq)
    nxt = np.array([[77, 12]])
    got = m.forward(nxt, cache)[0]
    fresh = m.new_cache()
    m.forward(np.array([seq]), fresh)
    want = m.forward(nxt, fresh)[0]
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    # the keys and values themselves, layer by layer
    for i in range(m.config.num_layers):
        if backend == "torch":
            a, b = cache.get(i)[0].numpy(), fresh.get(i)[0].numpy()
        else:
            n = cache.layers[i].offset
            a = np.array(cache.layers[i].keys[..., :n, :])
            b = np.array(fresh.layers[i].keys[..., :n, :])
        np.testing.assert_allclose(a, b, atol=TOL, rtol=0)
