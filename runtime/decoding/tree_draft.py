"""EAGLE-2 dynamic draft trees (HeteroSpec §2.2): expansion level by level, then reranking.

Expansion: the root's top-K tokens are the first level; each further level expands the
`expand` best nodes of the level before (by cumulative draft log-probability, the V_i of
EAGLE-2; EAGLE-2 itself expands K) into their top-K children. Reranking: all nodes sorted by
cumulative log-probability, the top N kept (ancestor-closed, since a child never scores
above its parent). With expand = 1 the tree is the draft's greedy chain with its K - 1
runner-up siblings at every level: on a CPU target, where each verified token costs real
compute, that shape won (see runtime/decoding/tree.py's Options).

One draft pass per level, batched as rows: the draft cache is forked into one row per node
being expanded, each row holding exactly that node's root-to-node path, so every pass is an
ordinary causal (B, 1) step. That is what the ONNX Runtime draft (causal masks only) can
run, and the torch and MLX drafts run the same calls. The caller's draft cache is only
extended by the sequence's pending tokens; the rows live in a fork and are dropped.

Greedy (temperature 0): siblings are the draft's top-K, a deterministic proposal, and the
tree is reranked to the top N. Sampling: siblings are drawn without replacement from the
draft's sampling law q (what makes rejection sampling accept often when q is close to p),
K of them under each of `expand` nodes per level (without `expand`: K/2 under K/2), and
nothing is pruned afterwards by value: kernels/tree_verify.py's rule is exact only if which
siblings exist never depends on their own values (expanding a node by its score is fine: its
children are drawn after). The nodes expanded are the first-drawn children (then by score):
the first child is tried first and accepted with sd's probability, later ones only against
what is left, so with expand = 1 the tree is sd's sampled chain plus its runner-up draws
(expanding the best-scored sibling instead cut T = 1's tau from 2.78 (sd) to 2.33).
This module does not verify and knows no bins.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kernels.sampling import sample
from runtime.decoding.events import GREEDY, Sampling, pending


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
    ranks: list[int] = field(default_factory=list)  # place among its siblings (draw order)
    expanded: dict[int, np.ndarray] = field(default_factory=dict)
    q: dict[int, np.ndarray] = field(default_factory=dict)  # sampling: law children came from

    def __len__(self) -> int:
        return len(self.tokens)

    def add_children(self, node: int, logp: np.ndarray, k: int, q=None, rng=None) -> list[int]:
        """Add k children of `node`: its top-k tokens (most likely first), or with q given, k
        tokens drawn from q without replacement (in draw order). Returns their indices."""
        self.expanded[node] = logp
        base = 0.0 if node < 0 else self.scores[node]
        depth = 1 if node < 0 else self.depths[node] + 1
        if q is None:
            top = top_indices(logp, k)
        else:
            self.q[node] = q
            rest, top = q.astype(np.float64), []
            for _ in range(min(k, int((q > 0).sum()))):
                t = int(sample(rest, rng.random()))
                top.append(t)
                rest = rest.copy()
                rest[t] = 0.0
            with np.errstate(divide="ignore"):
                logp = np.log(q)  # scores: the law the tokens were drawn from
        out = []
        for r, t in enumerate(top):
            out.append(len(self.tokens))
            self.tokens.append(int(t))
            self.parents.append(node)
            self.scores.append(base + float(logp[t]))
            self.depths.append(depth)
            self.ranks.append(r)
        return out

    def prune(self, n: int) -> DraftTree:
        """The top-n nodes by cumulative score (ties: shallower first), EAGLE-2's reranking,
        renumbered in depth-first preorder with siblings in draw order: still topological,
        and the first-child chain comes first, so committing an accepted path along it leaves
        the target cache a prefix to keep (no gather)."""
        order = sorted(range(len(self)), key=lambda i: (-self.scores[i], self.depths[i], i))
        kept = set(order[: max(0, n)])
        kids: dict[int, list[int]] = {}
        for i in sorted(kept):  # index order = draw order among siblings
            kids.setdefault(self.parents[i], []).append(i)
        keep, stack = [], list(reversed(kids.get(-1, [])))
        while stack:
            i = stack.pop()
            keep.append(i)
            stack += reversed(kids.get(i, []))
        assert len(keep) == len(kept), "pruning must keep ancestors"
        new_index = {old: new for new, old in enumerate(keep)}
        new_index[-1] = -1
        t = DraftTree()
        for old in keep:
            assert self.parents[old] in new_index, "pruning must keep ancestors"
            t.tokens.append(self.tokens[old])
            t.parents.append(new_index[self.parents[old]])
            t.scores.append(self.scores[old])
            t.depths.append(self.depths[old])
            t.ranks.append(self.ranks[old])
        t.expanded = {new_index[o]: lp for o, lp in self.expanded.items() if o in new_index}
        t.q = {new_index[o]: q for o, q in self.q.items() if o in new_index}
        return t


class TreeDrafter:
    """Builds one DraftTree level by level over a draft model; `grow` may be called again
    to extend the tree deeper (HeteroSpec's dynamic extended drafting)."""

    def __init__(
        self,
        draft,
        cache,
        seq: list[int],
        top_k: int,
        sampling: Sampling = GREEDY,
        rng=None,
        root_children: int | None = None,
        expand: int | None = None,
    ):
        """Draft the root's children at once; `grow` adds levels. `expand`: nodes expanded per
        level (their `top_k` children each); None: top_k (sampling: top_k // 2 of each)."""
        self.draft, self.top_k = draft, top_k
        self.sampling, self.rng = sampling, rng
        self.sampled = not sampling.greedy  # children drawn from q, no pruning by value
        # per level: `expand` nodes expanded, `top_k` children each; without `expand`, K x K
        # (sampling: K/2 x K/2, as nothing is pruned)
        self.expand = self.children = max(1, top_k // 2) if self.sampled else top_k
        if expand is not None:
            self.expand, self.children = max(1, expand), top_k
        self.tree = DraftTree()
        self.calls = 0
        logits = draft.forward(np.array([pending(cache, seq)]), cache)[0, -1]  # root
        self.calls += 1
        k = top_k if root_children is None else root_children
        self.frontier = self._add(-1, logits, k)
        self._rows = None  # forked draft cache, row r = path of self._row_nodes[r]
        self._row_nodes: list[int] = [-1]
        self._base = cache
        self.depth = 1

    def level_size(self) -> int:
        """Nodes one more level adds at most."""
        return self.expand * self.children

    def _add(self, node: int, logits: np.ndarray, k: int) -> list[int]:
        q = self.sampling.probs(logits) if self.sampled else None
        return self.tree.add_children(node, log_softmax(logits), k, q, self.rng)

    def grow(self, levels: int) -> None:
        """Expand `levels` more levels: the `expand` best frontier nodes get their children."""
        for _ in range(levels):
            if not self.frontier:
                return
            t = self.tree
            # sampling: first-drawn children first (tried first, accepted most often)
            rank = t.ranks if self.sampled else [0] * len(t)
            chosen = sorted(self.frontier, key=lambda i: (rank[i], -t.scores[i]))  # noqa: B023
            chosen = chosen[: self.expand]
            parent_rows = [self._row_nodes.index(t.parents[i]) for i in chosen]
            if self._rows is None:
                self._rows = self._base.fork(parent_rows)
            else:
                self._rows.select(parent_rows)
            toks = np.array([[t.tokens[i]] for i in chosen])
            logits = self.draft.forward(toks, self._rows)[:, -1]  # (B, V), one pass per level
            self.calls += 1
            self._row_nodes = chosen
            self.frontier = [
                c for r, i in enumerate(chosen) for c in self._add(i, logits[r], self.children)
            ]
            self.depth += 1
