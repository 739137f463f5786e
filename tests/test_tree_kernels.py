"""Tree kernels: masks and positions, greedy walk, the fast sampling path equal to the
reference, Φ (eq. 1) and bin lookup, and a chi-square test that tree sampling commits the
target's law, with a negative control (no residual update) that must fail."""

import numpy as np
from scipy.stats import chisquare

from kernels.entropy import bin_of, meta_path_entropy, topk_entropy
from kernels.sampling import probs_from_logits
from kernels.tree_mask import node_depths, path_to, tree_mask, tree_positions
from kernels.tree_verify import (
    verify_tree_greedy,
    verify_tree_sampling,
    verify_tree_sampling_ref,
)

PARENTS = np.array([-1, -1, 0, 0, 1, 2])  # two children of the root; node 2 has a child


def test_mask_and_positions():
    m = tree_mask(PARENTS, offset=3, prefix=2)  # cache 3, prefix 2 (root last), 6 nodes
    assert m.shape == (8, 11)
    assert m[0].tolist() == [1, 1, 1, 1] + [0] * 7  # prefix token 0 is causal
    assert m[1, :5].all() and not m[1, 5:].any()
    node5 = m[2 + 5]
    assert node5[:5].all()  # cache + prefix
    assert node5[5:].tolist() == [1, 0, 1, 0, 0, 1]  # itself and its ancestors 2, 0
    assert tree_positions(PARENTS, 3, 2).tolist() == [3, 4, 5, 5, 6, 6, 6, 7]
    assert node_depths(PARENTS).tolist() == [1, 1, 2, 2, 2, 3]
    assert path_to(PARENTS, 5) == [0, 2, 5]


def test_greedy_walks_the_argmax():
    V = 6
    tokens = np.array([1, 2, 3, 4, 0, 5])
    logits = np.zeros((7, V))
    logits[0, 1] = logits[1, 4] = logits[4, 2] = 1  # root -> 1 (node 0) -> 4 (node 3) -> 2
    assert verify_tree_greedy(logits, tokens, PARENTS) == ([0, 3], 2)
    logits[0] = 0
    logits[0, 5] = 1  # no child of the root is the argmax
    assert verify_tree_greedy(logits, tokens, PARENTS) == ([], 5)


def test_fast_sampling_equals_reference():
    rng = np.random.default_rng(0)
    V = 12
    for trial in range(300):
        n = int(rng.integers(0, 9))
        parents = np.array([int(rng.integers(-1, i)) for i in range(n)], dtype=np.int64)
        tokens = np.empty(n, np.int64)
        for i in range(n):  # siblings are distinct tokens (a top-K)
            used = {tokens[j] for j in range(i) if parents[j] == parents[i]}
            tokens[i] = rng.choice([t for t in range(V) if t not in used])
        p = probs_from_logits(rng.normal(size=(n + 1, V)) * 2, temp=1.0, top_p=0.9)
        q = probs_from_logits(rng.normal(size=(n + 1, V)) * 2, temp=1.0)
        u, uf = rng.random(n), rng.random()
        for qq in (None, q):
            ref = verify_tree_sampling_ref(p, tokens, parents, u, uf, qq)
            assert verify_tree_sampling(p, tokens, parents, u, uf, qq) == ref, trial


