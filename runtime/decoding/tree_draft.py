"""EAGLE-2 dynamic draft trees (HeteroSpec §2.2): expansion level by level, then reranking.

Expansion: the root's top-K tokens are the first level; each further level expands the
top-K nodes of the level before (by cumulative draft log-probability, the V_i of EAGLE-2)
into their top-K children. Reranking: all nodes sorted by cumulative log-probability, the
top N kept (ancestor-closed, since a child never scores above its parent).

One draft pass per level, batched as rows: the draft cache is forked into one row per node
being expanded, each row holding exactly that node's root-to-node path, so every pass is an
ordinary causal (B, 1) step. That is what the ONNX Runtime draft (causal masks only) can
run, and the torch and MLX drafts run the same calls. The caller's draft cache is only
extended by the sequence's pending tokens; the rows live in a fork and are dropped.

Siblings are the draft's top-K, a deterministic proposal (see kernels/tree_verify.py for
why that keeps sampling exact). This module does not verify and knows no bins.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from runtime.decoding.events import pending


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float32)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def top_indices(logp: np.ndarray, k: int) -> np.ndarray:
    """The k largest entries of each row, largest first (ties: lower index): int (..., k)."""
    k = min(k, logp.shape[-1])
    part = np.argpartition(-logp, k - 1, axis=-1)[..., :k]  # O(V), not a full sort
    part = np.sort(part, axis=-1)  # index order, so the stable sort below breaks ties by index
    vals = np.take_along_axis(logp, part, -1)
    return np.take_along_axis(part, np.argsort(-vals, axis=-1, kind="stable"), -1)


@dataclass
class DraftTree:
    """A growing tree: node i has token tokens[i], parent parents[i] (-1 = root), cumulative
    draft log-probability scores[i] and depth depths[i]. `expanded` maps a node (-1 = the
    root) to the draft's log-probabilities at it (V,), for the nodes that were expanded."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    expanded: dict[int, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tokens)

    def add_children(self, node: int, logp: np.ndarray, k: int) -> list[int]:
        """Add node's top-k tokens as children (most likely first); returns their indices."""
        self.expanded[node] = logp
        base = 0.0 if node < 0 else self.scores[node]
        depth = 1 if node < 0 else self.depths[node] + 1
        top = top_indices(logp, k)
        out = []
        for t in top:
            out.append(len(self.tokens))
            self.tokens.append(int(t))
            self.parents.append(node)
            self.scores.append(base + float(logp[t]))
            self.depths.append(depth)
        return out

    def prune(self, n: int) -> DraftTree:
        """The top-n nodes by cumulative score (ties: shallower first), renumbered in their
        original (topological) order; EAGLE-2's reranking."""
        order = sorted(range(len(self)), key=lambda i: (-self.scores[i], self.depths[i], i))
        keep = sorted(order[: max(0, n)])
        new_index = {old: new for new, old in enumerate(keep)}
        new_index[-1] = -1
        t = DraftTree()
        for old in keep:
            assert self.parents[old] in new_index, "pruning must keep ancestors"
            t.tokens.append(self.tokens[old])
            t.parents.append(new_index[self.parents[old]])
            t.scores.append(self.scores[old])
            t.depths.append(self.depths[old])
        t.expanded = {new_index[o]: lp for o, lp in self.expanded.items() if o in new_index}
        return t


class TreeDrafter:
    """Builds one DraftTree level by level over a draft model; `grow` may be called again
    to extend the tree deeper (HeteroSpec's dynamic extended drafting)."""

    def __init__(self, draft, cache, seq: list[int], top_k: int):
        self.draft, self.top_k = draft, top_k
        self.tree = DraftTree()
        self.calls = 0
        logits = draft.forward(np.array([pending(cache, seq)]), cache)[0, -1]  # root
        self.calls += 1
        self.frontier = self.tree.add_children(-1, log_softmax(logits), top_k)
        self._rows = None  # forked draft cache, row r = path of self._row_nodes[r]
        self._row_nodes: list[int] = [-1]
        self._base = cache
        self.depth = 1

    def grow(self, levels: int) -> None:
        """Expand `levels` more levels: the top-K frontier nodes each get top-K children."""
        for _ in range(levels):
            if not self.frontier:
                return
            t = self.tree
            chosen = sorted(self.frontier, key=lambda i: -t.scores[i])[: self.top_k]
            parent_rows = [self._row_nodes.index(t.parents[i]) for i in chosen]
            if self._rows is None:
                self._rows = self._base.fork(parent_rows)
            else:
                self._rows.select(parent_rows)
            toks = np.array([[t.tokens[i]] for i in chosen])
            logits = self.draft.forward(toks, self._rows)[:, -1]  # (B, V), one pass per level
            self.calls += 1
            self._row_nodes = chosen
            lp = log_softmax(logits)
            self.frontier = [
                c for r, i in enumerate(chosen) for c in t.add_children(i, lp[r], self.top_k)
            ]
            self.depth += 1
