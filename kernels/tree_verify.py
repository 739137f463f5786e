"""Verification of a draft tree (pure NumPy): greedy and multi-candidate rejection sampling.

Inputs share one layout: `tokens` (N,) and `parents` (N,) describe the tree (see
kernels/tree_mask.py), and the target's distributions come as (N + 1, V) rows: row 0 at
the root (the last committed token), row 1 + i at node i. Each function returns
(path, c): the accepted node indices from the root down, and the token committed after
them (the correction or the bonus). A step commits tokens[path] + [c].

`verify_tree_sampling_ref` is the plain reference (it builds each residual as a vector);
`verify_tree_sampling` is the fast twin (it tracks only the removed mass and builds one
residual at the end); tests/test_tree_kernels.py checks they agree on identical uniforms.
"""

from __future__ import annotations

import numpy as np

from kernels.sampling import sample
from kernels.tree_mask import children_lists


def verify_tree_greedy(
    target_logits: np.ndarray, tokens: np.ndarray, parents: np.ndarray
) -> tuple[list[int], int]:
    """Greedy rule: from the root, move to the child whose token is the target's argmax at
    the current node, while there is one; c = the argmax where the walk stops.

    The committed tokens are the target's own greedy tokens, so the output equals
    target-alone decoding. target_logits (N + 1, V).
    """
    best = np.asarray(target_logits).argmax(-1)
    kids = children_lists(parents)
    path: list[int] = []
    node = -1
    while True:
        nxt = next((k for k in kids[node + 1] if tokens[k] == best[node + 1]), None)
        if nxt is None:
            return path, int(best[node + 1])
        path.append(nxt)
        node = nxt


def verify_tree_sampling_ref(
    p: np.ndarray, tokens: np.ndarray, parents: np.ndarray, u_accept: np.ndarray, u_final: float
) -> tuple[list[int], int]:
    """Recursive multi-candidate rejection sampling over siblings (SpecInfer / EAGLE), for
    trees whose siblings are *deterministic* proposals (the draft's top-K; distinct tokens).

    Rule: at the current node, r = p at that node. Try its children x_1, x_2, ... in index
    order: accept x_j iff u_j * sum(r) < r(x_j), then move to x_j (r = p there) and repeat;
    on rejection set r(x_j) = 0 (the residual norm(max(r - δ_x, 0)) of a point-mass
    proposal) and try the next sibling. When no child is accepted, c ~ r / sum(r) (the
    final residual, or p itself when the node has no children: the bonus token).

    Why it is exact: a deterministic proposal x is a draft law q = δ_x, for which the
    Leviathan acceptance min(1, r(x)/q(x)) is r(x)/sum(r) and the residual is r with x
    removed, so each sibling round leaves the law of the committed token equal to r; the
    proposals must not depend on the target's randomness (they depend only on the draft).
    p (N + 1, V) target probabilities; u_accept (N,) one uniform per node; u_final scalar.
    """
    p = np.asarray(p, dtype=np.float64)
    kids = children_lists(parents)
    path: list[int] = []
    node = -1
    while True:
        r = p[node + 1].copy()
        for k in kids[node + 1]:
            if u_accept[k] * r.sum() < r[tokens[k]]:
                path.append(k)
                node = k
                break
            r[tokens[k]] = 0.0
        else:
            if r.sum() <= 0:  # only by rounding: every token with mass was a rejected child
                r = p[node + 1]
            return path, int(sample(r, u_final))


def verify_tree_sampling(
    p: np.ndarray, tokens: np.ndarray, parents: np.ndarray, u_accept: np.ndarray, u_final: float
) -> tuple[list[int], int]:
    """The rule of `verify_tree_sampling_ref` without a residual vector per rejection: only
    the rejected mass is tracked (sum(r) = sum(p) - removed), and the final residual is
    built once. Same arguments, same result for the same uniforms."""
    p = np.asarray(p, dtype=np.float64)
    kids = children_lists(parents)
    path: list[int] = []
    node = -1
    while True:
        row = p[node + 1]
        total = row.sum()
        removed = 0.0
        rejected = []
        for k in kids[node + 1]:
            x = tokens[k]
            if u_accept[k] * (total - removed) < row[x]:
                path.append(k)
                node = k
                break
            removed += row[x]
            rejected.append(x)
        else:
            if not rejected:
                return path, int(sample(row, u_final))
            r = row.copy()
            r[rejected] = 0.0
            if r.sum() <= 0:
                r = row
            return path, int(sample(r, u_final))
