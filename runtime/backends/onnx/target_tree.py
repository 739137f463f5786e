"""A tree pass on the ONNX target (runtime/backends/onnx/target.py) as chains: a pass whose
mask has holes in its window runs as one causal pass per root-to-leaf path (TREE_AS_CHAINS), so
that at int8 activations every node's logits and keys are those of ar's one-token passes."""

from __future__ import annotations

import numpy as np

from runtime.caches.sliding import SlidingKVCache
from runtime.errors import DuetError


def tree_as_chains(target, x, cache, start, stop, head, pos, m, off, last, taps=()):
    """A pass of `target` (an OnnxTargetLM) whose mask has holes in its window (a draft tree's
    nodes see their ancestors, not their siblings), run as one causal pass per root-to-leaf path
    (TREE_AS_CHAINS).

    In one window a node's keys would sit behind its siblings' masked columns, and the
    int8-activation layers turn the other order of GQA's sums into other logits; along its
    own path a node sees [past][ancestors][itself] as the one-token passes of ar do, so
    its logits and keys are ar's to the bit. Each path is rolled back before the next;
    the cache then holds every node's keys in window order, as one pass would leave it."""
    B, T = x.shape[:2]
    n = target.config.num_layers
    if B != 1 or (start, stop) != (0, n) or not head or not m[:, :, :off].all():
        raise DuetError(
            "ONNX target: a masked window (tree) runs on one row over a whole "
            "past, through every layer"
        )
    win = m[0, :, off:]
    h = 0  # rows every later row sees (the committed tokens before a tree): one pass
    while h < T and win[h:, : h + 1].all() and not win[h, h + 1 :].any():
        h += 1
    if h:
        got0 = target._run(x[:, :h], cache, 0, n, True, pos[:, :h], m[:, :h, : off + h], None, taps)
        got1 = tree_as_chains(
            target, x[:, h:], cache, 0, n, True, pos[:, h:], m[:, h:], off + h, None, taps
        )
        lg, *rest = (np.concatenate(p, axis=1) for p in zip(got0, got1, strict=True))
        return [lg[:, -last:] if last else lg, *rest]
    parent = [int(a[-1]) if len(a := np.flatnonzero(win[t, :t])) else -1 for t in range(T)]
    for t in range(T):  # a forest: each row sees exactly its ancestors and itself
        seen, a = {t}, parent[t]
        while a >= 0:
            seen.add(a)
            a = parent[a]
        if set(np.flatnonzero(win[t]).tolist()) != seen:
            raise DuetError("ONNX target: a mask row must see its ancestors' columns only")
    leaves = [t for t in range(T) if t not in set(parent)]
    rows_of, keys = [None] * T, [None] * T  # per node: its row of each output
    for leaf in leaves:
        path, t = [], leaf
        while t >= 0:
            path.append(t)
            t = parent[t]
        path.reverse()
        cache.trim(cache.offset - off)
        got = target._run(x[:, path], cache, 0, n, True, pos[:, path], None, None, taps)
        L = len(path)
        for j, t in enumerate(path):
            if keys[t] is None:
                rows_of[t] = [a[:, j] for a in got]
                keys[t] = [
                    tuple(a[..., j - L, :].copy() for a in cache.get(i)[:2]) for i in range(n)
                ]
    cache.trim(cache.offset - off)
    for i in range(n):  # every node's keys after the past, in window order
        got = cache.get(i)
        k, v = (
            np.concatenate([got[a], *[keys[t][i][a][:, :, None] for t in range(T)]], axis=2)
            for a in (0, 1)
        )
        if isinstance(cache, SlidingKVCache) and target.sliding[i]:
            cache.put(i, k, v, np.concatenate([np.asarray(got[2]), pos], axis=1))
        else:
            cache.put(i, k, v)
    lg, *rest = (np.stack(p, axis=1) for p in zip(*rows_of, strict=True))
    return [lg[:, -last:] if last else lg, *rest]
