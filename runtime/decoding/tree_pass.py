"""One target pass over a draft tree, and the commit that leaves the cache on the sequence.

The window is the committed tokens the cache has not seen (the root last) followed by the
tree's nodes, with kernels.tree_mask's mask and per-node positions, so the target scores
every node in one forward. After acceptance the cache is compacted: the accepted nodes'
keys and values are moved into place right after the committed prefix and the rest is
dropped (`compact`, no re-feed), so it holds exactly the committed sequence minus the
final correction/bonus token, which is fed next step like any pending token.
"""

from __future__ import annotations

import numpy as np

from kernels.tree_mask import tree_mask, tree_positions
from kernels.tree_verify import verify_tree_greedy, verify_tree_sampling
from runtime.decoding.events import Sampling, pending


def tree_logits(target, cache, seq: list[int], tokens, parents) -> np.ndarray:
    """Target logits (N + 1, V) at the root and at each node; the cache then holds the
    window (committed prefix + all N nodes)."""
    prefix = pending(cache, seq)
    off, n = cache.offset, len(tokens)
    window = np.array([prefix + list(tokens)], dtype=np.int64)
    mask = tree_mask(np.asarray(parents, np.int64), off, len(prefix))
    pos = tree_positions(np.asarray(parents, np.int64), off, len(prefix))[None]
    logits = target.forward(window, cache, positions=pos, mask=mask)[0]
    return logits[len(prefix) - 1 : len(prefix) + n]


def commit(cache, seq_len: int, path: list[int]) -> None:
    """Keep the committed prefix (seq_len tokens) and the accepted nodes' entries after it,
    and so for the hidden rows a target records for a draft that reads them (record_rows)."""
    cols = [seq_len + i for i in path]
    cache.compact(seq_len, cols)
    if getattr(cache, "hidden_ids", None) is not None:  # torch is loaded: it recorded them
        from runtime.backends.torch.causal_lm import compact_rows

        compact_rows(cache, seq_len, cols)


def verify_tree(
    target, cache, seq: list[int], tokens, parents, sampling: Sampling, rng, q=None
) -> tuple[list[int], int]:
    """Verify a tree against the target: returns (accepted node indices, c) and leaves the
    cache holding seq + the accepted nodes' tokens (c is pending). q (N + 1, V): the laws
    siblings were drawn from, or None for deterministic (top-K) siblings."""
    logits = tree_logits(target, cache, seq, tokens, parents)
    toks, par = np.asarray(tokens, np.int64), np.asarray(parents, np.int64)
    if sampling.greedy:
        path, c = verify_tree_greedy(logits, toks, par)
    else:
        u = rng.random(len(toks))
        path, c = verify_tree_sampling(sampling.probs(logits), toks, par, u, rng.random(), q)
    commit(cache, len(seq), path)
    return path, c
