"""`tree`: EAGLE-2 style dynamic draft trees verified in one target pass per step.

One step: the draft grows a tree (runtime/decoding/tree_draft.py: top-K children of the
top-K nodes per level, `depth` levels, one batched draft pass each), reranks and keeps the
top-N nodes; the target scores all of them at once under a tree mask
(runtime/decoding/tree_pass.py); the longest accepted path plus the correction/bonus token
is committed. Lossless: greedy follows the target's argmax; sampling is multi-candidate
rejection sampling (kernels/tree_verify.py). The tree shrinks near `max_new` and the
context limit. A `shape` hook lets HeteroSpec (runtime/decoding/heterospec.py) extend the
depth and change N per step; this module knows no bins.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from runtime.arg_rules import at_least
from runtime.decoding.events import (
    GREEDY,
    Sampling,
    StepCall,
    StepEvent,
    no_summary,
    option_keywords,
    rewind,
)
from runtime.decoding.flags import flag
from runtime.decoding.tree_draft import TreeDrafter
from runtime.decoding.tree_pass import verify_tree
from runtime.drafts.base import draft_tree, is_model_free

# shape(drafter, n, room, cap) -> (n', info): may grow the drafter further (at most `room`
# levels deep, and when sampling at most `cap` nodes, in all) and returns the number of nodes
# to keep (ignored when sampling: no pruning by value; may exceed --top-n, as HeteroSpec's
# N' = γ·N + Δ does, up to `cap`: what the context has room to verify) and facts to report
Shape = Callable[[TreeDrafter, int, int, int], tuple[int, dict]]


def check_tree_args(top_k: int, top_n: int, depth: int, expand: int | None = 1) -> None:
    """One clear line for a tree shape that cannot work."""
    shape = (("--tree-k", top_k), ("--top-n", top_n), ("--depth", depth), ("--expand", expand))
    for name, v in shape:
        at_least(name, v)


def terminal_rank(tree, path: list[int]) -> int | None:
    """HeteroSpec's Terminal Confidence Rank: the 1-based rank, by cumulative draft score,
    of the deepest accepted node among the verified ones (None when nothing was accepted)."""
    if not path:
        return None
    s = tree.scores[path[-1]]
    return 1 + sum(1 for x in tree.scores if x > s)


def sibling_laws(tree, vocab: int) -> np.ndarray:
    """(N + 1, V): row 1 + i the draft law node i's children were drawn from (row 0: the
    root's); zeros for a node without children."""
    q = np.zeros((len(tree) + 1, vocab), np.float32)
    for node, law in tree.q.items():
        q[node + 1] = law
    return q


