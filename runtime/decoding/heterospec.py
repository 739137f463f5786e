"""`heterospec`: the tree method with HeteroSpec's entropy bins setting depth and width per
step (HeteroSpec §4).

After the base tree (`depth` levels), Φ (eq. 1) of the most confident path P* (the
deepest expanded node whose draft distribution has the highest top-1 probability) is
looked up in the fitted bins (eq. 2's 8 CART leaves, ordered by Φ). In a low-entropy bin
B_i (i < α) the tree grows α - i more levels (dynamic extended drafting, d' = d_base +
α - i) and keeps N' = γ_i·N + (α - i) nodes (top-N pruning); other bins keep the base tree.
When sampling, the tree is never pruned by value (see runtime/decoding/tree_draft.py), so
only the extension applies, within the node budget. Verification is `tree`'s, so the
method is lossless whatever the bins say.

Bins come from `python -m apps.train bins` (a JSON file); the embedded pair ships its own
(runtime/assets/default/bins.json), which is also the default for other pairs, whose Φ
scale may differ: fit bins for a pair you use. A fitted head (--draft head) reads its own from
TARGET/.duet/eagle/bins.json when `apps.train bins --out` wrote them there. Per-bin compiled
graphs (§4.3) are not here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from kernels.entropy import bin_of, meta_path_entropy
from kernels.tree_mask import path_to
from runtime.assets import DEFAULT_DIR
from runtime.decoding.events import StepCall, StepEvent, no_summary
from runtime.decoding.flags import flag
from runtime.decoding.tree import Options as TreeOptions
from runtime.decoding.tree import check_tree_args, tree_call
from runtime.decoding.tree_draft import TreeDrafter
from runtime.errors import DuetError

DEFAULT_BINS = DEFAULT_DIR / "bins.json"
ALPHA = 3  # low-entropy bins B_0..B_{α-1} get extended and pruned
GAMMAS = (0.3, 0.6, 1.0)  # γ_i of the top-N pruning, one per low-entropy bin (§4.3)


def pair_bins(draft) -> Path | None:
    """Bins fitted for this draft and kept beside it (a fitted head's TARGET/.duet/eagle/bins.json,
    `draft.bins_file`), when they exist."""
    p = getattr(draft, "bins_file", None)
    return Path(p) if p is not None and Path(p).is_file() else None


def load_bins(path) -> dict:
    """Read a bins file ({"thresholds": [7 floats], "top_k": K, ...}); one clear error."""
    p = Path(path)
    try:
        bins = json.loads(p.read_text())
        th = [float(x) for x in bins["thresholds"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DuetError(f"--bins {p}: not a bins file from `apps.train bins` ({e})") from None
    if th != sorted(th):
        raise DuetError(f"--bins {p}: thresholds must be sorted")
    return bins


def path_entropy(drafter: TreeDrafter, k: int) -> float:
    """Φ(P*) over the draft distributions along P*: the root, then each expanded node down to
    the deepest expanded node with the highest top-1 probability (HeteroSpec §4.1)."""
    t = drafter.tree
    deepest = [i for i in t.expanded if i >= 0 and t.depths[i] == drafter.depth - 1] or [-1]
    best = max(deepest, key=lambda i: float(t.expanded[i].max()))  # argmax p_{T,top-1}
    rows = [t.expanded[-1]] + [t.expanded[i] for i in path_to(t.parents, best)]
    return meta_path_entropy(np.exp(np.stack(rows)), k)  # eq. (1)


def make_shape(bins: dict, top_k: int):
    """The `tree_steps` shape hook: bin from Φ, then extension and pruning for that bin."""
    thresholds = bins["thresholds"]
    k_phi = int(bins.get("top_k", top_k))

    def shape(drafter: TreeDrafter, n: int, room: int, cap: int) -> tuple[int, dict]:
        phi = path_entropy(drafter, k_phi)
        b = bin_of(phi, thresholds)  # eq. (2)'s leaf
        if b < ALPHA:
            extra = ALPHA - b  # Δ(B_i) = α - i
            levels = min(extra, room - drafter.depth)
            if drafter.sampled:  # nothing is pruned later: stay within N + Δ nodes
                levels = min(
                    levels, (min(n + extra, cap) - len(drafter.tree)) // drafter.level_size()
                )
            drafter.grow(levels)  # d' = d_base + Δ(B_i)
            # N' = γ_i·N + Δ(B_i) (§4.3; greedy only), and at least d' nodes: with our small N
            # (12; the paper's is 60) γ_0·N + Δ = 7 is below d' = 9, too few nodes for the
            # extended levels to survive the reranking
            n = max(int(round(GAMMAS[b] * n)) + extra, drafter.depth)
        return max(1, min(n, cap)), {"bin": b, "phi": round(phi, 4)}

    return shape


NEEDS_DRAFT = True


def tree_flag(name: str):
    """tree's flag `name`, for heterospec's Options: one flag, one default, one help."""
    f = {f.name: f for f in fields(TreeOptions)}[name]
    return flag(f.default, f.metadata["help"], type=f.metadata["type"])


@dataclass
class Options:
    # tree's four flags, the same defaults and help (--tree-k: --top-k is sampling's)
    tree_k: int = tree_flag("tree_k")
    top_n: int = tree_flag("top_n")
    depth: int = tree_flag("depth")  # d_base
    expand: int = tree_flag("expand")
    bins: str | None = flag(
        None,
        "entropy bins from `python -m apps.train bins` (default: a "
        "fitted head's own TARGET/.duet/eagle/bins.json, else the embedded "
        "pair's)",
        type=str,
    )


def check(options: Options) -> None:
    check_tree_args(options.tree_k, options.top_n, options.depth, options.expand)


summarize = no_summary  # `heterospec` adds nothing to the run's stats beyond the shared figures


def steps(c: StepCall) -> Iterator[StepEvent]:
    """The method-table entry point (runtime.decoding.METHOD_MODULES)."""

    def shape():
        bins = load_bins(c.options.bins or pair_bins(c.draft) or DEFAULT_BINS)
        return make_shape(bins, c.options.tree_k)

    return tree_call(c, shape=shape)
