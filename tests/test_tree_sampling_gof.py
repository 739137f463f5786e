"""At temperature > 0, `tree`'s output law is the target's: the chi-square test of
tests/test_sampling_gof.py on the first two generated tokens, end to end through drafting,
the tree pass and the commit, with a negative control (siblings tried against the full p
instead of the residual) that must fail. Depth 2: the root's two siblings are drawn from q
without replacement and the best of them is expanded into two more (the default shape)."""

import numpy as np
import test_sampling_gof
from test_sampling_gof import SAMPLING, assert_breaks_law, assert_keeps_law, joint_counts

from runtime.decoding import tree_pass as tree_pass_module

N = 300


pair = test_sampling_gof.pair  # the fixture: an MLX target and an ONNX draft over V = 8


def sample_pairs(target, draft, n, seed) -> np.ndarray:
    return joint_counts(
        "tree", target, draft, n, seed, tree_k=2, top_n=4, depth=2, sampling=SAMPLING
    )


def test_tree_matches_target_distribution(pair):
    target, draft = pair
    assert_keeps_law(sample_pairs(target, draft, N, seed=0), target, "tree")


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
    assert_breaks_law(sample_pairs(target, draft, N, seed=0), target)
