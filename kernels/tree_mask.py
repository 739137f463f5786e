"""Draft trees as parent arrays: attention masks, positions and paths (NumPy, pure).

A tree of N nodes is `parents` int (N,): parents[i] is the index of node i's parent, or -1
for a child of the root (the last committed token). Parents come before their children
(topological order), so depths and masks are one pass. This module knows nothing about
models or caches.
"""

from __future__ import annotations

import numpy as np


def node_depths(parents: np.ndarray) -> np.ndarray:
    """Depth of each node: 1 for a child of the root. int64 (N,)."""
    par = np.asarray(parents, dtype=np.int64)
    d = np.zeros(len(par), np.int64)
    for i, p in enumerate(par):
        assert p < i, f"node {i}'s parent {p} must come before it"
        d[i] = 1 if p < 0 else d[p] + 1
    return d


def ancestor_matrix(parents: np.ndarray) -> np.ndarray:
    """bool (N, N): [i, j] is True when j is i or one of i's ancestors."""
    par = np.asarray(parents, dtype=np.int64)
    n = len(par)
    anc = np.eye(n, dtype=bool)
    for i, p in enumerate(par):
        if p >= 0:
            anc[i] |= anc[p]
    return anc


def tree_mask(parents: np.ndarray, offset: int, prefix: int) -> np.ndarray:
    """bool (prefix + N, offset + prefix + N): the mask of one verification pass.

    The window is `prefix` ordinary tokens (the tokens of the committed sequence the cache
    has not seen, the root last) then the N tree nodes. Prefix tokens attend causally; a
    node attends to the whole cache and prefix, its ancestors and itself (EAGLE tree mask).
    """
    n = len(parents)
    q = np.arange(prefix)[:, None] + offset
    top = np.arange(offset + prefix + n)[None, :] <= q  # (prefix, S)
    bottom = np.concatenate(
        [np.ones((n, offset + prefix), bool), ancestor_matrix(parents)], axis=1
    )  # (N, S)
    return np.concatenate([top, bottom], axis=0)


def tree_positions(parents: np.ndarray, offset: int, prefix: int) -> np.ndarray:
    """int64 (prefix + N,): prefix tokens contiguous from `offset`; a node at depth k sits
    k places after the root (the root is at offset + prefix - 1)."""
    root = offset + prefix - 1
    return np.concatenate(
        [np.arange(offset, offset + prefix, dtype=np.int64), root + node_depths(parents)]
    )


def path_to(parents: np.ndarray, node: int) -> list[int]:
    """Node indices from the root's child down to `node` (empty for node -1, the root)."""
    out = []
    while node >= 0:
        out.append(int(node))
        node = int(parents[node])
    return out[::-1]


def children_lists(parents: np.ndarray) -> list[list[int]]:
    """children[i + 1] = node i's children in index order; children[0] = the root's."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(np.asarray(parents)):
        kids[int(p) + 1].append(i)
    return kids