def test_entropy_phi():
    p = np.array([[0.5, 0.25, 0.25, 0.0], [1.0, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(topk_entropy(p, 2), [np.log(3) - 2 / 3 * np.log(2), 0.0])
    np.testing.assert_allclose(topk_entropy(p, 4)[0], 1.5 * np.log(2))
    assert meta_path_entropy(p, 4) == float(topk_entropy(p, 4).sum())
    assert [bin_of(x, [1.0, 2.0, 3.0]) for x in (0.5, 1.0, 2.5, 9)] == [0, 1, 2, 3]


# -- the output law: the first two committed tokens over a fixed synthetic target ---------
V = 6
N_SAMPLES = 4000
ALPHA = 1e-3


def synthetic():
    """A target law p(t1) and p(t2 | t1), and a draft tree over them (root's top-3, and
    two children under the first two of those)."""
    rng = np.random.default_rng(5)
    p1 = probs_from_logits(rng.normal(size=V) * 1.2)
    p2 = probs_from_logits(rng.normal(size=(V, V)) * 1.2)
    tokens = np.array([2, 0, 4, 1, 3, 5, 0])
    parents = np.array([-1, -1, -1, 0, 0, 1, 1])
    rows = [p1] + [p2[tokens[i]] for i in range(len(tokens))]  # node rows: p after its token
    return p1, p2, tokens, parents, np.stack(rows)


def sample_joint(verify, n=N_SAMPLES, seed=0):
    p1, p2, tokens, parents, rows = synthetic()
    rng = np.random.default_rng(seed)
    counts = np.zeros((V, V))
    for _ in range(n):
        path, c = verify(rows, tokens, parents, rng.random(len(tokens)), rng.random())
        out = [int(tokens[i]) for i in path] + [c]
        if len(out) == 1:  # the step ended after one token: draw the next from the target
            out.append(int(np.searchsorted(np.cumsum(p2[out[0]]), rng.random() * p2[out[0]].sum())))
        counts[out[0], out[1]] += 1
    return counts, p1[:, None] * p2


def pvalue(counts, joint):
    exp = joint.ravel() / joint.sum() * counts.sum()
    big = exp >= 5
    o, e = (
        np.append(counts.ravel()[big], counts.ravel()[~big].sum()),
        np.append(exp[big], exp[~big].sum()),
    )
    if e[-1] == 0:
        o, e = o[:-1], e[:-1]
    return chisquare(o, e * o.sum() / e.sum()).pvalue


def test_tree_sampling_commits_the_target_law():
    for verify in (verify_tree_sampling, verify_tree_sampling_ref):
        p = pvalue(*sample_joint(verify))
        assert p > ALPHA, f"{verify.__name__}: law differs from the target's (p = {p:.2e})"


def test_sampled_siblings_commit_the_target_law():
    """Siblings drawn from q without replacement, verified with the q-residual rule."""
    p1, p2, _, _, _ = synthetic()
    q1 = probs_from_logits(np.log(p1 + 1e-9) * 0.5)  # a flatter draft
    rng = np.random.default_rng(3)
    counts = np.zeros((V, V))
    for _ in range(N_SAMPLES):
        rest, toks = q1.astype(np.float64), []
        for _ in range(3):  # three siblings without replacement
            t = int(np.searchsorted(np.cumsum(rest), rng.random() * rest.sum(), side="right"))
            toks.append(t)
            rest = rest.copy()
            rest[t] = 0
        tokens, parents = np.array(toks), np.array([-1, -1, -1])
        rows = np.stack([p1] + [p2[t] for t in toks])
        qs = np.stack([q1] + [np.zeros(V)] * 3)
        path, c = verify_tree_sampling(rows, tokens, parents, rng.random(3), rng.random(), qs)
        out = [int(tokens[i]) for i in path] + [c]
        if len(out) == 1:
            out.append(int(np.searchsorted(np.cumsum(p2[out[0]]), rng.random() * p2[out[0]].sum())))
        counts[out[0], out[1]] += 1
    p = pvalue(counts, p1[:, None] * p2)
    assert p > ALPHA, f"sampled siblings: law differs from the target's (p = {p:.2e})"


def test_negative_control_without_residual_fails():
    """Trying each sibling against the full p (no residual update) over-commits siblings."""

    def no_residual(p, tokens, parents, u, uf):
        from kernels.tree_mask import children_lists

        kids, node, path = children_lists(parents), -1, []
        while True:
            row = p[node + 1]
            nxt = next((k for k in kids[node + 1] if u[k] < row[tokens[k]]), None)
            if nxt is None:
                return path, int(np.searchsorted(np.cumsum(row), uf * row.sum()))
            path.append(nxt)
            node = nxt

    p = pvalue(*sample_joint(no_residual))
    assert p < ALPHA, f"the negative control passed (p = {p:.2e}); the test has no power"
