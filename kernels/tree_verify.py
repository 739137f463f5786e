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
    p: np.ndarray,
    tokens: np.ndarray,
    parents: np.ndarray,
    u_accept: np.ndarray,
    u_final: float,
    q: np.ndarray | None = None,
) -> tuple[list[int], int]:
    """Recursive multi-candidate rejection sampling over siblings (SpecInfer / EAGLE).

    Rule: at the current node, r = p at that node and q_1 = the draft law its children were
    drawn from. Try the children x_1, x_2, ... in index order (their draw order): accept x_j
    iff u_j * q_j(x_j) < r(x_j) (probability min(1, r/q_j)), then move to x_j and start
    again there; on rejection r <- norm(max(r - q_j, 0)) and q_{j+1} <- norm(q_j with x_j
    removed). When no child is accepted, c ~ r (the final residual, or p itself when the
    node has no children: the bonus token).

    Siblings must be drawn *without replacement* from q (x_j ~ q_j, in index order), and
    which of them exist may depend on anything but their own values; then every round
    leaves the committed token's law equal to r, so the output law is the target's.
    `q is None` means deterministic proposals (the draft's top-K, chosen without the
    target's randomness): each q_j is the point mass on x_j, so acceptance is r(x_j) and
    the residual is r with x_j removed; any draft-only rule may pick those siblings.
    p, q (N + 1, V): row 0 at the root, row 1 + i at node i; u_accept (N,); u_final scalar.
    """
    p = np.asarray(p, dtype=np.float64)
    kids = children_lists(parents)
    path: list[int] = []
    node = -1
    while True:
        r = p[node + 1] / p[node + 1].sum()
        qj = None if q is None else np.asarray(q[node + 1], np.float64)
        for k in kids[node + 1]:
            x = tokens[k]
            if qj is None:  # point mass on x
                if u_accept[k] < r[x]:
                    path.append(k)
                    node = k
                    break
                r = r.copy()
                r[x] = 0.0
            else:
                qj = qj / qj.sum()
                if u_accept[k] * qj[x] < r[x]:
                    path.append(k)
                    node = k
                    break
                r = np.maximum(r - qj, 0.0)
                qj = qj.copy()
                qj[x] = 0.0
            if r.sum() <= 0:  # only by rounding
                r = p[node + 1]
            r = r / r.sum()
        else:
            return path, int(sample(r, u_final))


def verify_tree_sampling(
    p: np.ndarray,
    tokens: np.ndarray,
    parents: np.ndarray,
    u_accept: np.ndarray,
    u_final: float,
    q: np.ndarray | None = None,
) -> tuple[list[int], int]:
    """The rule of `verify_tree_sampling_ref`, fast for deterministic siblings: with q None
    only the rejected mass is tracked (no residual vector per rejection) and the final
    residual is built once; with q given the residuals stay unnormalized (one division per
    test instead of two renormalizations). Same arguments, same result for the same
    uniforms (up to rounding at the acceptance boundary)."""
    p = np.asarray(p, dtype=np.float64)
    kids = children_lists(parents)
    path: list[int] = []
    node = -1
    while True:
        row = p[node + 1]
        total = row.sum()
        nxt = None
        if q is None:
            removed, rejected = 0.0, []
            for k in kids[node + 1]:
                x = tokens[k]
                if u_accept[k] * (total - removed) < row[x]:
                    nxt = k
                    break
                removed += row[x]
                rejected.append(x)
            if nxt is None:
                r = row.copy()
                r[rejected] = 0.0
        else:
            r, qj = row / total, np.array(q[node + 1], np.float64)
            for k in kids[node + 1]:
                x = tokens[k]
                qs, rs = qj.sum(), r.sum()
                if u_accept[k] * qj[x] * rs < r[x] * qs:
                    nxt = k
                    break
                r = np.maximum(r / rs - qj / qs, 0.0)
                qj[x] = 0.0
        if nxt is None:
            if r.sum() <= 0:
                r = row
            return path, int(sample(r, u_final))
        path.append(nxt)
        node = nxt