def tree_steps(
    target,
    draft,
    seq: list[int],
    *,
    max_new: int,
    top_k: int = 2,
    top_n: int = 12,
    depth: int = 6,
    expand: int | None = 1,
    sampling: Sampling = GREEDY,
    rng: np.random.Generator | None = None,
    target_cache=None,
    draft_cache=None,
    shape: Shape | None = None,
) -> Iterator[StepEvent]:
    """Yield one StepEvent per tree step, continuing `seq`. Caches hold only committed tokens
    on exit (the target's via compaction, the draft's by trimming to the committed prefix)."""
    check_tree_args(top_k, top_n, depth, expand)
    rng = rng or np.random.default_rng(0)
    seq = list(seq)
    tc = target_cache if target_cache is not None else target.new_cache()
    dc = draft_cache if draft_cache is not None else draft.new_cache()
    ctx = min(target.config.max_context, draft.config.max_context)
    produced = 0
    try:
        while produced < max_new:
            room = min(max_new - produced - 1, ctx - len(seq) - 1)  # draft tokens committable
            t0 = time.perf_counter()
            info: dict = {}
            tokens, parents, tree = [], [], None
            q = None
            if room > 0 and is_model_free(draft):  # several continuations read from text
                tree = draft_tree(draft, dc, seq, min(top_n, ctx - len(seq)), min(depth, room))
                tokens, parents = tree.tokens, tree.parents
            elif room > 0:
                rewind(dc, len(seq))
                cap = ctx - len(seq)  # nodes the verification window has room for
                budget = min(top_n, cap)
                drafter = TreeDrafter(
                    draft,
                    dc,
                    seq,
                    top_k,
                    sampling,
                    rng,
                    root_children=min(top_k, budget),
                    expand=expand,
                )
                levels = min(depth, room) - 1
                if drafter.sampled:  # no pruning afterwards: stop growing within the budget
                    levels = min(levels, (budget - len(drafter.tree)) // drafter.level_size())
                drafter.grow(levels)
                n = top_n
                if shape is not None:
                    n, info = shape(drafter, n, room, cap)
                tree = drafter.tree
                if not drafter.sampled:
                    tree = tree.prune(min(n, cap))  # EAGLE-2 reranking
                else:  # nothing pruned by value: prune(len) only puts the nodes in preorder
                    tree = tree.prune(len(tree))
                    q = sibling_laws(tree, draft.config.vocab_size)
                tokens, parents = tree.tokens, tree.parents
                info["draft_calls"] = drafter.calls
            t1 = time.perf_counter()
            path, c = verify_tree(target, tc, seq, tokens, parents, sampling, rng, q)
            t2 = time.perf_counter()
            committed = [tokens[i] for i in path] + [c]
            seq += committed
            produced += len(committed)
            per_step = {
                "tree_size": len(tokens),
                "depth": max(tree.depths) if tree is not None and len(tree) else 0,
                "accepted": len(path),
                "tcr": terminal_rank(tree, path) if tree is not None else None,
                **info,
            }
            yield StepEvent(
                tokens=committed,
                accepted=len(path),
                drafted=len(tokens),
                draft_s=t1 - t0,
                verify_s=t2 - t1,
                extra={"per_step": per_step},
            )
    finally:
        rewind(tc, len(seq))
        rewind(dc, len(seq))


NEEDS_DRAFT = True
RUNS_MODEL_FREE = True  # --draft lookup / suffix: trees read from text, q = δ (q None above)


@dataclass
class Options:
    # Defaults measured on the embedded pair on a 2-core CPU (torch target, ONNX draft): a
    # verified token costs ~3 % of a target pass and a draft pass ~4 %, so the greedy chain
    # with one runner-up sibling per level, kept to 12 nodes, beat EAGLE-2's K x K expansion
    # (K 4, N 16, depth 5: tau 4.04 with 5337 verified tokens vs 4.27 with 3832 on 10 prompts).
    # heterospec's Options share these four flags (same defaults, same help).
    tree_k: int = flag(2, "top-K children per expanded node (default 2)")
    top_n: int = flag(12, "nodes kept after reranking, verified per step (default 12)")
    depth: int = flag(6, "tree levels (heterospec: the base depth d_base) (default 6)")
    expand: int = flag(
        1,
        "nodes expanded per level (default 1: the greedy chain and its "
        "siblings; EAGLE-2: --tree-k)",
    )


def check(options: Options) -> None:
    check_tree_args(options.tree_k, options.top_n, options.depth, options.expand)


summarize = no_summary  # `tree` adds nothing to the run's stats beyond the shared figures


def steps(c: StepCall) -> Iterator[StepEvent]:
    """The method-table entry point (runtime.decoding.METHOD_MODULES)."""
    return tree_call(c)


def tree_call(c: StepCall, shape=None) -> Iterator[StepEvent]:
    """tree_steps over a StepCall, its options checked now, not at the first step; `shape`: a
    function giving HeteroSpec's per-bin tree shape, called after the check."""
    o = c.options
    check_tree_args(o.tree_k, o.top_n, o.depth, o.expand)
    extra = {"shape": shape()} if shape is not None else {}
    kw = c.keywords("rng", "target_cache", "draft_cache")
    opts = option_keywords(o, drop=("bins",), tree_k="top_k")  # bins: heterospec's, in `shape`
    return tree_steps(c.target, c.draft, c.seq, **kw, **opts, **extra)
